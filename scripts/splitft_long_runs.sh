#!/usr/bin/env bash
# Paper 002's utility with a longer schedule (issue 12): 4 clients, 4 rounds x 6 local steps of batch 4 x 32
# tokens (24 steps per client, 6x the first reduced run), 128 training blocks, 32 held-out blocks, on
# WikiText-2 and on Dolly responses: on WikiText-2 no defence, centralised, PrivPair at λ = 0.1 and 1,
# Gaussian smashed-data DP at ε = 100 and 1000 and NoPeek; on Dolly no defence, centralised and PrivPair at
# λ = 1; one PrivPair run with BiSR's SIP stage (the learned inverter as BiSR(f)'s start, tagged sip). Runs
# are tagged long_train. Two runs side by side; each run's time is in its results.json (`timings`).
#
#   bash scripts/splitft_long_runs.sh [OUT] [REPORT]   # defaults: outputs/splitft_long, no committed report
#   bash scripts/splitft_long_runs.sh outputs/splitft_long docs/results/splitft_long   # the committed one
#
# Needs local copies of WikiText-2's test file and Dolly (DATA, default ../shared/data). Reruns skip finished
# runs, and a failed run does not stop the rest.
set -euo pipefail
set -f   # the overrides carry [...] lists: no globbing
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=${1:-outputs/splitft_long}
report=${2:-}
data=${DATA:-../shared/data}
wiki=()
if [[ -n ${DATA:-} ]]; then wiki=("splitft.data.path=$DATA/wikitext2/wiki.test.raw"); fi
for f in "$data/wikitext2/wiki.test.raw" "$data/dolly/dolly_valid_500.jsonl"; do
    [[ -e $f ]] || { echo "splitft_long_runs.sh: $f not found (set DATA=/path/to/the/data folder)" >&2; exit 2; }
done
dolly="splitft.data.source=jsonl splitft.data.path=$data/dolly/dolly_valid_500.jsonl"
sip="splitft.attack.inverter.enabled=true splitft.attack.bisr.init=sip tags=[long_train,sip]"

first=(
    "configuration=smashed_dp_gaussian epsilon=100"
    "configuration=privpair epsilon=0.1"
    "configuration=smashed_dp_gaussian epsilon=1000"
    "configuration=nopeek epsilon=1"
)
second=(
    "configuration=splitft_none"
    "configuration=splitft_central"
    "configuration=privpair epsilon=1"
    "$dolly configuration=splitft_none"
    "$dolly configuration=splitft_central"
    "$dolly configuration=privpair epsilon=1"
    "configuration=privpair epsilon=1 $sip"
)

stream() {   # one list of runs in order
    local -n list=$1
    local common=(experiment=splitft splitft.rounds=4 splitft.local_steps=6 splitft.data.seq_len=32
                  splitft.data.n_train=128 splitft.data.n_heldout=32 splitft.data.n_align=8
                  splitft.privpair.align_every=2 splitft.attack.eia.max_examples=4 splitft.ray_cpus=1
                  splitft.privpair.warmup_align_steps=4 splitft.privpair.align_steps=1 "tags=[long_train]"
                  "paths.output_dir=$out")
    for point in "${list[@]}"; do
        echo "==> splitbench ${common[*]} $point"
        splitbench "${common[@]}" "${wiki[@]}" $point || echo "splitft_long_runs.sh: failed: $point" >&2
    done
}
stream first &
stream second &
wait
if [[ -n $report ]]; then splitbench-report "$out" --out "$report" --include-tagged long_train --include-tagged sip; fi

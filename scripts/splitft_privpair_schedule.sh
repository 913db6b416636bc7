#!/usr/bin/env bash
# PrivPair's burst schedule against its default (issue 33 item 4): the same reduced experiment=splitft run
# (SmolLM2-135M, k = 2, m = 28, 4 clients, 3 rounds × 4 local steps, so 12 steps per client, batch 4 × 32
# tokens, 32 training and 16 held-out blocks, D_align 8 blocks) of PrivPair at λ = 1 under each schedule
# P:S (splitft.privpair.align_every P, align_steps S), same seeds and data. Each step counter runs over the
# rounds, so P = 4 bursts before steps 0 (warm-up), 4 and 8; P = 8 before steps 0 and 8.
# Read by scripts/splitft_privpair_schedule.py; the results and their reading:
# docs/results/splitft_privpair_schedule/README.md.
#
#   bash scripts/splitft_privpair_schedule.sh OUT [SEEDS] [SCHEDULES]   # defaults: "0 1", "4:2 8:1"
#
# Needs a local copy of WikiText-2's test file (DATA, default ../shared/data). Runs one after another;
# reruns skip finished runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=${1:?usage: splitft_privpair_schedule.sh OUT [SEEDS] [SCHEDULES]}; seeds=${2:-"0 1"}; schedules=${3:-"4:2 8:1"}
data=${DATA:-../shared/data}
wiki=()   # experiment=splitft reads ../shared/data/wikitext2/wiki.test.raw; DATA names another folder
if [[ -n ${DATA:-} ]]; then wiki=("splitft.data.path=$DATA/wikitext2/wiki.test.raw"); fi
[[ -e $data/wikitext2/wiki.test.raw ]] || {
    echo "splitft_privpair_schedule.sh: $data/wikitext2/wiki.test.raw not found (set DATA=/path/to/the/data folder)" >&2; exit 2; }
# RAY_worker_niceness=0: Ray otherwise adds 15 to its workers' niceness, so the training (in the ClientApp
# actors) would run at a lower priority than the command that started it
export HF_HUB_OFFLINE=1 SPLITBENCH_CACHE=${SPLITBENCH_CACHE:-/tmp/sbcache-ppair} RAY_worker_niceness=${RAY_worker_niceness:-0}
for seed in $seeds; do
  for sched in $schedules; do
    p=${sched%%:*}; s=${sched##*:}
    python -m runners.run experiment=splitft configuration=privpair epsilon=1 seed="$seed" \
      ${wiki[@]+"${wiki[@]}"} \
      splitft.data.seq_len=32 splitft.data.n_train=32 splitft.data.n_heldout=16 splitft.data.n_align=8 \
      splitft.ray_cpus=1 splitft.privpair.align_every="$p" splitft.privpair.align_steps="$s" \
      paths.output_dir="$out/p${p}s${s}_seed${seed}"
  done
done

#!/usr/bin/env bash
# Paper 004's audit on SmolLM2-135M at what fits a 2-core machine (issue 13): the main split 15 -> 27 at
# D = 64 through the paper's seed protocol (explore 42-47, replicate 48-50, test 51-53), the mitigation on
# the test seeds, the depth / width study (4, 6, 8, 12 delegated layers at D = 64; 12 at D = 96, 128) on
# one seed per phase, and the mitigation's clip quantile (0.1, 0.5, 0.9) at the study's base cell. experiment=grad_audit_2core: rows of 8 tokens, 64 frames per seed from the
# least-squares start (docs/grad_audit.md). Two runs side by side, one torch thread each.
#
#   bash scripts/grad_audit_runs.sh [OUT] [REPORT]   # defaults: outputs/grad_audit, no report
#   bash scripts/grad_audit_runs.sh outputs/grad_audit /tmp/all   # one report over every run
#
# The committed reports split them: docs/results/grad_audit/issue31 (the main split and the mitigation) and
# docs/results/grad_audit/depth_width (the study and the clip sweep, OUT/grad_audit_depth_width); each
# folder's commands are in docs/grad_audit.md (and depth_width/README.md).
#
# Needs a local copy of WikiText-2's test file (DATA, default ../shared/data; offline machines cannot reach
# the hub). Reruns skip finished runs, and a failed run does not stop the rest.
#
# The paper does not say which end of the cloud's stack its depth study moves. The study runs both readings:
# the cut moves (cut_after 23, 21, 19, 15 with resume_at 27: the local tail stays 3 layers) and the resume
# point moves (resume_at 19, 21, 23 with cut_after 15: the local tail grows to 11, 9, 7 layers).
set -euo pipefail
set -f   # the overrides carry [...] lists: no globbing
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=${1:-outputs/grad_audit}
report=${2:-}
corpus=()
if [[ -n ${DATA:-} ]]; then corpus=("grad_audit.corpus.path=$DATA/wikitext2/wiki.test.raw"); fi
wikitext=${DATA:-../shared/data}/wikitext2/wiki.test.raw
[[ -e $wikitext ]] || { echo "grad_audit_runs.sh: $wikitext not found (set DATA=/path/to/the/data folder)" >&2; exit 2; }

study="configuration=decoy_trainer grad_audit.seeds.explore=[42] grad_audit.seeds.replicate=[48] \
grad_audit.seeds.test=[51] tags=[depth_width] experiment_name=grad_audit_depth_width"
# the mitigation's clip-quantile sweep at the study's base cell (15 -> 27, D = 64), paired on test seed 51
sweep="configuration=decoy_mitigated grad_audit.seeds.explore=[42] grad_audit.seeds.replicate=[] \
grad_audit.seeds.test=[51] tags=[depth_width] experiment_name=grad_audit_depth_width"
first=(
    "configuration=decoy_trainer"
    "configuration=decoy_mitigated grad_audit.seeds.explore=[42] grad_audit.seeds.replicate=[] grad_audit.seeds.test=[51,52,53]"
    "$study grad_audit.cut_after=19"
    "$study grad_audit.cut_after=23"
    "$study grad_audit.resume_at=23"
    "$sweep grad_audit.mitigation.clip_quantile=0.1"
    "$sweep grad_audit.mitigation.clip_quantile=0.5"
    "$sweep grad_audit.mitigation.clip_quantile=0.9"
)
second=(
    "$study grad_audit.latent_dim=96"
    "$study grad_audit.latent_dim=128"
    "$study grad_audit.cut_after=21"
    "$study grad_audit.cut_after=15"
    "$study grad_audit.resume_at=19"
    "$study grad_audit.resume_at=21"
)

stream() {   # one list of runs in order
    local -n list=$1
    for point in "${list[@]}"; do
        echo "==> splitbench experiment=grad_audit_2core $point"
        splitbench experiment=grad_audit_2core "paths.output_dir=$out" "${corpus[@]}" $point \
            || echo "grad_audit_runs.sh: failed: $point" >&2   # $point: overrides
    done
}
stream first &
stream second &
wait
if [[ -n $report ]]; then splitbench-report "$out" --out "$report" --include-tagged depth_width; fi

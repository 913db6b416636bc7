#!/usr/bin/env bash
# Paper 003's results on the offline pair (issue 14, item 5): SmolLM2-135M-Instruct as edge and cloud, both
# benchmarks (PubMedQA: accuracy; Dolly closed QA / information extraction: ROUGE-L), both fusion modes, the
# undefended point, CoVeil's λ and every baseline on a sparse grid, Table A1's pool sizes and Table A2's edge
# alone (α = 0).
#
#   bash scripts/collab_paper_runs.sh [OUT] [REPORT]   # defaults: outputs/collab_paper, no committed report
#   bash scripts/collab_paper_runs.sh outputs/collab_paper docs/results/collab/n30   # the committed one
#
# Needs local copies of PubMedQA's ori_pqal.json and Dolly (DATA, default ../shared/data; offline machines
# cannot reach the hub). The two benchmarks run side by side, one torch thread each; each list is in priority
# order (the undefended points and the positive controls first), reruns skip finished runs, and a failed run
# does not stop the rest. Cut down to fit a 2-core machine (30 examples, 48 new tokens instead of 256, the
# inversion shown 48 steps and writing 48 tokens; a sparse grid): 3.5-8 CPU-minutes per run, 9 for the
# first of each benchmark (it computes the shared controls; docs/results/collab/README.md). The result and its reading:
# docs/results/collab/README.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=${1:-outputs/collab_paper}
report=${2:-}
data=${DATA:-../shared/data}
pubmedqa=$data/pubmedqa/ori_pqal.json
dolly=$data/dolly/dolly_valid_500.jsonl
for f in "$pubmedqa" "$dolly"; do
    [[ -e $f ]] || { echo "collab_paper_runs.sh: $f not found (set DATA=/path/to/the/data folder)" >&2; exit 2; }
done

points=(
    "configuration=collab_none collab.fusion=cloud"
    "configuration=collab_none collab.fusion=edge"
    "configuration=coveil epsilon=1 collab.fusion=cloud"
    "configuration=coveil epsilon=1.5 collab.fusion=edge"
    "configuration=coveil collab.parameter_zero=true collab.fusion=cloud"
    "configuration=collab_cogenesis epsilon=10 collab.fusion=cloud"
    "configuration=collab_dp_logit epsilon=4 collab.fusion=cloud"
    "configuration=collab_dp_fusion epsilon=2 collab.fusion=cloud"
    "configuration=collab_custext epsilon=8 collab.fusion=edge"
    "configuration=collab_ldp_sampler epsilon=8 collab.fusion=edge"
    "configuration=collab_invisibleink epsilon=64 collab.fusion=edge"
    "configuration=collab_none collab.alpha=0 collab.fusion=cloud"
    "configuration=coveil epsilon=8 collab.fusion=cloud"
    "configuration=coveil epsilon=4 collab.fusion=edge"
    "configuration=collab_dp_fusion epsilon=2 collab.fusion=edge"
    "configuration=coveil epsilon=1 collab.candidates=10 collab.fusion=cloud"
    "configuration=collab_custext epsilon=24 collab.fusion=edge"
    "configuration=collab_ldp_sampler epsilon=1 collab.fusion=edge"
    "configuration=collab_invisibleink epsilon=16 collab.fusion=edge"
    "configuration=collab_cogenesis epsilon=100 collab.fusion=cloud"
    "configuration=collab_dp_logit epsilon=32 collab.fusion=cloud"
    "configuration=collab_dp_fusion epsilon=16 collab.fusion=cloud"
    "configuration=coveil collab.parameter_zero=true collab.fusion=edge"
    "configuration=coveil epsilon=1 collab.candidates=1000 collab.fusion=cloud"
    "configuration=collab_cogenesis epsilon=1 collab.fusion=cloud"
    "configuration=collab_dp_logit epsilon=0.5 collab.fusion=cloud"
)

stream() {   # one benchmark's points in order
    local common=(experiment=collab "collab.benchmark.name=$1" "collab.benchmark.path=$2" collab.benchmark.n_examples=30
                  collab.max_new_tokens=48 collab.inversion.max_new_tokens=48 collab.threads=1 "paths.output_dir=$out")
    for point in "${points[@]}"; do
        echo "==> splitbench ${common[*]} $point"
        splitbench "${common[@]}" $point || echo "collab_paper_runs.sh: failed: $1 $point" >&2   # $point: overrides
    done
}
stream pubmedqa "$pubmedqa" &
stream dolly "$dolly" &
wait
if [[ -n $report ]]; then splitbench-report "$out" --out "$report"; fi

#!/usr/bin/env bash
# The token sanitisers' Figs. 3 and 4 (paper 001) as curves over an η grid (issue 32 item 4): dχ-Stencil's
# accuracy against Pr@5, one curve per σ at L = 9 (Fig. 3, SST-2) and per L = 2…7 at σ = 0.75 (Fig. 4,
# CommonsenseQA), each over the η grid; the report's sanitiser section then draws the curves and reads every
# series' accuracy and strongest-attacker F1 at the Pr@5 values all series reach (runners/report/sanitize.py
# `matched_md`).
#
#   bash scripts/sanitize_fig34_grid.sh [OUT] [REPORT]     # defaults: outputs/sanitize_fig34, no report written
#   SMOKE=1 bash scripts/sanitize_fig34_grid.sh /tmp/fig34 /tmp/fig34_report   # the tiny model, a 2 x 2 grid
#
# ETAS (default 50,100,150,250,400) sets the η grid, N_PROMPTS (8) and TASK_LIMIT (40) the reduced settings
# of docs/sanitize.md. CONTEXTUAL_BEAM (default 0: not run) turns the contextual reconstruction on: it is
# most of a point's cost (9.5-16 minutes of a point's attacks on 8 prompts), and the curves need Pr@5 and
# accuracy; the committed sanitiser reports carry it at the paper's parameter points. The full grid is 10 series x 5 η = 50 runs of several minutes each on a 2-core CPU:
# not run here (the committed sweeps are one η per series). Needs DATA (default ../shared/data) for SST-2 and
# CommonsenseQA. Reruns skip finished runs. WORKERS=2 runs each half as two processes on the same grid, the
# second in reverse order: a run one of them holds (its lock) or has finished is skipped by the other, so the
# two meet in the middle (the committed Fig. 3 ran so, on 2 cores). HALVES (default "3 4") picks the halves,
# SIGMAS (0.5,0.75,1.0,1.25) Fig. 3's series and WINDOWS (2,3,4,5,6,7) Fig. 4's, so that part of a grid can be
# run in the open; docs/results/sanitize_fig4/README.md gives the calls that made the committed 26 points.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=${1:-outputs/sanitize_fig34}
report=${2:-}
data=${DATA:-../shared/data}
run() { echo "==> python -m runners.run $*"; python -m runners.run "$@" || { status=2; return 2; }; }
status=0
reverse() { tr , '\n' <<< "$1" | tac | paste -sd,; }   # 50,100,150 -> 150,100,50
# One half of the grid: its η list, the series' key and values, then the fixed overrides; with WORKERS=2 a
# second process walks the same grid backwards.
grid() {
    local etas=$1 key=$2 values=$3 back=; shift 3
    if [[ ${WORKERS:-1} == 2 ]]; then
        run -m "$@" "epsilon=$(reverse "$etas")" "$key=$(reverse "$values")" & back=$!
    fi
    run -m "$@" "epsilon=$etas" "$key=$values" || true
    if [[ -n $back ]]; then wait "$back" || status=2; fi
}

if [[ ${SMOKE:-0} == 1 ]]; then
    # The code path end to end: tiny model, 3 prompts, the shipped SST-2 sentences, two curves of two η.
    run -m experiment=sanitize_smoke configuration=dx_stencil "epsilon=${ETAS:-20,400}" sanitize.window=4,5 \
        sanitize.attack.decoder_steps=0 sanitize.attack.learned_corpus_tokens=0 "paths.output_dir=$out" || true
else
    etas=${ETAS:-50,100,150,250,400}
    sst2=$data/sst2/dev.tsv csqa=$data/commonsenseqa/dev_rand_split.jsonl
    for f in "$sst2" "$csqa"; do
        [[ -e $f ]] || { echo "sanitize_fig34_grid.sh: $f not found (set DATA=/path/to/the/data folder)" >&2; exit 2; }
    done
    common=(experiment=sanitize configuration=dx_stencil "workload.n_prompts=${N_PROMPTS:-8}"
            "sanitize.task_limit=${TASK_LIMIT:-40}" sanitize.threads=1 sanitize.attack.decoder_steps=0
            "sanitize.attack.contextual_beam=${CONTEXTUAL_BEAM:-0}"
            "paths.output_dir=$out")
    halves=" ${HALVES:-3 4} "
    [[ $halves =~ ^( [34])+\ $ ]] || { echo "sanitize_fig34_grid.sh: HALVES must list 3 and/or 4, not '${HALVES}'" >&2; exit 2; }
    if [[ $halves == *" 3 "* ]]; then
        grid "$etas" sanitize.sigma "${SIGMAS:-0.5,0.75,1.0,1.25}" "${common[@]}" "sanitize.task_paths.sst2=$sst2" \
            sanitize.window=9
    fi
    if [[ $halves == *" 4 "* ]]; then
        grid "$etas" sanitize.window "${WINDOWS:-2,3,4,5,6,7}" "${common[@]}" 'sanitize.tasks=[commonsense_qa]' \
            "sanitize.task_paths.commonsense_qa=$csqa" sanitize.sigma=0.75
    fi
fi
if [[ -n $report ]]; then
    include=(); [[ ${SMOKE:-0} == 1 ]] && include=(--include-tagged smoke)
    python -m runners.report "$out" --out "$report" "${include[@]}" || status=2
fi
exit $status

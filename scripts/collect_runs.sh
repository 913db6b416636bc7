#!/usr/bin/env bash
# Copy what a committed report regenerates from: each finished run's results.json and .done under OUT into
# DEST, at the same relative path (the samples, logs and model outputs stay behind). Unfinished runs (no .done)
# are skipped, so the copy never holds a run the report would not count.
#
#   bash scripts/collect_runs.sh OUT DEST      # e.g. outputs/cross_system docs/results/cross_system/runs
#   python -m runners.report DEST --out ...    # the report, from the copy alone
#   bash scripts/collect_runs.sh --positions OUT DEST   # sequential runs: also samples.jsonl's id and positions
#
# --positions keeps of each samples.jsonl line only `id` and `positions` (what
# runners.report.splitee.sequential_epsilon50 reads): the rest holds the attacked prompts' token ids (the
# truth and the guesses), a tokenized copy of the workload that a committed folder must not ship.
set -euo pipefail
positions=0
if [[ ${1:-} == --positions ]]; then positions=1; shift; fi
if [[ $# -ne 2 ]]; then echo "usage: collect_runs.sh [--positions] OUT DEST" >&2; exit 2; fi
out=${1%/} dest=$2
[[ -d $out ]] || { echo "collect_runs.sh: $out is not a directory" >&2; exit 2; }
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
n=0
while IFS= read -r -d '' done; do
    d=$(dirname "$done")
    [[ -e $d/results.json ]] || continue
    rel=${d#"$out"/}
    mkdir -p "$dest/$rel"
    cp "$d/results.json" "$d/.done" "$dest/$rel/"
    if ((positions)) && [[ -e $d/samples.jsonl ]]; then
        python3 -c 'import json, sys
for line in sys.stdin:
    if line.strip():
        row = json.loads(line)
        print(json.dumps({"id": row["id"], "positions": row["positions"]}))' \
            < "$d/samples.jsonl" > "$dest/$rel/samples.jsonl"
    fi
    n=$((n + 1))
done < <(find "$out" -name .done -print0)
echo "collect_runs.sh: $n finished run(s) copied into $dest"

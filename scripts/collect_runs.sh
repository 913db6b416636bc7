#!/usr/bin/env bash
# Copy what a committed report regenerates from: each finished run's results.json and .done under OUT into
# DEST, at the same relative path (the samples, logs and model outputs stay behind). Unfinished runs (no .done)
# are skipped, so the copy never holds a run the report would not count.
#
#   bash scripts/collect_runs.sh OUT DEST      # e.g. outputs/cross_system docs/results/cross_system/runs
#   python -m runners.report DEST --out ...    # the report, from the copy alone
set -euo pipefail
if [[ $# -ne 2 ]]; then echo "usage: collect_runs.sh OUT DEST" >&2; exit 2; fi
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
    n=$((n + 1))
done < <(find "$out" -name .done -print0)
echo "collect_runs.sh: $n finished run(s) copied into $dest"

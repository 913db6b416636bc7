"""Write a model's per-op global-sensitivity table (paper §5.3) as Markdown.

    python -m runners.splitee.sensitivity --model smollm2-135m --out docs/sensitivity_smollm2-135m.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.errors import UserError


def render(model_name: str, source: str, rows: list) -> str:
    lines = [
        f"# Global sensitivity per offloaded op: {model_name}",
        "",
        f"Made by `python -m runners.splitee.sensitivity --model {model_name}` from `{source}`.",
        "",
        "Δ after an RMSNorm is 2·√d·‖α‖₄ (paper §5.3.2, α the effective gain, d the normalised dimension); "
        "Δ for O is 2·√d·‖W_V‖₂·‖α‖₄ (§5.3.3, the paper's rule, used by default). The per-head column is "
        "2·√d·‖α‖₄·√(n_rep·Σ_g‖W_V^g‖₂²), which also covers heads attending to different positions "
        "(`engine.sensitivity_rule=per_head`). Δ sup is the exact supremum after an RMSNorm, 2·√d·‖α‖∞, reached by "
        "x = e_i, y = −e_i: the paper's rule is valid but adds this much more noise than necessary. "
        "EP1 masks each op's input with σ = Δ/ε.",
        "",
        "| op | layer | input dim | d | ‖α‖₄ | ‖W_V‖₂ | Δ (paper) | Δ (per head) | Δ sup | σ at ε=1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        def f(v):
            return "—" if v is None else f"{v:.4g}"
        lines.append(f"| {r.op} | {'—' if r.layer is None else r.layer} | {r.input_dim} | {r.norm_dim} | {f(r.gain_l4)} | "
                     f"{f(r.wv_spectral)} | {f(r.delta_paper)} | {f(r.delta_per_head)} | {f(r.delta_sup)} | {f(r.delta)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        from harness.models import load_model, model_entry
        from harness.splitee.sensitivity import sensitivity_table

        loaded = load_model(model_entry(args.model))
        text = render(args.model, loaded.source, sensitivity_table(loaded.model, ("qkv", "o", "gate_up", "lm_head")))
    except UserError as err:
        print(f"splitbench: error: {err}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

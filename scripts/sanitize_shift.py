"""Where do a window sanitiser's substitutions land? (the sanitisers' Fig. 4, docs/results/sanitize_fig4)

Pr@5 and the per-position attackers score position i of the sanitised text against token i of the original.
An even Stencil window is centred half-way between a token and its right neighbour, so its quasi-embedding
can sit nearest the *neighbour*: the substitute is then a token of the prompt, one position over, that a
position-wise metric counts as hidden and a bag-of-tokens one (token F1) counts as read. For every finished
sanitiser run under OUT this prints, per prompt position of the attacked prompts (samples.jsonl: the original
text ids and the sanitised output over `text_span`), the share left unchanged, the share equal to the
original's token one position to the left or right instead (not counted as unchanged), and their sum, each
as the mean over prompts with a 95% interval over prompts (`metrics.proportions.proportion_ci`).

    python scripts/sanitize_shift.py /work/runs/fig34/out --out docs/results/sanitize_fig4/shift.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from metrics.proportions import proportion_ci  # noqa: E402
from runners.report.format import md_table  # noqa: E402
from runners.report.runs import Run, finished_runs, scan  # noqa: E402


def shares(original: list[int], sanitised: list[int]) -> tuple[float, float]:
    """(unchanged, adjacent) as fractions of the positions: the substitute is the original token, or else the
    original's token at i − 1 or i + 1."""
    same = adjacent = 0
    for i, (a, b) in enumerate(zip(original, sanitised, strict=True)):
        if a == b:
            same += 1
        elif b in original[max(i - 1, 0):i] + original[i + 1:i + 2]:
            adjacent += 1
    return same / len(original), adjacent / len(original)


def run_row(run: Run) -> tuple[tuple, list[str]] | None:
    """One table row for a finished sanitiser run (the report's `finished_runs`), keyed for sorting; None when
    it kept no samples or names no mechanism."""
    samples = run.path / "samples.jsonl"
    mech = run.data.get("mechanism")
    if not samples.exists() or not isinstance(mech, dict):
        return None
    per_prompt = []
    for line in samples.read_text().splitlines():
        s = json.loads(line)
        a, b = s["text_span"]
        per_prompt.append(shares(s["original_text_ids"], s["output_ids"][a:b]))
    if not per_prompt:
        return None
    unchanged = proportion_ci([u for u, _ in per_prompt], scale=1.0)
    adjacent = proportion_ci([x for _, x in per_prompt], scale=1.0)
    either = proportion_ci([u + x for u, x in per_prompt], scale=1.0)
    window = mech.get("window")
    cells = [mech.get("mechanism"), f"{mech.get('parameter'):g}", window,
             "—" if window is None else ("even" if window % 2 == 0 else "odd"), f"{mech.get('sigma'):g}",
             len(per_prompt)] + [f"{100 * e.mean:.1f} [{100 * e.lo:.1f}, {100 * e.hi:.1f}]"
                                 for e in (unchanged, adjacent, either)]
    return (str(mech.get("mechanism")), window or 0, float(mech.get("parameter") or 0)), cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="an output root holding sanitiser runs")
    parser.add_argument("--out", dest="dest", type=Path, default=None, help="write the table here (markdown)")
    args = parser.parse_args()
    if not args.out.is_dir():
        print(f"sanitize_shift.py: {args.out} is not a directory", file=sys.stderr)
        sys.exit(2)
    rows = sorted(filter(None, map(run_row, finished_runs(scan(args.out), "sanitize"))))
    if not rows:
        print(f"sanitize_shift.py: no finished sanitiser run with samples under {args.out}", file=sys.stderr)
        sys.exit(2)
    table = md_table(["mechanism", "η", "L", "parity", "σ", "prompts", "unchanged %", "a neighbour's token %",
                      "either %"], [cells for _, cells in rows], align="lrrlrrrrr")
    text = (f"Where the substitutes land, per position of the attacked prompts (mean over prompts [95% interval "
            f"over prompts]); `python scripts/sanitize_shift.py {args.out}`.\n\n{table}\n")
    print(text)
    if args.dest:
        tmp = args.dest.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.dest)


if __name__ == "__main__":
    main()

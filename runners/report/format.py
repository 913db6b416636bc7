"""Shared formatting of the report: numbers, intervals, markdown tables, file names and row labels.

Row labels ask the configuration registry (harness/configurations.py) how a configuration takes its
privacy parameter, so no section spells "ep1"/"epn" rules out again. results.json files outlive the
registry: a configuration name it no longer knows is shown under its bare name, never an error.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from harness import configurations
from harness.configurations import Configuration
from metrics import names


def num(value: Any) -> float | None:
    """A finite float, or None for anything else (missing, null, NaN, a bool, text)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def ci(values: Mapping[str, Any], key: str) -> tuple[float | None, float | None, float | None]:
    """(mean, lo, hi) of a metric stored as `key`, `key_ci_lo`, `key_ci_hi` (harness/stats), the interval's
    ends clipped to the metric's range (metrics/names.py: a t interval near 100 % reaches past it)."""
    return (num(values.get(key)), *names.clip(key, num(values.get(f"{key}_ci_lo")), num(values.get(f"{key}_ci_hi"))))


def fmt_ci(mean: Any, lo: Any = None, hi: Any = None, digits: int = 2) -> str:
    """"mean [lo, hi]"; "mean" without an interval; "—" without a value."""
    m = num(mean)
    if m is None:
        return "—"
    lo_, hi_ = num(lo), num(hi)
    if lo_ is None or hi_ is None:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo_:.{digits}f}, {hi_:.{digits}f}]"


def fmt_auto(mean: Any, lo: Any = None, hi: Any = None) -> str:
    """Like fmt_ci, but 3 significant digits for tiny or huge values (e.g. floating-point errors ~1e-6)."""
    def one(v: float) -> str:
        return f"{v:.3g}" if v != 0 and not 0.01 <= abs(v) < 1e5 else f"{v:.2f}"

    m, lo_, hi_ = num(mean), num(lo), num(hi)
    if m is None:
        return "—"
    return one(m) if lo_ is None or hi_ is None else f"{one(m)} [{one(lo_)}, {one(hi_)}]"


def fmt_seconds(value: Any) -> str:
    v = num(value)
    if v is None:
        return "—"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}"


def fmt_ratio(value: Any) -> str:
    v = num(value)
    return "—" if v is None else f"{v:.2f}×"


def fmt_eps(value: Any) -> str:
    v = num(value)
    return "—" if v is None else f"{v:g}"


def fmt_pct(value: Any) -> str:
    """A rate in [0, 1] as a percentage."""
    v = num(value)
    return "—" if v is None else f"{100 * v:.2f}"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub markdown table; `align` is one letter per column (l/r/c), default left then right."""
    align = align or ("l" + "r" * (len(headers) - 1))
    marks = {"l": ":--", "r": "--:", "c": ":-:"}

    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "|" + "|".join(marks[a] for a in align) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def file_slug(raw: str, limit: int = 48) -> str:
    """A filesystem-safe name for a plot: run directories can be long (every override is in them), so a
    long name is cut and made unique again with a short hash of the whole."""
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in raw)
    if len(safe) <= limit:
        return safe
    return f"{safe[:limit - 9]}-{hashlib.sha1(raw.encode()).hexdigest()[:8]}"


def tagged(title: str, tags: Sequence[str]) -> str:
    """A table title with the tags its runs carry: tagged runs always sit in tables of their own."""
    return title + (f" · tagged {', '.join(tags)}" if tags else "")


def known(name: Any) -> Configuration | None:
    """The registry entry of a configuration named in a results.json; None for a name the registry does
    not (or no longer) hold, so an old result still renders under its bare name."""
    return configurations.REGISTRY.get(str(name))


def uses_epsilon(name: Any) -> bool:
    """Whether the `epsilon` knob sets this configuration's noise (its ε is worth a label and an axis)."""
    conf = known(name)
    return conf is not None and conf.uses_epsilon


def gaussian(name: Any) -> bool:
    """Whether this configuration masks with Gaussian noise calibrated to an ε."""
    conf = known(name)
    return conf is not None and conf.gaussian


def configuration_label(name: str, epsilon: float | None, epsilon_mean: float | None, *,
                        compact: bool = False) -> str:
    """A configuration's row label: its ε where the knob sets it ("ep1 (ε=1)"), the mean of its per-prompt
    ε where that follows the prompt length ("epn (mean ε=0.076)", paper §7.3.1), else its name.
    `compact` is the attack tables' shorter form ("ep1 ε=1", three digits of the mean)."""
    conf = known(name)
    if conf is not None and conf.uses_epsilon and epsilon is not None:
        parameter = configurations.parameter_label(name, epsilon)      # by its own name: ε=1, η=150, λ=4
        return f"{name} {parameter}" if compact else f"{name} ({parameter})"
    if conf is not None and conf.epsilon_rule == configurations.INVERSE_SQRT_N and epsilon_mean is not None:
        return f"{name} (mean ε={epsilon_mean:.3g})" if compact else f"{name} (mean ε={epsilon_mean:.4g})"
    return name


def rank(order: Sequence[str], name: str) -> int:
    """Where `name` sits in a display order; names the order does not hold come last."""
    return order.index(name) if name in order else len(order)


def run_order(order: Sequence[str], data: Mapping[str, Any]) -> tuple:
    """A run's sort key in a table: its configuration's place in `order`, then the name, then ε."""
    name = str(data.get("configuration"))
    return rank(order, name), name, num(data.get("epsilon")) or 0.0


# An absolute path in a command line: a "/" that starts a token or follows "=" or a quote (not one inside a
# relative path such as ../shared/data).
_ABSOLUTE = re.compile(r"(?<![\w./-])/[^\s'\"`]*")


def relative_paths(text: str, base: str | os.PathLike | None) -> str:
    """`text` with every absolute path written relative to `base` (report --relative-to: a committed report
    names the paths of the machine that made it, as seen from the repository root its commands ran from);
    unchanged when `base` is None."""
    if base is None:
        return text
    root = os.path.abspath(base)
    return _ABSOLUTE.sub(lambda m: os.path.relpath(m.group(0), root), text)

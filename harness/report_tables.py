"""Run directories → rows → markdown tables, for `splitbench-report` (runners/report.py).

Pure functions over the files the runners write (harness/results.py; runners/fidelity.py,
runners/timing.py): nothing here loads a model, imports torch or draws a plot, so tests reach every
table without the CLI.

- `scan(root)` finds every results.json under a directory and classifies the run: finished ("ok":
  status ok *and* `.done`), "failed", "unfinished" (results.json without `.done`, or a `.lock` without
  results.json: interrupted or still running) or "unreadable".
- `select(runs, include_tags)` drops runs carrying a tag that is not included (by default every run
  tagged `smoke`): a smoke run on a random tiny model must never sit in a table beside real results.
  The tag set is also part of every table's group key, so even included tagged runs never share a
  table with untagged ones.
- `fidelity_groups` builds the paper's Table 2 (§7.3.1): one table per (experiment, model, workload,
  max_new_tokens, baseline, similarity model, tags), rows ep1 by ascending ε, then epn, slalom, others.
- `timing_tables` builds Table 1 / Fig. 4 (§7.1-7.2): configuration × output limit → seconds per
  prompt, broken into the paper's components, with ratios to TDX and T3 at the same limit.
- `fp_error_groups` builds Table 4 (§7.3.2): per ε, mean true error against the mean bound, their ratio
  and the violation rate, then per op type, per precision × kernel, and Down (§6.3).
- `controlled_tables` builds Table 5 (§7.3.2): per error level, the mean absolute error and the fidelity
  metrics against T3.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = "results.json"
DONE = ".done"
LOCK = ".lock"

DEFAULT_EXCLUDED_TAGS = frozenset({"smoke"})

# Paper order (Table 1 / Fig. 4 legend). Table 2 puts ep1, epn, slalom first (FIDELITY_ORDER).
CONFIG_ORDER = ("cpu", "gpu", "tdx", "t3", "ep1", "epn", "slalom")
FIDELITY_ORDER = ("ep1", "epn", "slalom", "t3", "tdx", "cpu", "gpu")

# (metrics key, column header) of Table 2, in the paper's order.
UTILITY_METRICS: tuple[tuple[str, str], ...] = (
    ("exact_match", "exact match %"),
    ("token_match_rate", "token match %"),
    ("bleu", "BLEU"),
    ("rouge_l", "ROUGE-L"),
    ("semantic_similarity", "semantic sim. %"),
)

# (component key, header) of Fig. 4. "other" is *derived* (total minus the five before it), so a row
# sums to its total and, as in the paper, "other" holds everything kept in the TEE: the Down projection
# (§6.3), norms, RoPE, softmax, residuals, sampling, bank refills.
TIMING_COMPONENTS: tuple[tuple[str, str], ...] = (
    ("attention_proj", "attention proj."),
    ("ffn_proj", "FFN proj. (gate/up)"),
    ("lm_head", "LM head"),
    ("masking", "masking"),
    ("crossing", "crossing"),
    ("other", "other"),
)


# ---------------------------------------------------------------------------------------------------
# Finding runs
# ---------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One run directory: where it is, what its results.json says, and whether it finished."""

    path: Path
    rel: str
    state: str                      # "ok" | "failed" | "unfinished" | "unreadable"
    data: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    @property
    def experiment(self) -> str:
        return str(self.data.get("experiment") or "?")

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(sorted(str(t) for t in (self.data.get("tags") or [])))

    @property
    def metrics(self) -> dict[str, Any]:
        return self.data.get("metrics") or {}

    @property
    def provenance(self) -> dict[str, Any]:
        return self.data.get("provenance") or {}

    @property
    def variant(self) -> str:
        """The run directory's override component (conf/hydra/default.yaml: .../eps=<ε>/<overrides>),
        "default" when there were none; "" when the directory does not follow that layout."""
        parts = Path(str(self.data.get("run_dir") or self.rel)).parts
        if len(parts) >= 2 and parts[-2].startswith("eps="):
            return parts[-1]
        return ""


def scan(root: Path) -> list[Run]:
    """Every run under `root` (recursively), sorted by relative path."""
    root = Path(root)
    runs: list[Run] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__"))
        here = Path(dirpath)
        rel = str(here.relative_to(root)) if here != root else "."
        if RESULTS in filenames:
            runs.append(_load(here, rel, done=DONE in filenames))
        elif LOCK in filenames:
            runs.append(Run(here, rel, "unfinished", reason="no results.json yet (running, or interrupted)"))
    return sorted(runs, key=lambda r: r.rel)


def _load(path: Path, rel: str, done: bool) -> Run:
    try:
        data = json.loads((path / RESULTS).read_text())
    except (OSError, ValueError) as exc:
        return Run(path, rel, "unreadable", reason=f"results.json: {type(exc).__name__}: {exc}")
    if not isinstance(data, dict):
        return Run(path, rel, "unreadable", reason="results.json is not a JSON object")
    status = data.get("status")
    if status == "failed":
        return Run(path, rel, "failed", data, reason=str(data.get("error") or "status failed"))
    if status != "ok":
        return Run(path, rel, "unfinished", data, reason=f"status {status!r}")
    if not done:
        return Run(path, rel, "unfinished", data, reason="status ok but no .done marker (interrupted while writing)")
    return Run(path, rel, "ok", data)


@dataclass
class Selection:
    finished: list[Run]
    problems: list[Run]             # failed / unfinished / unreadable, after the tag filter
    skipped_tagged: list[Run]       # left out because of a tag that was not included
    included_tags: frozenset[str]


def select(runs: Iterable[Run], include_tags: Iterable[str] = ()) -> Selection:
    """Leave out runs carrying an excluded tag (`smoke` unless it is in `include_tags`)."""
    included = frozenset(include_tags)
    excluded = DEFAULT_EXCLUDED_TAGS - included
    finished, problems, skipped = [], [], []
    for run in runs:
        if excluded & set(run.tags):
            skipped.append(run)
        elif run.state == "ok":
            finished.append(run)
        else:
            problems.append(run)
    return Selection(finished, problems, skipped, included)


# ---------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def fmt_ci(mean: Any, lo: Any = None, hi: Any = None, digits: int = 2) -> str:
    """"mean [lo, hi]"; "mean" without an interval; "—" without a value."""
    m = _num(mean)
    if m is None:
        return "—"
    lo_, hi_ = _num(lo), _num(hi)
    if lo_ is None or hi_ is None:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo_:.{digits}f}, {hi_:.{digits}f}]"


def fmt_auto(mean: Any, lo: Any = None, hi: Any = None) -> str:
    """Like fmt_ci, but 3 significant digits for tiny or huge values (e.g. floating-point errors ~1e-6)."""
    def one(v: float) -> str:
        return f"{v:.3g}" if v != 0 and not 0.01 <= abs(v) < 1e5 else f"{v:.2f}"

    m, lo_, hi_ = _num(mean), _num(lo), _num(hi)
    if m is None:
        return "—"
    return one(m) if lo_ is None or hi_ is None else f"{one(m)} [{one(lo_)}, {one(hi_)}]"


def fmt_seconds(value: Any) -> str:
    v = _num(value)
    if v is None:
        return "—"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}"


def fmt_ratio(value: Any) -> str:
    v = _num(value)
    return "—" if v is None else f"{v:.2f}×"


def fmt_eps(value: Any) -> str:
    v = _num(value)
    return "—" if v is None else f"{v:g}"


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


# ---------------------------------------------------------------------------------------------------
# Table 2: fidelity
# ---------------------------------------------------------------------------------------------------


@dataclass
class FidelityRow:
    run: Run
    configuration: str
    epsilon: float | None           # ep1's per-token ε; None for the others
    epsilon_mean: float | None      # the mean per-token ε actually used (epn: mean of 1/√n)
    variant: str
    n_prompts: int | None
    metrics: dict[str, Any]

    def label(self, show_variant: bool = False) -> str:
        if self.configuration == "ep1" and self.epsilon is not None:
            text = f"ep1 (ε={self.epsilon:g})"
        elif self.configuration == "epn" and self.epsilon_mean is not None:
            text = f"epn (mean ε={self.epsilon_mean:.4g})"
        else:
            text = self.configuration
        return f"{text} · {self.variant}" if show_variant and self.variant else text

    def ci(self, key: str) -> tuple[float | None, float | None, float | None]:
        m = self.metrics
        return _num(m.get(key)), _num(m.get(f"{key}_ci_lo")), _num(m.get(f"{key}_ci_hi"))


@dataclass
class FidelityGroup:
    """Runs whose numbers are comparable: same experiment, model, workload, output length, baseline,
    similarity model and tags."""

    experiment_name: str
    model: str
    workload: str
    max_new_tokens: int | None
    baseline: str | None
    semantic_model: str | None
    tags: tuple[str, ...]
    rows: list[FidelityRow]

    @property
    def title(self) -> str:
        parts = [self.model, self.workload, f"{self.max_new_tokens} new tokens", f"baseline {self.baseline}"]
        head = f"{self.experiment_name}: " + " · ".join(str(p) for p in parts)
        return head + (f" · tagged {', '.join(self.tags)}" if self.tags else "")

    @property
    def variants(self) -> list[str]:
        return sorted({r.variant for r in self.rows})

    @property
    def show_variant(self) -> bool:
        """Name each row's overrides only when they differ between rows (else the header says them)."""
        return len(self.variants) > 1

    @property
    def slug(self) -> str:
        raw = "_".join(str(x) for x in (self.experiment_name, self.model, self.workload, self.max_new_tokens,
                                         *self.tags))
        return file_slug(raw)


def file_slug(raw: str, limit: int = 48) -> str:
    """A filesystem-safe name for a plot: run directories can be long (every override is in them), so a
    long name is cut and made unique again with a short hash of the whole."""
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in raw)
    if len(safe) <= limit:
        return safe
    return f"{safe[:limit - 9]}-{hashlib.sha1(raw.encode()).hexdigest()[:8]}"


def _sort_key(row: FidelityRow) -> tuple:
    conf = row.configuration
    rank = FIDELITY_ORDER.index(conf) if conf in FIDELITY_ORDER else len(FIDELITY_ORDER)
    eps = row.epsilon if row.epsilon is not None else math.inf
    return (rank, conf, row.variant, eps)


def fidelity_row(run: Run) -> FidelityRow:
    d = run.data
    m = run.metrics
    eps = _num(d.get("epsilon")) if d.get("configuration") == "ep1" else None
    return FidelityRow(run=run, configuration=str(d.get("configuration")), epsilon=eps,
                       epsilon_mean=_num(m.get("epsilon_mean")), variant=run.variant,
                       n_prompts=d.get("n_prompts", m.get("n_prompts")), metrics=m)


def fidelity_groups(runs: Iterable[Run]) -> list[FidelityGroup]:
    """Group finished fidelity runs into Table-2 tables; rows sorted ep1 by ascending ε, epn, slalom,
    then the rest."""
    groups: dict[tuple, list[FidelityRow]] = {}
    for run in runs:
        if run.state != "ok" or run.experiment != "fidelity":
            continue
        d = run.data
        key = (str(d.get("experiment_name") or "fidelity"), str(d.get("model")), str(d.get("workload")),
               (d.get("generation") or {}).get("max_new_tokens"), d.get("baseline"), d.get("semantic_model"),
               run.tags)
        groups.setdefault(key, []).append(fidelity_row(run))
    out = [FidelityGroup(*key, rows=sorted(rows, key=_sort_key)) for key, rows in groups.items()]
    return sorted(out, key=lambda g: (g.tags, g.experiment_name, g.model, g.workload, g.max_new_tokens or 0))


def fidelity_table_md(group: FidelityGroup) -> str:
    headers = ["configuration", "n", *[h for _, h in UTILITY_METRICS], "first divergence"]
    rows = []
    for row in group.rows:
        cells = [fmt_ci(*row.ci(key)) for key, _ in UTILITY_METRICS]
        rows.append([row.label(group.show_variant), row.n_prompts if row.n_prompts is not None else "—",
                     *cells, _divergence(row.metrics)])
    return md_table(headers, rows)


def _divergence(m: dict[str, Any]) -> str:
    mean = _num(m.get("mean_first_divergence"))
    n_div, n = m.get("n_diverging"), m.get("n_prompts")
    if mean is None:
        return "none diverge" if n_div == 0 else "—"
    count = f" ({n_div}/{n} diverge)" if n_div is not None and n is not None else ""
    return f"{mean:.1f}{count}"


# ---------------------------------------------------------------------------------------------------
# Table 1 / Fig. 4: timing
# ---------------------------------------------------------------------------------------------------


@dataclass
class TimingRow:
    configuration: str
    max_new_tokens: int
    seconds_per_prompt: float | None
    components: dict[str, float | None]    # TIMING_COMPONENTS keys; "other" = total − the rest
    down_proj: float | None                # part of "other": the Down projection stays in the TEE
    bank_precompute: float | None          # outside the total (the paper precomputes the bank offline)
    epsilon_mean: float | None
    vs_tdx: float | None = None
    vs_t3: float | None = None

    def label(self, epsilon: float | None = None) -> str:
        if self.configuration == "ep1" and epsilon is not None:
            return f"ep1 (ε={epsilon:g})"
        if self.configuration == "epn" and self.epsilon_mean is not None:
            return f"epn (mean ε={self.epsilon_mean:.4g})"
        return self.configuration


@dataclass
class TimingTable:
    run: Run
    rows: list[TimingRow]

    @property
    def epsilon(self) -> float | None:
        return _num(self.run.data.get("epsilon"))

    @property
    def limits(self) -> list[int]:
        return sorted({r.max_new_tokens for r in self.rows})

    @property
    def configurations(self) -> list[str]:
        seen = {r.configuration for r in self.rows}
        return [c for c in CONFIG_ORDER if c in seen] + sorted(seen - set(CONFIG_ORDER))

    def cell(self, configuration: str, limit: int) -> TimingRow | None:
        for r in self.rows:
            if r.configuration == configuration and r.max_new_tokens == limit:
                return r
        return None

    @property
    def title(self) -> str:
        d = self.run.data
        parts = [str(d.get("model")), str(d.get("workload")), f"{d.get('n_prompts')} prompts",
                 f"batch {(d.get('generation') or {}).get('batch_size')}"]
        if self.epsilon is not None:
            parts.append(f"ep1 ε={self.epsilon:g}")
        head = f"{d.get('experiment_name') or 'timing'}: " + " · ".join(parts)
        return head + (f" · tagged {', '.join(self.run.tags)}" if self.run.tags else "")

    @property
    def slug(self) -> str:
        raw = self.run.rel if self.run.rel != "." else str(self.run.data.get("run_dir") or "timing")
        return file_slug(raw)


def timing_row(raw: dict[str, Any]) -> TimingRow:
    """One row of results.json's `table` (runners/timing.py). Reads `components_s` (the engine's full
    breakdown) and falls back on the flat `<component>_s` keys."""
    comps = raw.get("components_s") or {}

    def get(name: str) -> float | None:
        return _num(comps.get(name, raw.get(f"{name}_s")))

    total = _num(raw.get("seconds_per_prompt"))
    if total is None:
        total = _num(comps.get("total"))
    shown = {key: get(key) for key, _ in TIMING_COMPONENTS if key != "other"}
    known = sum(v for v in shown.values() if v is not None)
    other = max(0.0, total - known) if total is not None else get("other")
    return TimingRow(configuration=str(raw.get("configuration")), max_new_tokens=int(raw.get("max_new_tokens") or 0),
                     seconds_per_prompt=total, components={**shown, "other": other}, down_proj=get("down_proj"),
                     bank_precompute=get("bank_precompute"), epsilon_mean=_num(raw.get("epsilon_mean")))


def timing_tables(runs: Iterable[Run]) -> list[TimingTable]:
    """One table per finished timing run; ratios to TDX and to T3 at the same output limit."""
    out = []
    for run in runs:
        if run.state != "ok" or run.experiment != "timing":
            continue
        rows = [timing_row(r) for r in run.data.get("table") or []]
        for row in rows:
            for ref, attr in (("tdx", "vs_tdx"), ("t3", "vs_t3")):
                base = next((r for r in rows if r.configuration == ref and r.max_new_tokens == row.max_new_tokens), None)
                if base is not None and base.seconds_per_prompt and row.seconds_per_prompt is not None:
                    setattr(row, attr, row.seconds_per_prompt / base.seconds_per_prompt)
        table = TimingTable(run, rows)
        order = {c: i for i, c in enumerate(table.configurations)}
        table.rows.sort(key=lambda r: (r.max_new_tokens, order[r.configuration]))
        out.append(table)
    return sorted(out, key=lambda t: (t.run.tags, t.run.rel))


def timing_overview_md(table: TimingTable) -> str:
    """Seconds per prompt, configuration × output limit (the bar heights of Fig. 4)."""
    headers = ["configuration", *[f"{n} tokens" for n in table.limits]]
    rows = []
    for conf in table.configurations:
        cells = []
        for limit in table.limits:
            r = table.cell(conf, limit)
            cells.append("—" if r is None else fmt_seconds(r.seconds_per_prompt))
        label = next((r.label(table.epsilon) for r in table.rows if r.configuration == conf), conf)
        rows.append([label, *cells])
    return md_table(headers, rows)


def timing_breakdown_md(table: TimingTable) -> str:
    headers = ["output limit", "configuration", "s / prompt", *[h for _, h in TIMING_COMPONENTS],
               "(Down, in other)", "÷ TDX", "÷ T3", "bank precompute"]
    rows = []
    for r in table.rows:
        rows.append([r.max_new_tokens, r.label(table.epsilon), fmt_seconds(r.seconds_per_prompt),
                     *[fmt_seconds(r.components.get(k)) for k, _ in TIMING_COMPONENTS], fmt_seconds(r.down_proj),
                     fmt_ratio(r.vs_tdx), fmt_ratio(r.vs_t3), fmt_seconds(r.bank_precompute)])
    return md_table(headers, rows, align="rl" + "r" * (len(headers) - 2))


# ---------------------------------------------------------------------------------------------------
# Table 4: floating-point error of unmasking (runners/fp_error.py)
# ---------------------------------------------------------------------------------------------------

# Paper order of the op types (§7.3.2), Down last: it is not offloaded, only a reference.
FP_OPS: tuple[tuple[str, str], ...] = (
    ("q", "Q"), ("k", "K"), ("v", "V"), ("o", "O"), ("gate", "Gate"), ("up", "Up"), ("lm_head", "LM head"),
    ("down", "Down (TEE)"),
)


@dataclass
class FpErrorRow:
    run: Run
    configuration: str
    epsilon: float | None
    epsilon_mean: float | None
    table: list[dict[str, Any]]

    def label(self) -> str:
        if self.configuration == "ep1" and self.epsilon is not None:
            return f"ep1 (ε={self.epsilon:g})"
        if self.configuration == "epn" and self.epsilon_mean is not None:
            return f"epn (mean ε={self.epsilon_mean:.4g})"
        return self.configuration

    @property
    def x(self) -> float | None:
        """Where the row sits on an ε axis: ep1's ε, epn's mean ε."""
        return self.epsilon if self.epsilon is not None else self.epsilon_mean

    def cell(self, precision: str, kernel: str, op: str) -> dict[str, Any] | None:
        for r in self.table:
            if (r.get("precision"), r.get("kernel"), r.get("op")) == (precision, kernel, op):
                return r
        return None


@dataclass
class FpErrorGroup:
    experiment_name: str
    model: str
    workload: str
    n_prompts: Any
    headline: tuple[str, str]
    variant: str
    tags: tuple[str, ...]
    rows: list[FpErrorRow]

    @property
    def title(self) -> str:
        parts = [self.model, self.workload, f"{self.n_prompts} prompts",
                 f"headline {self.headline[0]} · {self.headline[1]} kernel"]
        if self.variant and self.variant != "default":
            parts.append(f"overrides {self.variant}")
        head = f"{self.experiment_name}: " + " · ".join(str(p) for p in parts)
        return head + (f" · tagged {', '.join(self.tags)}" if self.tags else "")

    @property
    def slug(self) -> str:
        raw = "_".join(str(x) for x in (self.experiment_name, self.model, self.workload, *self.tags))
        return file_slug(raw)

    def pairs(self) -> list[tuple[str, str]]:
        """Every (precision, kernel) any row has, in the order the runs list them."""
        seen: list[tuple[str, str]] = []
        for row in self.rows:
            for r in row.table:
                key = (str(r.get("precision")), str(r.get("kernel")))
                if key not in seen:
                    seen.append(key)
        return seen


def _eps_sort(row: Any) -> tuple:
    conf = row.configuration
    rank = {"ep1": 0, "epn": 1, "t3": 2}.get(conf, 3)
    return (rank, row.epsilon if row.epsilon is not None else math.inf)


def fp_error_groups(runs: Iterable[Run]) -> list[FpErrorGroup]:
    """Finished fp_error runs grouped into Table-4 tables: rows ep1 by ascending ε, then epn, then t3."""
    groups: dict[tuple, list[FpErrorRow]] = {}
    for run in runs:
        if run.state != "ok" or run.experiment != "fp_error":
            continue
        d = run.data
        head = d.get("headline") or {}
        key = (str(d.get("experiment_name") or "fp_error"), str(d.get("model")), str(d.get("workload")),
               d.get("n_prompts"), (str(head.get("precision")), str(head.get("kernel"))), run.variant, run.tags)
        eps = _num(d.get("epsilon")) if d.get("configuration") == "ep1" else None
        groups.setdefault(key, []).append(FpErrorRow(run, str(d.get("configuration")), eps,
                                                     _num(run.metrics.get("epsilon_mean")), d.get("table") or []))
    out = [FpErrorGroup(*key, rows=sorted(rows, key=_eps_sort)) for key, rows in groups.items()]
    return sorted(out, key=lambda g: (g.tags, g.experiment_name, g.model, g.workload, g.variant))


def fmt_pct(value: Any) -> str:
    v = _num(value)
    return "—" if v is None else f"{100 * v:.2f}"


def _bound(c: dict[str, Any], key: str = "mean_bound") -> str:
    """A bound cell: ∞ where the bound does not exist (d·u ≥ 1; stored as null)."""
    if c.get("bound_finite") is False:
        return "∞ (d·u ≥ 1)"
    return fmt_auto(c.get(key))


def _times(value: Any) -> str:
    v = _num(value)
    if v is None:
        return "—"
    return f"{v:,.0f}×" if v >= 100 else f"{v:.2f}×"


def fp_table4_md(group: FpErrorGroup) -> str:
    """Paper Table 4: per ε, over every offloaded op instance, in the headline precision and kernel."""
    prec, kernel = group.headline
    headers = ["configuration", "op instances", "trials", "mean true error [95% CI]", "mean bound", "bound / error",
               "bound violation %", "first-order violation %"]
    rows = []
    for row in group.rows:
        c = row.cell(prec, kernel, "offloaded") or {}
        ci = c.get("instance_error_ci") or (None, None)
        rows.append([row.label(), c.get("n_instances", "—"), c.get("n_trials", "—"),
                     fmt_auto(c.get("mean_true_error"), *ci), _bound(c),
                     _times(c.get("bound_ratio")), fmt_pct(c.get("bound_violation_rate")),
                     fmt_pct(c.get("first_order_violation_rate"))])
    return md_table(headers, rows)


def fp_by_op_md(group: FpErrorGroup) -> str:
    """Mean true error / mean bound per op type and ε (headline precision and kernel)."""
    prec, kernel = group.headline
    ops = [(k, h) for k, h in FP_OPS if any(r.cell(prec, kernel, k) for r in group.rows)]
    headers = ["configuration", *[h for _, h in ops]]
    rows = []
    for row in group.rows:
        cells = []
        for key, _ in ops:
            c = row.cell(prec, kernel, key)
            cells.append("—" if c is None else f"{fmt_auto(c.get('mean_true_error'))} / {_bound(c)}")
        rows.append([row.label(), *cells])
    return md_table(headers, rows)


def fp_precision_md(group: FpErrorGroup) -> str:
    """Every precision × kernel, offloaded ops and Down, per ε: the bound's model against each kernel."""
    headers = ["configuration", "precision", "kernel", "accumulates in", "ops", "mean true error", "mean bound",
               "bound / error", "bound violation %", "overflow %"]
    rows = []
    for row in group.rows:
        for prec, kernel in group.pairs():
            for op in ("offloaded", "down"):
                c = row.cell(prec, kernel, op)
                if c is None:
                    continue
                n, over = c.get("n_trials") or 0, c.get("n_overflow") or 0
                rows.append([row.label(), prec, kernel, c.get("accumulate", "—"), "Down (TEE)" if op == "down" else op,
                             fmt_auto(c.get("mean_true_error")), _bound(c),
                             _times(c.get("bound_ratio")), fmt_pct(c.get("bound_violation_rate")),
                             fmt_pct(over / (n + over) if n + over else None)])
    return md_table(headers, rows, align="lllll" + "r" * 5)


def fp_down_md(group: FpErrorGroup) -> str:
    """Why Down stays in the TEE (§6.3): its Δ and error next to the offloaded ops', fp32 and fp64."""
    kernel = group.headline[1]
    headers = ["configuration", "mean Δ offloaded", "mean Δ Down", "offloaded fp32 error", "Down fp32 error",
               "Down fp32 bound", "Down fp64 error", "Down fp64 bound"]
    rows = []
    for row in group.rows:
        off = row.cell("fp32", kernel, "offloaded") or {}
        d32 = row.cell("fp32", kernel, "down") or {}
        d64 = row.cell("fp64", kernel, "down") or {}
        if not d32 and not d64:
            continue
        rows.append([row.label(), fmt_auto(off.get("delta_mean")), fmt_auto((d32 or d64).get("delta_mean")),
                     fmt_auto(off.get("mean_true_error")), fmt_auto(d32.get("mean_true_error")),
                     _bound(d32), fmt_auto(d64.get("mean_true_error")), _bound(d64)])
    return md_table(headers, rows) if rows else ""


def fp_probes_md(group: FpErrorGroup) -> str:
    probes: dict[str, dict] = {}
    for row in group.rows:
        for name, pr in (row.run.data.get("accumulation_probes") or {}).items():
            probes.setdefault(name, pr)
    if not probes:
        return ""
    rows = [[name, pr.get("kind"), fmt_pct(pr.get("frac_rounded_once")), fmt_pct(pr.get("frac_sequential")),
             pr.get("torch", "—")] for name, pr in probes.items()]
    return md_table(["precision", "torch F.linear on this machine", "= exactly rounded %", "= recursive summation %",
                     "torch"], rows, align="llrrl")


# ---------------------------------------------------------------------------------------------------
# Table 5: controlled numerical error (runners/controlled_error.py)
# ---------------------------------------------------------------------------------------------------

CE_METRICS: tuple[tuple[str, str], ...] = (
    ("semantic_similarity", "semantic sim. %"),
    ("exact_match", "exact match %"),
    ("token_match_rate", "token match %"),
    ("bleu", "BLEU"),
    ("rouge_l", "ROUGE-L"),
)


@dataclass
class ControlledRow:
    level: str
    slug: str
    target: float | None
    mae: float | None
    data: dict[str, Any]

    def label(self, configuration: str) -> str:
        if self.slug == "t3":
            return "T3"
        if self.slug == "natural":
            return f"{configuration.upper()} (natural)"
        return f"CE {self.target:.3g}" if self.target is not None else self.level

    def ci(self, key: str) -> tuple[float | None, float | None, float | None]:
        return _num(self.data.get(key)), _num(self.data.get(f"{key}_ci_lo")), _num(self.data.get(f"{key}_ci_hi"))


@dataclass
class ControlledTable:
    run: Run
    rows: list[ControlledRow]

    @property
    def configuration(self) -> str:
        return str(self.run.data.get("configuration"))

    @property
    def title(self) -> str:
        d = self.run.data
        eps = _num(d.get("epsilon"))
        parts = [str(d.get("model")), str(d.get("workload")), f"{d.get('n_prompts')} prompts",
                 f"{(d.get('generation') or {}).get('max_new_tokens')} new tokens",
                 f"{self.configuration}" + (f" ε={eps:g}" if eps is not None else ""), "reference t3"]
        head = f"{d.get('experiment_name') or 'controlled_error'}: " + " · ".join(parts)
        return head + (f" · tagged {', '.join(self.run.tags)}" if self.run.tags else "")

    @property
    def slug(self) -> str:
        raw = self.run.rel if self.run.rel != "." else str(self.run.data.get("run_dir") or "controlled_error")
        return file_slug(raw)


def controlled_tables(runs: Iterable[Run]) -> list[ControlledTable]:
    """One Table 5 per finished controlled_error run, rows by ascending mean absolute error (T3 first)."""
    out = []
    for run in runs:
        if run.state != "ok" or run.experiment != "controlled_error":
            continue
        rows = [ControlledRow(str(r.get("level")), str(r.get("slug")), _num(r.get("target_mae")),
                              _num(r.get("realised_mae")), r) for r in run.data.get("table") or []]
        rows.sort(key=lambda r: (r.slug != "t3", r.mae if r.mae is not None else math.inf))
        out.append(ControlledTable(run, rows))
    return sorted(out, key=lambda t: (t.run.tags, t.run.rel))


def controlled_table5_md(table: ControlledTable) -> str:
    headers = ["setting", "mean absolute error", *[h for _, h in CE_METRICS]]
    rows = [[r.label(table.configuration), "0" if r.mae == 0 else fmt_auto(r.mae),
             *[fmt_ci(*r.ci(k)) for k, _ in CE_METRICS]] for r in table.rows]
    return md_table(headers, rows)


# ---------------------------------------------------------------------------------------------------
# Other experiments (attacks, ...): their headline metrics, generically
# ---------------------------------------------------------------------------------------------------

# Experiments with a dedicated section of the report.
DEDICATED = ("fidelity", "timing", "fp_error", "controlled_error", "attack")


def other_tables_md(runs: Iterable[Run]) -> list[tuple[str, str]]:
    """(experiment, markdown) for finished runs of experiments without a dedicated table: every numeric
    metric, with its interval where one is recorded."""
    by_exp: dict[tuple[str, tuple[str, ...]], list[Run]] = {}
    for run in runs:
        if run.state == "ok" and run.experiment not in DEDICATED:
            by_exp.setdefault((run.experiment, run.tags), []).append(run)  # tagged runs: a table of their own
    out = []
    for (exp, tags), exp_runs in sorted(by_exp.items()):
        exp = exp + (f" (tagged {', '.join(tags)})" if tags else "")
        names: list[str] = []
        for run in exp_runs:
            for key, value in run.metrics.items():
                if key.endswith(("_ci_lo", "_ci_hi")) or key in names:
                    continue
                if _num(value) is not None or isinstance(value, bool):
                    names.append(key)
        rows = []
        for run in sorted(exp_runs, key=lambda r: (str(r.data.get("configuration")), _num(r.data.get("epsilon")) or 0)):
            m = run.metrics
            cells = [str(m[k]) if isinstance(m.get(k), bool) else fmt_auto(m.get(k), m.get(f"{k}_ci_lo"), m.get(f"{k}_ci_hi"))
                     for k in names]
            rows.append([run.rel, str(run.data.get("model")), str(run.data.get("configuration")),
                         fmt_eps(run.data.get("epsilon")), ", ".join(run.tags) or "—", *cells])
        out.append((exp, md_table(["run", "model", "configuration", "ε", "tags", *names], rows)))
    return out


# ---------------------------------------------------------------------------------------------------
# Provenance and problems
# ---------------------------------------------------------------------------------------------------


def _uniq(values: Iterable[Any]) -> list[str]:
    seen: list[str] = []
    for v in values:
        if v is None or v == "" or v == []:
            continue
        for item in (v if isinstance(v, list) else [v]):
            s = str(item)
            if s not in seen:
                seen.append(s)
    return seen


def cpu_fallback(run: Run) -> bool:
    """True when the run's accelerator side ran on the CPU (no CUDA) — its numbers compare CPU with CPU."""
    engines = run.provenance.get("engines") or {}
    if any(isinstance(e, dict) and e.get("accelerator_is_cpu_fallback") for e in engines.values()):
        return True
    if any(isinstance(r, dict) and r.get("device_is_cpu_fallback") for r in run.data.get("table") or []):
        return True
    return any("no CUDA" in str(n) for n in run.data.get("notes") or [])


def provenance_md(runs: Sequence[Run], included_tags: Iterable[str] = ()) -> str:
    """The header: what was run, on what, from which code, when, with which command."""
    prov = [r.provenance for r in runs]
    code = [p.get("code") or {} for p in prov]
    commits = _uniq(f"{c.get('commit', '?')[:12]}{' (uncommitted changes)' if c.get('dirty') else ''}"
                    for c in code if c.get("commit"))
    machines = [p.get("machine") or {} for p in prov]
    cuda_devices = _uniq(m.get("cuda_device") for m in machines)
    engines = [e for p in prov for e in (p.get("engines") or {}).values() if isinstance(e, dict)]
    tee_devices = _uniq(e.get("tee_device") for e in engines)
    times = sorted(_uniq(p.get("timestamp") for p in prov))
    n_prompts = sorted({r.data.get("n_prompts") for r in runs if r.data.get("n_prompts") is not None})
    versions = {}
    for p in prov:
        for k, v in (p.get("versions") or {}).items():
            if k in ("torch", "transformers", "sacrebleu", "rouge-score", "sentence-transformers") and v:
                versions.setdefault(k, set()).add(v)
    fallback = [r for r in runs if cpu_fallback(r)]

    lines = []
    lines.append(f"- **Runs**: {len(runs)} finished ({_count_by(runs, lambda r: r.experiment)})")
    lines.append("- **Models**: " + "; ".join(
        f"`{m}` ({src})" if src else f"`{m}`" for m, src in _pairs(runs, "model", "model_source")))
    lines.append("- **Workloads**: " + "; ".join(
        f"`{w}` ({(info or {}).get('source', '')})".replace(" ()", "") for w, info in _pairs(runs, "workload", "workload_info")))
    lines.append(f"- **Prompts per run**: {', '.join(str(n) for n in n_prompts) or '—'}")
    lines.append(f"- **Code (git)**: {', '.join(commits) or 'not recorded'}")
    if len(commits) > 1:
        lines.append("  - ⚠ the runs come from more than one code version")
    lines.append(f"- **Devices**: TEE side {', '.join(tee_devices) or 'not recorded'}; "
                 f"TEE kind {', '.join(_uniq(p.get('tee_kind') for p in prov)) or 'none recorded'}; "
                 f"accelerator {', '.join(_uniq(p.get('device') for p in prov)) or 'none'}"
                 + (f"; CUDA device {', '.join(cuda_devices)}" if cuda_devices else ""))
    if fallback:
        lines.append(f"  - **The accelerator was the CPU fallback** in {len(fallback)} of {len(runs)} runs: there "
                     "was no CUDA device, so the \"device\" side ran on the CPU and the timings compare CPU against "
                     "CPU; the fidelity baseline is then `cpu`, not `gpu`.")
    if "emulated" in _uniq(p.get("tee_kind") for p in prov):
        lines.append("  - TEE kind `emulated`: no TDX guest; the trusted side ran as an ordinary process.")
    if versions:
        lines.append("- **Versions**: " + ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in versions.items()))
    sims = _uniq(r.data.get("semantic_model") for r in runs)
    if sims:
        lines.append(f"- **Similarity model**: {', '.join(sims)}")
    sigs = _uniq((r.metrics.get("bleu_signature") or r.provenance.get("bleu_signature")) for r in runs)
    if sigs:
        lines.append(f"- **sacrebleu signature**: {', '.join(f'`{s}`' for s in sigs)}")
    if times:
        lines.append(f"- **Dates**: {times[0]}" + (f" … {times[-1]}" if times[-1] != times[0] else ""))
    commands = _uniq(p.get("command") for p in prov)
    if commands:
        lines.append("- **Commands**:")
        lines += [f"  - `{c}`" for c in commands]
    notes = _uniq(n for r in runs for n in (r.data.get("notes") or []))
    if notes:
        lines.append("- **Notes from the runs**:")
        lines += [f"  - {n}" for n in notes]
    return "\n".join(lines)


def _pairs(runs: Sequence[Run], key: str, detail: str) -> list[tuple[str, Any]]:
    out: dict[str, Any] = {}
    for r in runs:
        name = r.data.get(key)
        if name is not None and str(name) not in out:
            out[str(name)] = r.data.get(detail)
    return list(out.items())


def _count_by(runs: Sequence[Run], key) -> str:
    counts: dict[str, int] = {}
    for r in runs:
        counts[key(r)] = counts.get(key(r), 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def problems_md(problems: Sequence[Run]) -> str:
    rows = []
    for r in problems:
        d = r.data
        rows.append([r.rel, r.state, d.get("experiment") or "—", d.get("configuration") or "—",
                     fmt_eps(d.get("epsilon")), ", ".join(r.tags) or "—", r.reason or "—"])
    return md_table(["run", "state", "experiment", "configuration", "ε", "tags", "reason"], rows,
                    align="lllllll")


def runs_md(runs: Sequence[Run]) -> str:
    rows = []
    for r in runs:
        p = r.provenance
        rows.append([r.rel, r.experiment, r.data.get("configuration") or "all", fmt_eps(r.data.get("epsilon")),
                     r.data.get("model") or "—", ", ".join(r.tags) or "—", p.get("timestamp") or "—",
                     ((p.get("code") or {}).get("commit") or "—")[:12]])
    return md_table(["run", "experiment", "configuration", "ε", "model", "tags", "date", "commit"], rows,
                    align="llllllll")

"""What a report says about its runs: the provenance header (models, workloads, prompts, code, devices,
TEE kind, versions, dates, commands), the list of runs it covers, and the failed and unfinished ones."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from runners.report.format import fmt_eps, md_table, relative_paths
from runners.report.runs import Run, cpu_fallback

VERSIONS = ("torch", "transformers", "sacrebleu", "rouge-score", "sentence-transformers")


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


def provenance_md(runs: Sequence[Run], relative_to: Path | None = None) -> str:
    """The header: what was run, on what, from which code, when, with which command (absolute paths in the
    commands written relative to `relative_to`, where given)."""
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
    versions: dict[str, set[str]] = {}
    for p in prov:
        for k, v in (p.get("versions") or {}).items():
            if k in VERSIONS and v:
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
        lines += [f"  - `{relative_paths(c, relative_to)}`" for c in commands]
        if relative_to is not None:
            lines.append("  - *(absolute paths are written relative to the repository root the commands ran from "
                         "(report --relative-to); `../shared/data` is the project's copy of the public data sets "
                         "(docs/results/README.md), and `paths.output_dir` may be any directory)*")
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


def _count_by(runs: Sequence[Run], key: Callable[[Run], str]) -> str:
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

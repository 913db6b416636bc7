"""`splitbench-report DIR --wandb ENTITY/PROJECT`: the sweep under DIR as a W&B comparison report.

The runs themselves reach W&B through the mirror (harness/wandb_mirror.py, `logger=wandb`): one W&B run
per run directory, grouped by `logger.group` or the experiment name, `job_type` the runner, the resolved
config as its config and results.json's metrics as its summary. This module reads the local sweep only
to decide what the report shows (which experiments, groups and configurations it holds) and lays out:

- per experiment group of fidelity runs: each Table 2 metric against ε, one run set (one colour) per
  configuration, and the paper's Table 2 panel (every metric per configuration, bars);
- per group of attack runs: the Table 6 panel (reconstruction token F1 / precision / recall, semantic
  similarity and the Bayes attacker's top-1 per configuration and attacked component), token F1 against
  ε, and the chance floor beside it;
- per group of any other experiment's runs (split fine-tuning, timing, the gradient audit, ...): a generic
  comparison panel, every numeric summary metric the group's runs share, per configuration.

The definition (`plan`) is plain JSON. With W&B reachable (an API key, WANDB_MODE neither offline nor
disabled) the report is saved and its URL printed; otherwise the definition is written to a file, with
the report's full W&B view spec beside it for inspection, and
`splitbench-report --wandb-push FILE` saves it later from a machine that is online.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runners.report.runs import Run

DEFINITION_FILE = "wandb_report.json"
FORMAT = "splitbench-wandb-report/1"

# (summary key, label) as the mirror writes them (results.json "metrics").
TABLE2_METRICS = (("exact_match", "exact match (%)"), ("token_match_rate", "token match (%)"), ("bleu", "BLEU"),
                  ("rouge_l", "ROUGE-L"), ("semantic_similarity", "semantic similarity"))
TABLE6_METRICS = (("token_f1", "token F1 (%)"), ("token_precision", "token precision (%)"),
                  ("token_recall", "token recall (%)"), ("semantic_similarity", "semantic similarity"),
                  ("bayes_top1", "Bayes top-1 (%)"))
CONFIG_ORDER = ("cpu", "gpu", "tdx", "t3", "ep1", "epn", "slalom")


class WandbReportError(Exception):
    """A bad --wandb argument or definition file: one line for the command line."""


def parse_target(target: str) -> tuple[str, str]:
    entity, sep, project = target.partition("/")
    if not sep or not entity or not project or "/" in project:
        raise WandbReportError(f"--wandb takes ENTITY/PROJECT, got {target!r}")
    return entity, project


def _group(run: Run) -> str:
    """The W&B group the mirror gave the run (harness/wandb_mirror.py)."""
    logger = (run.provenance.get("config") or {}).get("logger") or {}
    return str(logger.get("group") or run.data.get("experiment_name") or run.experiment)


def _configurations(runs: Sequence[Run]) -> list[str]:
    found = {str(r.data.get("configuration")) for r in runs}
    return sorted(found, key=lambda c: (CONFIG_ORDER.index(c) if c in CONFIG_ORDER else len(CONFIG_ORDER), c))


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _runsets(job_type: str, group: str, configurations: Sequence[str]) -> list[dict[str, str]]:
    return [{"name": c, "filters": f"JobType = {_quote(job_type)} and Group = {_quote(group)} and "
                                   f"Config('configuration.name') = {_quote(c)}"} for c in configurations]


def _fidelity_section(group: str, runs: Sequence[Run]) -> dict[str, Any]:
    configurations = _configurations(runs)
    with_eps = [c for c in configurations if any(r.data.get("epsilon") is not None
                                                 for r in runs if r.data.get("configuration") == c)]
    panels: list[dict[str, Any]] = [
        {"type": "scatter", "title": f"{label} vs ε", "x": ["config", "epsilon"], "y": ["summary", key], "log_x": True}
        for key, label in TABLE2_METRICS
    ] if with_eps else []
    panels.append({"type": "bar", "title": "Table 2: output fidelity per configuration",
                   "metrics": [key for key, _ in TABLE2_METRICS], "groupby": "configuration.name"})
    return {"heading": f"Table 2: output fidelity ({group})",
            "text": (f"{len(runs)} finished fidelity run(s), configurations {', '.join(configurations)}; each "
                     "metric compares the configuration's greedy output with the baseline's, per prompt. "
                     + ("One colour per configuration; the x axis is the ε each ran under (log scale)."
                        if with_eps else "No run of this group ran under an ε.")),
            "runsets": _runsets("fidelity", group, configurations), "panels": panels}


def _attack_section(group: str, runs: Sequence[Run]) -> dict[str, Any]:
    configurations = _configurations(runs)
    panels: list[dict[str, Any]] = [
        {"type": "bar", "title": "Table 6: prompt reconstruction per configuration and component",
         "metrics": [key for key, _ in TABLE6_METRICS], "groupby": "attack.component"},
        {"type": "scatter", "title": "token F1 vs ε", "x": ["config", "epsilon"], "y": ["summary", "token_f1"],
         "log_x": True},
        {"type": "scatter", "title": "chance floor (token F1) vs ε", "x": ["config", "epsilon"],
         "y": ["summary", "chance_floor_token_f1"], "log_x": True},
    ]
    return {"heading": f"Table 6: prompt reconstruction ({group})",
            "text": (f"{len(runs)} finished attack run(s), configurations {', '.join(configurations)}. A cell "
                     "leaks only when its token F1 rises above the chance floor (attacks/controls.py); the "
                     "verdicts are in the local report.md."),
            "runsets": _runsets("attack", group, configurations), "panels": panels}


GENERIC_METRICS_MAX = 12  # a bar panel with more metrics than this is unreadable; the rest stay in report.md


def _job_type(run: Run) -> str:
    """The W&B job_type the mirror gave the run: the runner (cfg.runner)."""
    return str((run.provenance.get("config") or {}).get("runner") or run.experiment)


def _generic_section(group: str, runs: Sequence[Run]) -> dict[str, Any]:
    configurations = _configurations(runs)
    shared = set.intersection(*({k for k, v in r.metrics.items()
                                 if isinstance(v, (int, float)) and not isinstance(v, bool)} for r in runs))
    metrics = sorted(shared)[:GENERIC_METRICS_MAX]
    experiment = runs[0].experiment
    panels = [{"type": "bar", "title": f"{experiment}: metrics per configuration", "metrics": metrics,
               "groupby": "configuration.name"}] if metrics else []
    return {"heading": f"{experiment} ({group})",
            "text": (f"{len(runs)} finished {experiment} run(s), configurations {', '.join(configurations)}; "
                     f"{len(metrics)} of the {len(shared)} numeric metrics every run reports (alphabetical); "
                     "the full tables are in the local report.md."),
            "runsets": _runsets(_job_type(runs[0]), group, configurations), "panels": panels}


def mirrored_projects(runs: Sequence[Run]) -> set[tuple[str | None, str]]:
    """(entity, project) of every run mirrored with logger=wandb, as its provenance records the config."""
    found = set()
    for r in runs:
        logger = (r.provenance.get("config") or {}).get("logger") or {}
        if logger.get("name") == "wandb":
            found.add((logger.get("entity"), str(logger.get("project"))))
    return found


def check_target(runs: Sequence[Run], entity: str, project: str) -> None:
    """Refuse a report on a project the runs were not mirrored to: its run sets would match no run."""
    # entity null in the config: the API key's default entity, which only the server knows; ENTITY stands for it.
    wrong = sorted({f"{e or 'ENTITY'}/{p}" for e, p in mirrored_projects(runs)
                    if p != project or (e is not None and e != entity)})
    if wrong:
        raise WandbReportError(f"the runs were mirrored to {', '.join(wrong)}, not {entity}/{project}"
                               + (f"; give --wandb {wrong[0]}" if len(wrong) == 1 else ""))


def offline_runs(root: Path) -> list[Path]:
    """The offline W&B run directories the mirror left under the run directories (`wandb sync` pushes them)."""
    return sorted(Path(root).rglob("wandb/offline-run-*"))


def replay(runs: Sequence[Run], entity: str, project: str) -> list[Run]:
    """Mirror the finished runs that never were (logger=none) into offline W&B runs under their run
    directories (`wandb sync` pushes them), from results.json, samples.jsonl and the resolved config in
    their provenance, through the same mirror a run uses (harness/wandb_mirror.py). Offline always: the
    report's sync command then covers them. Returns the runs mirrored."""
    from omegaconf import OmegaConf

    from harness.wandb_mirror import mirror

    done = []
    for run in runs:
        config = run.provenance.get("config")
        if run.state != "ok" or not config or mirrored_projects([run]) or offline_runs(run.path):
            continue
        cfg = OmegaConf.create(config)
        cfg.logger.update({"name": "wandb", "entity": entity, "project": project, "mode": "offline"})
        samples_file = run.path / "samples.jsonl"
        samples = ([json.loads(line) for line in samples_file.read_text().splitlines() if line.strip()]
                   if samples_file.exists() else [])
        if mirror(cfg, run.path, run.data, samples, name=run.rel):
            done.append(run)
    return done


def plan(runs: Sequence[Run], entity: str, project: str, source: str, title: str | None = None) -> dict[str, Any]:
    """The report's definition: JSON, no W&B objects, so it can be written offline and pushed later."""
    sections: list[dict[str, Any]] = []
    finished = [r for r in runs if r.state == "ok"]
    specific = {"fidelity": _fidelity_section, "attack": _attack_section}
    experiments = [*specific, *sorted({r.experiment for r in finished} - set(specific))]
    for experiment in experiments:
        build = specific.get(experiment, _generic_section)
        chosen = [r for r in finished if r.experiment == experiment]
        for group in sorted({_group(r) for r in chosen}):
            sections.append(build(group, [r for r in chosen if _group(r) == group]))
    if not sections:
        raise WandbReportError("no finished runs to put in a W&B report")
    return {"format": FORMAT, "entity": entity, "project": project,
            "title": title or f"splitbench: {Path(source).name or source}",
            "description": f"splitbench comparison report of the sweep in {source} (runs mirrored with logger=wandb)",
            "sections": sections}


def _metric(wr, ref: Sequence[str] | str):
    kind, name = ref if not isinstance(ref, str) else ("summary", ref)
    return wr.Config(name) if kind == "config" else wr.SummaryMetric(name)


def _panel(wr, spec: dict[str, Any]):
    if spec["type"] == "scatter":
        return wr.ScatterPlot(title=spec["title"], x=_metric(wr, spec["x"]), y=_metric(wr, spec["y"]),
                              log_x=spec.get("log_x"))
    if spec["type"] == "bar":
        return wr.BarPlot(title=spec["title"], metrics=[wr.SummaryMetric(m) for m in spec["metrics"]],
                          groupby=wr.Config(spec["groupby"]), orientation="v")
    raise WandbReportError(f"unknown panel type {spec['type']!r} in the report definition")


def to_report(definition: dict[str, Any], *, online: bool):
    """The wandb_workspaces Report of a definition. Offline the run sets name no entity/project (they
    would need a project lookup on the server); online they do."""
    import wandb_workspaces.reports.v2 as wr

    if definition.get("format") != FORMAT:
        raise WandbReportError(f"not a splitbench W&B report definition (format {definition.get('format')!r})")
    where = {"entity": definition["entity"], "project": definition["project"]} if online else {}
    blocks: list[Any] = [wr.P(definition["description"])]
    for section in definition["sections"]:
        runsets = [wr.Runset(name=rs["name"], filters=rs["filters"], **where) for rs in section["runsets"]]
        blocks += [wr.H2(section["heading"]), wr.P(section["text"]),
                   wr.PanelGrid(runsets=runsets, panels=[_panel(wr, p) for p in section["panels"]])]
    return wr.Report(entity=definition["entity"], project=definition["project"], title=definition["title"],
                     description=definition["description"], blocks=blocks, width="fluid")


def can_go_online() -> tuple[bool, str]:
    """Whether to try saving: not with WANDB_MODE offline/disabled, not without an API key."""
    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "disabled", "dryrun"):
        return False, f"WANDB_MODE={mode}"
    try:
        import wandb

        wandb.Api()
    except Exception as exc:  # no key (UsageError), unreadable settings, ...
        return False, f"W&B not reachable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return True, ""


def save(definition: dict[str, Any]) -> str:
    report = to_report(definition, online=True)
    report.save()
    return str(report.url)


def write_definition(definition: dict[str, Any], out: Path) -> Path:
    """The definition plus, for inspection, the W&B view spec the report would have (built offline)."""
    spec = json.loads(to_report(definition, online=False)._to_model().model_dump_json(by_alias=True, exclude_none=True))
    path = Path(out) / DEFINITION_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({**definition, "wandb_viewspec": spec}, indent=1) + "\n")
    tmp.replace(path)
    return path


def load_definition(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise WandbReportError(f"cannot read the report definition {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WandbReportError(f"{path} is not a splitbench W&B report definition")
    data.pop("wandb_viewspec", None)
    return data

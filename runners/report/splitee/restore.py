"""Restored reconstructions: paper Table 7 (§7.4.4), from runners/splitee/restore.py's runs.

One table per run: each attacker's metrics on its raw and on its restored reconstructions, the paired
change in token F1, the restored text's own floor and verdict; then the first `restore.examples` prompts
side by side (original, raw reconstruction, restored text), escaped so they read as text on GitHub.
"""
from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.results import SAMPLES, read_jsonl
from runners.report.format import ci, configuration_label, fmt_ci, md_table, num, tagged
from runners.report.plotting import Figures
from runners.report.runs import Run, finished_runs

EXPERIMENT = "restore"

METRICS = (("token_precision", "token precision %"), ("token_recall", "token recall %"), ("token_f1", "token F1 %"),
           ("semantic_similarity", "semantic sim. %"), ("bleu", "BLEU"), ("rouge_l", "ROUGE-L"),
           ("exact_match", "exact match %"))
ATTACKER_LABEL = {"learned": "learned inverter", "bayes": "Bayes attacker"}
INTRO = ("Each reconstruction of an attack run given to an instruct model told to fix corrupted words and merge "
         "repeated fragments without adding information (paper §7.4.4), then scored against the prompt with the "
         "attack's own metrics. Cells are **mean [95% interval]** over prompts, in %. The change is paired over "
         "prompts. The restored floor is the token F1 of the restorations made for the *other* prompts: what "
         "fluent generic text scores by itself; the restored verdict is classified against it with the "
         "source run's controls.")


@dataclass
class RestoreTable:
    run: Run

    @property
    def title(self) -> str:
        d = self.run.data
        a = d.get("attack") or {}
        conf = configuration_label(str(d.get("configuration")), num(d.get("epsilon")), None)
        return tagged(f"{d.get('experiment_name')}: {d.get('model')} · {conf} · {a.get('setting')} · "
                      f"{a.get('component')} layer {a.get('layer')} · restored by {d.get('restoration_model')} · "
                      f"{d.get('n_prompts')} prompts", self.run.tags)


def groups(runs: Sequence[Run]) -> list[RestoreTable]:
    return [RestoreTable(r) for r in sorted(finished_runs(runs, EXPERIMENT), key=lambda r: (r.tags, r.rel))]


def _cell(m: dict[str, Any], key: str) -> str:
    return fmt_ci(*ci(m, key))


def table_md(table: RestoreTable) -> str:
    rows = []
    for name, v in (table.run.data.get("attackers") or {}).items():
        label = ATTACKER_LABEL.get(name, name)
        for key, head in METRICS:
            rows.append([label, head, _cell(v.get("raw") or {}, key), _cell(v.get("restored") or {}, key)])
        rows.append([label, "token F1 change (paired)", "",
                     fmt_ci(v.get("delta_token_f1"), v.get("delta_token_f1_ci_lo"), v.get("delta_token_f1_ci_hi"))])
        rows.append([label, "restored floor · verdict", "",
                     f"{num(v.get('restored_floor_token_f1')) or 0:.2f} · {v.get('restored_verdict')}"])
    return md_table(["attacker", "metric", "raw", "restored"], rows)


def _text(value: Any, limit: int = 400) -> str:
    s = " ".join(str(value or "").split())
    s = s if len(s) <= limit else s[:limit] + " …"
    return html.escape(s)


def examples_md(table: RestoreTable) -> list[str]:
    n = int((table.run.data.get("restore") or {}).get("examples") or 0)
    if n <= 0 or not (table.run.path / SAMPLES).is_file():
        return []
    rows = read_jsonl(table.run.path / SAMPLES)[:n]
    attackers = list((table.run.data.get("attackers") or {}))
    md = ["Examples (the first prompts of the run):", ""]
    for row in rows:
        body = [["original", _text(row.get("prompt"))]]
        for a in attackers:
            label = ATTACKER_LABEL.get(a, a)
            body.append([f"{label}, raw (F1 {num(row.get(f'{a}_raw_token_f1')) or 0:.1f})", _text(row.get(f"{a}_raw_text"))])
            body.append([f"{label}, restored (F1 {num(row.get(f'{a}_restored_token_f1')) or 0:.1f})",
                         _text(row.get(f"{a}_restored_text"))])
        md += [f"**{html.escape(str(row.get('id')))}**", "", md_table(["text", ""], body, align="ll"), ""]
    return md


def markdown(items: Sequence[RestoreTable], figure: Figures) -> list[str]:
    md = ["## Restored reconstructions (paper Table 7)", "", INTRO, ""]
    for table in items:
        md += [f"### {table.title}", "", table_md(table), "", *examples_md(table)]
        verdict = (table.run.data.get("metrics") or {}).get("verdict")
        md += [f"Verdict with restoration: **{verdict}** (the worst of the source's and the restored ones).", ""]
    return md


def summary(items: Sequence[RestoreTable]) -> list[str]:
    out = []
    for t in items:
        att = t.run.data.get("attackers") or {}
        parts = [f"{a} token F1 {num(v['raw'].get('token_f1')):.1f} → {num(v['restored'].get('token_f1')):.1f}"
                 for a, v in att.items()]
        out.append(f"{t.title}: " + "; ".join(parts))
    return out

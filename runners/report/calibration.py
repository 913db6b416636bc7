"""The report section of experiment=calibration (issue 31): per run, each system's verdict on null trials
and on known doses, with Clopper–Pearson intervals (attacks/calibration.py)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runners.report.format import md_table, tagged
from runners.report.runs import Run, finished_runs

EXPERIMENT = "calibration"
INTRO = ("Each system's verdict run as its runner runs it, on null trials (a signal that carries no private "
         "information: the *null* column) and on trials at known doses (pp, in the unit of the verdict's "
         "statistic). *False leaks*: null trials read leak, with the Clopper–Pearson 95% upper bound; *at "
         "chance*: null trials read at_chance (the verdict's power to certify); *power*: dosed trials read leak; "
         "*certifiable margin*: the margin the sample size certifies with 80 % probability at the nulls' spread "
         "(metrics/equivalence.py); *n the rule asks*: the n the sizing rule (metrics/equivalence.py) needs for the "
         "configured target at the configured planning values (*planned*) and at the values the run measured "
         "(*measured*), each with its predicted certification and power at the run's n. Issue 31's acceptance: "
         "false-leak bound ≤ 10 %, power at the gate's dose "
         "≥ 80 %, nulls at chance ≥ 80 % (✓/✗ per check, measured, not enforced). *Zero-width*: at_chance calls "
         "read on a zero-width interval (issue 51: 0, every at_chance reads the bound its sample earned), and in "
         "brackets the trials whose data interval had zero width. *Further nulls*: other signals without "
         "information read with the same verdict (collab: random ids with 2× the null's steps).")


def groups(runs: Sequence[Run]) -> list[Run]:
    return list(finished_runs(runs, EXPERIMENT))


def _pct(p: dict[str, Any] | None) -> str:
    return "—" if p is None else f"{p['k']}/{p['n']} ({100 * p['rate']:.0f} %)"


def _sized(values: dict[str, Any] | None) -> str | None:
    """The n the sizing rule asks at one set of planning values, and its predictions at the run's n."""
    if not values or "predicted_certify_probability" not in values:
        return None
    return (f"{values['n_needed']} (at n: certify {100 * values['predicted_certify_probability']:.0f} %, "
            f"power {100 * values['predicted_power_at_gate_dose']:.0f} %)")


def run_md(run: Run) -> str:
    rows = []
    for name, s in (run.data.get("systems") or {}).items():
        fl = s["false_leak_rate"]
        power = "; ".join(f"{d} pp: {_pct(p)}" for d, p in s["power"].items())
        margin = s.get("certifiable_margin_pp")
        acc = s.get("acceptance") or {}
        sizing = s.get("sizing") or {}
        sized = "; ".join(f"{label} {_sized(sizing.get(key))}" for label, key in (("planned", "planned"),
                                                                               ("measured", "measured"))
                          if _sized(sizing.get(key)) is not None) or "—"
        zero = ("—" if "zero_spread_certifications" not in s else
                f"{s['zero_spread_certifications']} ({s.get('zero_width_intervals', '—')})")
        extra = "; ".join(f"{k}: false leaks {_pct(x['false_leak_rate'])}, at chance {_pct(x['certify_rate'])}"
                          for k, x in (s.get("extra_nulls") or {}).items()) or "—"
        rows.append([name, str(s["n_examples"]), sized, s["null"], f"{_pct(fl)} ≤ {100 * fl['ci'][1]:.1f} %",
                     _pct(s["certify_rate"]), power, f"{s['gate_dose_pp']:g}",
                     "—" if margin is None else f"{margin:.2f} (m = {s['margin_pp']:g})",
                     " ".join("✓" if acc.get(k) else "✗" for k in ("false_leak_upper_le_10pct",
                                                                  "power_at_gate_dose_ge_80pct",
                                                                  "certify_rate_ge_80pct")), zero, extra])
    return md_table(["system", "n", "n the rule asks (predicted at n)", "null", "false leaks", "at chance",
                     "power per dose", "gate dose pp", "certifiable margin pp", "acceptance (fl / power / certify)",
                     "zero-width at_chance (intervals)", "further nulls"],
                    rows, align="lrlllllrrcrl")


PUBLISHED_INTRO = ("*At the published n* (issue 51 item 4): each verdict at the n its committed reports use "
                   "(calibration.<system>.published_n; collab: calibration.collab.engine.n_examples), with what the "
                   "sizing rule (metrics/equivalence.py) predicts there and, where that n cannot certify the margin, "
                   "the n it needs (80 % certification and power at the gate's dose). Collab's row is measured "
                   "through the engine: its two *engine nulls* (random ids along the undefended run's own steps "
                   "against random ids along its null's; DP-Fusion at ε = 0 edge-side, signal and null each decoded "
                   "at its own seed) and the gate's dose written into the first, each read by the runner's verdict "
                   "(matched steps, earned bound); false leaks and at chance over both nulls' trials together, "
                   "Clopper–Pearson 95 %.")


def reading(pub: dict[str, Any]) -> str:
    """What the published n certifies: the note where it cannot (metrics/equivalence.certification_note)."""
    if "note" not in pub:
        return "—"
    return pub["note"] or f"certifies ±{pub['margin_pp']:g} pp (≥ 80 %)"


def _ci(p: dict[str, Any] | None) -> str:
    return "—" if p is None else f"{_pct(p)} [{100 * p['ci'][0]:.1f}, {100 * p['ci'][1]:.1f}] %"


def published_md(run: Run) -> str | None:
    rows = []
    for name, s in (run.data.get("systems") or {}).items():
        pub = s.get("published")
        if pub is None:
            continue
        engine = "; ".join(f"{k}: false leaks {_pct(x['false_leak_rate'])}, at chance {_pct(x['certify_rate'])}, "
                           f"zero-width at_chance {x['zero_spread_certifications']}"
                           for k, x in (s.get("engine_nulls") or {}).items()) or "—"
        margin = pub.get("certifiable_margin_pp")
        rows.append([name, f"{pub['n']} ({pub['source']})", engine, _ci(pub.get("false_leak_rate")),
                     _ci(pub.get("certify_rate")), _ci(pub.get("power_at_gate_dose")),
                     "—" if margin is None else f"{margin:.2f}", f"{reading(pub)} ({pub.get('sizing_from', '—')})"])
    if not rows:
        return None
    return md_table(["system", "published n (source)", "engine nulls", "false leaks [CP 95 %]",
                     "at chance [CP 95 %]", "power at the gate dose [CP 95 %]", "certifiable margin pp",
                     "what n certifies (sizing values)"], rows, align="llllllrl")


def markdown(items: Sequence[Run], figure: Any) -> list[str]:
    md = ["## Verdicts calibrated against nulls (issue 31)", "", INTRO, ""]
    for run in items:
        md += [f"### {tagged(run.rel + ' · ' + str(run.data.get('model')), run.tags)}",
               "", run_md(run), ""]
        table = published_md(run)
        if table is not None:
            md += [PUBLISHED_INTRO, "", table, ""]
    return md


def summary(items: Sequence[Run]) -> list[str]:
    lines = []
    for run in items:
        for name, s in (run.data.get("systems") or {}).items():
            lines.append(f"  {name:<11} false leaks {_pct(s['false_leak_rate'])}, at chance {_pct(s['certify_rate'])}, "
                         f"power at {s['gate_dose_pp']:g} pp {_pct(s.get('power_at_gate_dose'))}")
    return lines

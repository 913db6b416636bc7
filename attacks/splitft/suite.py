"""The server's attacks on one split-FL run: label inference and the EIA inversion on the adversary view,
each repeated on the undefended crossings of the same steps (the positive control), scored against the
evaluator's truth (attacks/splitft/cell.py). Only the view reaches the attackers; the truth reaches the
scoring and the control views."""
from __future__ import annotations

from typing import Any

from attacks import controls
from attacks.splitft.cell import assess
from attacks.splitft.eia import eia
from attacks.splitft.label import infer_labels
from attacks.splitft.white_box import ServerCopy
from harness.adversary_view import AdversaryView, Exposure
from harness.splitft.step import SMASHED_DOWN, SMASHED_UP

ATTACKERS = ("label", "eia")


def plain_view(view: AdversaryView, truth: dict[int, dict[str, Any]]) -> AdversaryView:
    """The view with s'_A and s'_B replaced by the undefended s_A and s_B of the same step (the control)."""
    key = {SMASHED_UP: "s_a", SMASHED_DOWN: "s_b"}
    exposures = [Exposure(e.op, e.layer, e.step, e.shape, truth[e.step][key[e.channel]], e.channel)
                 if e.channel in key else e for e in view.exposures]
    return AdversaryView(exposures, view.meta)


def run_attacks(view: AdversaryView, truth: dict[int, dict[str, Any]], model_cfg: dict[str, Any],
                cache_dir: str | None, settings: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Flat metrics (label_*, eia_*, verdict) and one sample row per attacked example."""
    attacked = ServerCopy(view, model_cfg, cache_dir)
    control = ServerCopy(plain_view(view, truth), model_cfg, cache_dir)
    margin, positive = float(settings.gate_margin_pp), float(settings.positive_margin_pp)
    e = settings.eia

    def labels(guesses):
        return [truth[s]["ids"][r, 1:].tolist() for s, r, _ in guesses]

    def inputs(guesses):
        return [truth[s]["ids"][r].tolist() for s, r, _ in guesses]

    label_guess, label_plain = infer_labels(attacked), infer_labels(control)
    eia_guess = eia(attacked, int(e.steps), float(e.lr), int(e.max_examples))
    eia_plain = eia(control, int(e.steps), float(e.lr), int(e.max_examples))
    metrics = {
        **assess("label", labels(label_guess), [g for *_, g in label_guess], labels(label_plain),
                 [g for *_, g in label_plain], margin, positive),
        **assess("eia", inputs(eia_guess), [g for *_, g in eia_guess], inputs(eia_plain),
                 [g for *_, g in eia_plain], margin, positive),
        "gate_margin_pp": margin, "positive_margin_pp": positive,
    }
    metrics["verdict"] = controls.worst([metrics["label_verdict"], metrics["eia_verdict"]])
    strongest = max(ATTACKERS, key=lambda a: metrics[f"{a}_token_f1"] - metrics[f"{a}_reference_token_f1"])
    metrics["strongest_attacker"] = strongest
    rows = [{"attacker": "label", "step": s, "row": r, "guess_ids": g, "truth_ids": t}
            for (s, r, g), t in zip(label_guess, labels(label_guess))]
    rows += [{"attacker": "eia", "step": s, "row": r, "guess_ids": g, "truth_ids": t}
             for (s, r, g), t in zip(eia_guess, inputs(eia_guess))]
    return metrics, rows

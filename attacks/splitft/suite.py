"""The server's attacks on one split-FL run: label inference, the EIA inversion, BiSR (`attack.bisr.enabled`:
its backward attack on the gradients, BiSR(b), then its forward attack started from BiSR(b)'s label
guesses, or the label attack's when BiSR(b) is off), the label set read from the weight update
(`client_weights`; skipped with its reason, `weights_label_skipped`, where the head does not train or no
two consecutive steps of a client are recorded) and the learned inverter trained on public blocks
(`attack.inverter.enabled`) on the adversary view, each repeated on the undefended crossings of
the same steps (the positive control), scored against the evaluator's truth (attacks/splitft/cell.py).
Only the view (and the public blocks) reach the attackers; the truth reaches the scoring and the control
views.

`strongest_attacker` (the trade-off's leakage) is chosen among the per-example attackers only: the weights
attacker guesses one set of distinct tokens per step, not an example's sequence, so its F1 is on another
scale; it enters the run's `verdict` like the others."""
from __future__ import annotations

import functools
from typing import Any

from attacks import controls
from attacks.labels import constant_guesses, top1_floor
from attacks.splitft import cell, weights_label
from attacks.splitft.bisr import bisr_forward
from attacks.splitft.bisr_backward import bisr_backward, undefended_gradients
from attacks.splitft.eia import eia
from attacks.splitft.label import infer_labels
from attacks.splitft.white_box import ServerCopy
from harness.adversary_view import AdversaryView, Exposure
from harness.splitft.step import ALIGN_DOWN, ALIGN_UP, GRAD_UP, SMASHED_DOWN, SMASHED_UP
from metrics import roc


def plain_view(view: AdversaryView, truth: dict[int, dict[str, Any]]) -> AdversaryView:
    """The view with s'_A and s'_B replaced by the undefended s_A and s_B of the same step (the control)."""
    key = {SMASHED_UP: "s_a", SMASHED_DOWN: "s_b"}
    exposures = [Exposure(e.op, e.layer, e.step, e.shape, truth[e.step][key[e.channel]], e.channel)
                 if e.channel in key else e for e in view.exposures]
    return AdversaryView(exposures, view.meta)


def run_attacks(view: AdversaryView, truth: dict[int, dict[str, Any]], model_cfg: dict[str, Any],
                cache_dir: str | None, settings: Any,
                public: list[list[int]] | None = None
                ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Flat metrics (label_*, eia_*, bisr_*, weights_label_*, inverter_*, verdict), one sample row per
    attacked example, and the learned inverters' loss curves by name (`inverter`, and `inverter_negative` for
    its shuffled-pairs twin: {"train_history", "val_history"}, (step, loss) pairs; empty when the inverter is
    off), the W&B step history only. `public`: token blocks the server knows (D_align), the learned
    inverter's training data and the weights attacker's frequency prior."""
    attacked = ServerCopy(view, model_cfg, cache_dir)
    b = settings.bisr
    # BiSR(b) reads the gradient sent up at cut m; with A frozen (splitft.train_head=false) none was sent.
    backward_on = b.enabled and int(b.backward_steps) > 0 and bool(view.select(channel=GRAD_UP))
    control_view = plain_view(view, truth)
    if backward_on:   # the control's gradients: the undefended ones
        control_view = undefended_gradients(control_view, attacked, truth, int(b.max_examples))
    control = ServerCopy(control_view, model_cfg, cache_dir)
    margin, positive = float(settings.gate_margin_pp), float(settings.positive_margin_pp)
    bound = float(settings.per_item_bound_pp)
    # every attacker's at_chance reads the interval its examples earned at the configured bound (issue 51)
    assess = functools.partial(cell.assess, per_item_bound_pp=bound)

    e = settings.eia

    def labels(guesses):
        return [truth[s]["ids"][r, 1:].tolist() for s, r, _ in guesses]

    def inputs(guesses):
        return [truth[s]["ids"][r].tolist() for s, r, _ in guesses]

    label_guess, label_plain = infer_labels(attacked), infer_labels(control)
    eia_guess = eia(attacked, int(e.steps), float(e.lr), int(e.max_examples))
    eia_plain = eia(control, int(e.steps), float(e.lr), int(e.max_examples))
    attackers = ["label", "eia"]
    inv_guess: list = []
    curves: dict[str, dict[str, Any]] = {}
    v = settings.inverter
    if v.enabled:
        from attacks.splitft import inverter

        train_settings = inverter.settings_from(v, int(attacked.view.select(channel=SMASHED_UP)[0].tensor.shape[1]))
        learned, log = inverter.trained(attacked, public or [], train_settings)
        curves["inverter"] = {"train_history": log.train_history, "val_history": log.val_history}
        inv_guess = inverter.read(learned, attacked, int(v.max_examples))
        inv_plain = inverter.read(learned, control, int(v.max_examples))
        negative = None
        if v.negative_control:
            shuffled, log = inverter.trained(attacked, public or [], train_settings, shuffled=True)
            curves["inverter_negative"] = {"train_history": log.train_history, "val_history": log.val_history}
            negative = [g for *_, g in inverter.read(shuffled, attacked, int(v.max_examples))]
    bisr_guess: list = []
    bisr_b_guess: list = []
    bisr_b_rs_guess: list = []
    round_start_skipped = None
    if b.enabled:
        prior, prior_plain = label_guess, label_plain
        if backward_on:
            def backward(copy, weights="step"):
                return bisr_backward(copy, steps=int(b.backward_steps), lr=float(b.backward_lr),
                                     beta=float(b.backward_beta), temperature=float(b.backward_temperature),
                                     max_examples=int(b.max_examples), prior=bool(b.backward_prior),
                                     weights=weights)

            sources = [str(w) for w in b.backward_weights]
            if "step" in sources:
                bisr_b_guess, bisr_b_plain = backward(attacked), backward(control)
                attackers.append("bisr_b")
            if "round_start" in sources:
                starts = [attacked.round_start(e.step) for e in view.select(channel=GRAD_UP)]
                if None in starts:
                    round_start_skipped = ("the round-start weights of a recorded step are not in the view "
                                           "(splitft.record.steps_per_round < splitft.local_steps, or no "
                                           "local_steps in its meta)")
                else:
                    bisr_b_rs_guess = backward(attacked, "round_start")
                    bisr_b_rs_plain = backward(control, "round_start")
                    attackers.append("bisr_b_round_start")
                    if not bisr_b_guess:
                        bisr_b_guess, bisr_b_plain = bisr_b_rs_guess, bisr_b_rs_plain
            # BiSR's chain: the forward stage starts from the backward stage's labels where it has them
            prior = [*label_guess, *bisr_b_guess]
            prior_plain = [*label_plain, *bisr_b_plain]

        if str(b.init) == "sip":   # BiSR's first stage: the learned inverter's guess of the inputs
            prior, prior_plain = inv_guess, inv_plain

        def bisr(copy, guesses):
            return bisr_forward(copy, {(s, r): g for s, r, g in guesses}, steps=int(b.steps), lr=float(b.lr),
                                max_examples=int(b.max_examples), init=str(b.init), weights=str(b.weights))

        bisr_guess, bisr_plain = bisr(attacked, prior), bisr(control, prior_plain)
        attackers.append("bisr")
    metrics = {
        **assess("label", labels(label_guess), [g for *_, g in label_guess], labels(label_plain),
                 [g for *_, g in label_plain], margin, positive,
                 prior_guesses=constant_guesses(labels(label_guess)),
                 plain_prior_guesses=constant_guesses(labels(label_plain))),
        **assess("eia", inputs(eia_guess), [g for *_, g in eia_guess], inputs(eia_plain),
                 [g for *_, g in eia_plain], margin, positive),
        "gate_margin_pp": margin, "positive_margin_pp": positive, "per_item_bound_pp": bound,
    }
    metrics["label_top1_floor"] = top1_floor(labels(label_guess))
    # PrivPair's burst crossings (public D_align, every step of every recorded burst): recorded, but no
    # attacker here reads them yet (an adaptive inverter of W1 would); said rather than implied
    metrics["align_crossings_recorded"] = sum(e.channel in (ALIGN_UP, ALIGN_DOWN) for e in view.exposures)
    metrics["align_crossings_read"] = 0
    if "bisr_b" in attackers:
        metrics.update(assess("bisr_b", labels(bisr_b_guess), [g for *_, g in bisr_b_guess], labels(bisr_b_plain),
                              [g for *_, g in bisr_b_plain], margin, positive))
    if "bisr_b_round_start" in attackers:
        metrics.update(assess("bisr_b_round_start", labels(bisr_b_rs_guess), [g for *_, g in bisr_b_rs_guess],
                              labels(bisr_b_rs_plain), [g for *_, g in bisr_b_rs_plain], margin, positive))
    elif round_start_skipped:
        metrics["bisr_b_round_start_skipped"] = round_start_skipped
    if bisr_guess:
        metrics.update(assess("bisr", inputs(bisr_guess), [g for *_, g in bisr_guess], inputs(bisr_plain),
                              [g for *_, g in bisr_plain], margin, positive))
    if inv_guess:
        metrics.update(assess("inverter", inputs(inv_guess), [g for *_, g in inv_guess], inputs(inv_plain),
                              [g for *_, g in inv_plain], margin, positive, negative_guesses=negative))
        attackers.append("inverter")
    strongest = max(attackers, key=lambda a: metrics[f"{a}_token_f1"] - metrics[f"{a}_reference_token_f1"])
    wl_guess: list = []
    sets: list[list[int]] = []   # the truth of each weights pair: step s's distinct label tokens
    metrics["weights_label_skipped"] = weights_label.why_not(attacked)
    if metrics["weights_label_skipped"] is None:
        wl_guess = weights_label.infer_label_sets(attacked)
        wl_plain = weights_label.infer_label_sets(attacked, weights_label.undefended_updates(attacked, truth))
        sets = [weights_label.label_set(truth[s]["ids"]) for s, _ in wl_guess]

        def prior(guesses):
            return [weights_label.frequency_prior(public or [], len(g)) for _, g in guesses]

        metrics.update(assess("weights_label", sets, [g for _, g in wl_guess], sets, [g for _, g in wl_plain],
                              margin, positive, kind="set", prior_guesses=prior(wl_guess),
                              plain_prior_guesses=prior(wl_plain)))
        metrics["weights_label_n_predicted"] = sum(len(g) for _, g in wl_guess) / len(wl_guess)
        metrics["weights_label_n_labels"] = sum(len(t) for t in sets) / len(sets)
        attackers.append("weights_label")
    metrics["verdict"] = controls.worst([metrics[f"{a}_verdict"] for a in attackers])
    metrics["strongest_attacker"] = strongest
    rows = [{"attacker": name, "step": s, "row": r, "guess_ids": g, "truth_ids": t}
            for name, guesses in (("label", label_guess), ("bisr_b", bisr_b_guess),
                                  ("bisr_b_round_start", bisr_b_rs_guess))
            for (s, r, g), t in zip(guesses, labels(guesses))]
    rows += [{"attacker": name, "step": s, "row": r, "guess_ids": g, "truth_ids": t}
             for name, guesses in (("eia", eia_guess), ("bisr", bisr_guess), ("inverter", inv_guess))
             for (s, r, g), t in zip(guesses, inputs(guesses))]
    rows += [{"attacker": "weights_label", "step": s, "row": None, "guess_ids": g, "truth_ids": t}  # a batch, no row
             for (s, g), t in zip(wl_guess, sets)]
    # each attacker's per-example F1 as a test (results.json `roc`: cell.tests(rows)); unprefixed: the strongest's
    roc_tests = cell.tests(rows)
    for name, record in roc_tests.items():
        metrics.update(roc.flat(record, f"{name}_"))
    if strongest in roc_tests:
        metrics.update(roc.flat(roc_tests[strongest]))
    return metrics, rows, curves

"""Split federated fine-tuning runner (paper 002): N clients fine-tune A and C of a causal LM split
A | B | C around a frozen server-side B, FedAvg rounds on Flower's simulation runtime, under one defence
(the configuration) at one strength (`epsilon`); then the server's attacks on what it saw.

results.json `metrics`: the final model's held-out utility (heldout_ce, heldout_ppl, heldout_top1 with
95% intervals over blocks, the pretrained model's initial_heldout_ce, and heldout_ce_gain: what the
fine-tuning removed, paired over the same blocks), H and H_A of the last round
(every round under `rounds`), the label-inference attack (label_top1, label_token_f1) and the EIA
inversion (eia_token_f1, eia_top1), BiSR's backward attack on the gradients (bisr_b_token_f1, bisr_b_top1:
labels), its forward attack (bisr_token_f1, bisr_top1) and the label set read from the clients' weight
updates (weights_label_token_f1 with precision and recall, or weights_label_skipped: why not), each with its
reference, positive control and verdict, and the run's `verdict` (the worst of them); `grad_up`, the guard
on the gradient sent up (`splitft.grad_up`, or null); for the DP
baselines, ε(δ) composed over the run (dp_epsilon_example, dp_epsilon_row; `privacy_accounting` has the
record). splitft_central is the centralised reference: utility only.

    splitbench experiment=splitft_smoke
    splitbench -m experiment=splitft configuration=privpair epsilon=0.1,1,10
"""
from __future__ import annotations

import tempfile
import time
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import configurations, run_identity
from harness.results import RunContext
from harness.splitft.config import grad_guard, tradeoff_setting, variant_label  # torch-free
from runners import common

describe_skip = common.epsilon_ignored_note


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """Everything but the SpliTEE-only sections; ε normalised (only the defences with a knob use it).
    `splitft.runtime: simulation` stays out (harness/systems.py: the runner's `unhashed`)."""
    return run_identity.semantic_config(cfg, epsilon=configurations.effective_epsilon(cfg.configuration.name,
                                                                                  cfg.epsilon))


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    from attacks.splitft.cell import tests as repaired_tests
    from attacks.splitft.suite import run_attacks
    from harness.models import load_model
    from harness.partition import Partition
    from harness.splitft import experiment
    from harness.splitft.client import Recipe
    from harness.splitft.data import load_split_data

    s = cfg.splitft
    configuration = cfg.configuration.name
    epsilon = configurations.effective_epsilon(configuration, cfg.epsilon)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    # The runner's own copy only checks the cut, tokenizes and bounds the embedding norms: the CPU in float32
    # serves; the clients and the server load theirs as splitft.placement says (harness/splitft/client.py).
    loaded = load_model(model_cfg, cache_dir=cfg.paths.cache_dir)
    Partition(loaded.model, int(s.k), int(s.m))   # m <= L: a one-line error before any data is read
    data = load_split_data(s.data, loaded.tokenizer, int(s.n_clients), int(cfg.seed))
    section = OmegaConf.to_container(s, resolve=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="splitft-truth-") as truth_dir:
        recipe = Recipe(model_cfg, cfg.paths.cache_dir, configuration, epsilon, section, int(cfg.seed),
                        data.clients, data.align, data.heldout, truth_dir)
        training = experiment.train(recipe)
        trained = time.perf_counter()
        accounting = experiment.accounting(section, configuration, epsilon, training.rounds[-1], loaded.model)
        metrics = experiment.metrics(training, accounting)
        view, rows, curves = None, [], {}
        if configuration != experiment.CENTRAL:
            view = experiment.build_view(cfg, training, section)
            attack, rows, curves = run_attacks(view, experiment.load_truth(truth_dir), model_cfg, cfg.paths.cache_dir,
                                       s.attack, public=data.align)
            metrics.update(attack)
    timings = {"train_seconds": trained - started, "attack_seconds": time.perf_counter() - trained}
    results = {
        **common.results_header(cfg, "splitft", model=loaded, workload=f"splitft:{s.data.source}",
                                workload_info=data.record(), n_prompts=len(data.heldout), generation=False),
        "system": configurations.SPLITFT,
        "configuration": configuration,
        "epsilon": epsilon,
        "privacy_parameter": configurations.privacy_parameter(configuration, epsilon),
        "metrics": metrics,
        "privacy_accounting": accounting,
        "rounds": training.rounds,
        "initial": training.initial,
        # per held-out block, so a report can pair two runs on the same blocks (runners/report/splitft.py)
        "heldout_blocks_ce": {"initial": training.initial_scores["ce"], "final": training.final_scores["ce"]},
        "heldout_blocks_top1": {"initial": training.initial_scores["top1"], "final": training.final_scores["top1"]},
        "runtime": training.runtime,
        "split": {"k": int(s.k), "m": int(s.m), "n_layers": len(loaded.model.model.layers),
                  "n_clients": int(s.n_clients), "lora": bool(s.lora.enabled), "train_head": bool(s.train_head)},
        "grad_up": grad_guard(section),   # the guard on the gradient sent up, or None
        "view_channels": list(view.channels()) if view is not None else [],
        "roc": repaired_tests(rows),      # each attacker's per-example F1 as a test (attacks/splitft/cell.py)
        "timings": timings,
        "metric_definitions": DEFINITIONS,
    }
    results["tradeoff"] = _tradeoff(metrics, configuration, variant_label(results["grad_up"], bool(s.train_head)),
                                    tradeoff_setting(results["workload"], results["split"]))
    samples = [_sample(row, loaded.tokenizer) for row in rows]
    return common.finish(cfg, ctx, results, samples, summary=summary,
                         before_done=_view_writer(cfg, view, ctx), placement=_placement(s.placement),
                         mirror_history=mirror_history(training.rounds, curves))


def mirror_history(rounds: list[dict[str, Any]], curves: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The W&B step history: one step per FedAvg round (its record under results.json `rounds`), then the
    learned inverters' training losses (`inverter/train_loss`, `inverter/val_loss`, and `inverter_negative/…`
    for the shuffled-pairs control; common.loss_history) at steps after the last round, since W&B has one
    step axis and it only increases. Each loss record also holds its own training step as
    `attack_train_step`, the x-axis to chart those losses against."""
    history = [{**r, "step": int(r["round"])} for r in rounds]
    start = history[-1]["step"] + 1 if history else 0
    return history + [{**record, "step": start + record["step"], "attack_train_step": record["step"]}
                      for record in common.loss_history(curves)]


def _placement(node: DictConfig) -> dict[str, Any]:
    """Where the clients' and the server's model ran (as splitft.placement says; the attacks' white-box copy is
    float32 on the CPU, attacks/splitft/white_box.py)."""
    from harness.devices import describe_device, resolve_device

    return {"model": {"device": describe_device(resolve_device("splitft.placement.device", str(node.device))),
                      "dtype": str(node.dtype), "device_map": None},
            "attack_copy": {"device": describe_device(resolve_device("cpu", "cpu")), "dtype": "float32",
                            "device_map": None}}


def _sample(row: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    return {"id": f"{row['attacker']}:{row['step']}:{row['row']}", **row, "output_ids": row["guess_ids"],
            "output_text": tokenizer.decode(row["guess_ids"]), "truth_text": tokenizer.decode(row["truth_ids"])}


def _view_writer(cfg: DictConfig, view: Any, ctx: RunContext):
    if view is None or not cfg.splitft.save_view:
        return None
    return lambda: view.save(ctx.run_dir.path / "view.pt")


def _tradeoff(m: dict[str, Any], configuration: str, point: str | None, setting: str) -> dict[str, Any]:
    """Leakage: the strongest attacker's token F1 (its reference as the floor); utility: held-out top-1."""
    utility = dict(utility_metric="heldout_top1", utility=m["heldout_top1"],
                   utility_ci=(m["heldout_top1_ci_lo"], m["heldout_top1_ci_hi"]), reference="held-out next tokens",
                   point=point, setting=setting)
    a = m.get("strongest_attacker")
    if a is None:
        return common.tradeoff(**utility)
    return common.tradeoff(leakage_metric=f"{a}_token_f1", leakage=m[f"{a}_token_f1"],
                           leakage_ci=(m[f"{a}_token_f1_ci_lo"], m[f"{a}_token_f1_ci_hi"]),
                           attacker=f"splitft_{a}", leakage_floor=m[f"{a}_reference_token_f1"], **utility)


DEFINITIONS = {
    "<attacker>_auc": "the attacker's per-example token F1 as a test (attacks/splitft/cell.py repaired_test, "
                      "results.json roc.<attacker>): each guess against its own example's truth (positives) and "
                      "against the next example's (re-paired, negatives); ROC AUC with DeLong's 95% interval; "
                      "<attacker>_tpr_at_fpr: TPR (%) keyed by the FPR in %, Clopper-Pearson, null below 1/n; "
                      "unprefixed auc, tpr_at_fpr: strongest_attacker's",
    "heldout_ce": "mean over held-out blocks of the mean next-token cross-entropy (nats) of the final model "
                  "f = C∘B∘A (no adapters), bootstrap 95% CI over blocks; heldout_ppl = exp(heldout_ce)",
    "heldout_ce_gain": "mean over held-out blocks of the pretrained model's CE minus the final model's (nats), "
                       "bootstrap 95% CI of that paired difference; per-block values under results.json "
                       "heldout_blocks_ce",
    "heldout_top1": "% of held-out next tokens the final model ranks first, mean over blocks; per-block values "
                    "(% of a block's seq_len − 1 next tokens ranked first) under results.json heldout_blocks_top1",
    "H": "E‖ŝ_B − s_B‖² at the last local step of the last round (per token vector, mean over tokens, mean "
         "over clients weighted by their blocks); s_B = B(s_A) undefended, ŝ_B what C received",
    "H_recv": "E‖s'_B − s_B‖² likewise: what C would get from the server's output without a recovery; beside "
              "H it tells whether PrivPair's W2 helps (H < H_recv) or hurts (H > H_recv); _rel: over E‖s_B‖²",
    "H_A": "E‖s'_A − s_A‖² likewise: what crossed at cut k against the undefended s_A; _rel: divided by "
           "E‖s_B‖² (E‖s_A‖²)",
    "label_top1": "% of label positions (next tokens) of the recorded examples where argmax C(s'_B), with the "
                  "client's C of that step (known to the server: its weights after the previous step), is the label",
    "label_top1_floor": "% of the same label positions the constant guess (the most frequent token of these "
                        "labels, at every position) gets right, averaged over examples as label_top1",
    "label_token_f1": "multiset token F1 of that decoded sequence against the labels, macro over examples; its "
                      "verdict's reference is the larger of the exposure-free reference and the constant guess's "
                      "F1 (label_prior_token_f1)",
    "eia_token_f1": "multiset token F1 of the EIA inversion of s'_A (nearest vocabulary embeddings) against "
                    "the input tokens, macro over examples",
    "inverter_token_f1": "multiset token F1 of the learned inverter (attacks/inversion.py, trained on D_align "
                         "through the white-box A) on s'_A against the input tokens; its negative control is "
                         "the same inverter trained on shuffled pairs",
    "bisr_b_token_f1": "multiset token F1 of BiSR's backward attack (soft labels matched to the intercepted "
                       "∂L/∂s'_B through the client's C) against the labels, macro over examples; bisr_b_top1 "
                       "position-wise, as label_top1",
    "bisr_token_f1": "multiset token F1 of BiSR's forward attack (BiSR(b)'s label guesses, or the label attack's "
                     "without it, shifted by one and refined by matching s'_A in cosine through A) against the "
                     "input tokens, macro over examples",
    "weights_label_token_f1": "token F1 of the label set read from a client's weight update between two "
                              "consecutive recorded steps of one round (LM head rows anti-aligned with the "
                              "median row; attacks/splitft/weights_label.py) against the distinct label tokens "
                              "of the first step's batch, macro over step pairs (set F1: guess and truth hold "
                              "distinct tokens); _token_precision/_token_recall likewise; reference: the larger of "
                              "another pair's guess (_exposure_free_) and as many of the public blocks' most "
                              "frequent tokens (_prior_); weights_label_skipped: why it did not run (a frozen head, "
                              "fewer than 2 pairs), else null",
    "grad_up": "results.json `grad_up`: the guard on ∂L/∂s'_B before it went up (per-token ℓ2 clip, then "
               "N(0, (noise_multiplier·clip)²)), or null; BiSR(b) clips its predicted gradient the same way",
    "dp_epsilon_example": "smashed-data DP baselines: ε(δ = dp_delta) of one client's training block composed "
                          "over every time it went up in the run (privacy_accounting; harness/splitft/"
                          "accounting.py); dp_epsilon_row: the same for one clipped token row of s_A; "
                          "dp_epsilon_step: the per-exposure ε the noise was calibrated for. Covers s'_A only",
    "*_reference_token_f1": "the attacker's guesses for example j scored against example i != j (what it "
                            "scores without the right exposure); the verdict's reference",
    "*_positive_control_token_f1": "the same attacker on the undefended s_A / s_B of the same steps; _pass: "
                                   "lower CI bound >= its reference + positive_margin_pp",
    "*_verdict": "leak | at_chance | inconclusive by attacks/controls.classify against the reference",
    "verdict": "the worst of label_verdict, eia_verdict and (when they ran) bisr_b_verdict, bisr_verdict, "
               "inverter_verdict",
}


def summary(results: dict[str, Any]) -> str:
    m = results["metrics"]
    head = common.summary_head(results, f"{results['split']['n_clients']} clients",
                               f"k={results['split']['k']} m={results['split']['m']}")
    lines = [head, *common.metric_lines(m, ("heldout_ce", "heldout_ppl", "heldout_top1", "label_top1", "label_top1_floor",
                                            "label_token_f1", "bisr_b_token_f1", "bisr_b_top1", "eia_token_f1",
                                            "eia_top1", "bisr_token_f1",
                                            "bisr_top1", "inverter_token_f1", "dp_epsilon_step", "dp_epsilon_row",
                                            "dp_epsilon_example"), width=20)]
    lines.append(f"  H = {m['H']:.4g}, H_A = {m['H_A']:.4g} (last round); initial held-out CE "
                 f"{m['initial_heldout_ce']:.3f}")
    if m.get("verdict"):
        bisr = "".join(f", {a} {m[f'{a}_verdict']}" for a in ("bisr_b", "bisr_b_round_start", "bisr", "inverter") if m.get(f"{a}_verdict"))
        lines.append(f"  verdict: {m['verdict']} (label {m['label_verdict']}, eia {m['eia_verdict']}{bisr})")
    return "\n".join(lines)

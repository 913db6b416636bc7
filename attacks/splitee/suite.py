"""One cell of Table 6 (paper §7.4): an attacker setting × component at one configuration and ε, with the
controls that make it mean something, the Bayes-optimal token attacker, and what results.json reports.

Settings (`attack.setting`): `noise_free` attacks the unmasked inputs of the `plain` configuration (t3)
with an attacker trained on them; `noise_oblivious` attacks masked inputs (ep1, epn, slalom) with that same
noise-free attacker; `noise_aware` with one trained on masked captures of the same configuration and ε.
Controls (attacks/controls.py): the component's noise-free attacker on t3 (positive) and that attacker
trained on shuffled pairs, on t3 (negative). Everything expensive is cached by attacks/splitee/pipeline.py.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attacks import controls
from attacks.corpus import load_corpus
from attacks.inversion import TrainSettings
from attacks.splitee.capture import ATTACKABLE, BAYES_MODELLED, UNMASKED, Capture, check_component
from attacks.splitee.pipeline import Pipeline, Store
from harness import configurations, provenance
from harness.errors import UserError

NOISE_FREE = "noise_free"
NOISE_OBLIVIOUS = "noise_oblivious"


def _either(names: Sequence[str], word: str) -> str:
    return f"{', '.join(names[:-1])} {word} {names[-1]}" if len(names) > 1 else names[0]


def check_setting(configuration: str, setting: str) -> None:
    """noise_free attacks unmasked inputs (t3); the other settings attack masked ones (ep1, epn, slalom)."""
    if configuration not in ATTACKABLE:
        raise UserError(f"the attack runner handles configurations {_either(ATTACKABLE, 'and')}, "
                        f"got {configuration!r}")
    masked = _either([n for n in ATTACKABLE if n != UNMASKED], "or")
    if setting == NOISE_FREE and configuration != UNMASKED:
        raise UserError(f"attack.setting=noise_free attacks unmasked inputs: use configuration={UNMASKED} "
                        f"(got {configuration}); for masked inputs use noise_oblivious or noise_aware")
    if setting != NOISE_FREE and configuration == UNMASKED:
        raise UserError(f"attack.setting={setting} needs masked inputs (configuration={masked}); {UNMASKED} has "
                        "no noise, so its attack is attack.setting=noise_free")


def check_decoder(victim: Any, decoder: Any) -> None:
    """The decoder reads and writes the victim's token ids (the inverter embeds the prompt's ids with the
    decoder's embeddings and its outputs are scored as victim ids), so both tokenizers must map the same
    tokens to the same ids. A decoder with another vocabulary would reinterpret every id silently: refused
    before any work. Compares the vocabulary size and the whole token → id map (added tokens included)."""
    if decoder is victim:
        return
    theirs, ours = decoder.tokenizer, victim.tokenizer
    what = f"attack.decoder {decoder.name} does not share the tokenizer of the victim {victim.name}"
    if len(theirs) != len(ours):
        raise UserError(f"{what}: {len(theirs)} tokens against {len(ours)}; the attacker's decoder must use "
                        "the victim's token ids (choose a decoder of the same model family)")
    a, b = ours.get_vocab(), theirs.get_vocab()
    if a != b:
        token = next(t for t in sorted(a.keys() | b.keys()) if a.get(t) != b.get(t))
        raise UserError(f"{what}: token {token!r} is id {a.get(token)} for the victim and {b.get(token)} for "
                        "the decoder; the attacker's decoder must use the victim's token ids")
    rows = decoder.model.get_input_embeddings().weight.shape[0]
    if rows < len(ours):
        raise UserError(f"attack.decoder {decoder.name} has {rows} embedding rows, fewer than the victim's "
                        f"{len(ours)} token ids")


def pipeline(victim: Any, decoder: Any, prompts: list[list[int]], attack: Mapping[str, Any],
             engine: Mapping[str, Any], *, seed: int, cache_dir: str | Path, workload: str | None,
             eval_epsilon_lengths: list[int] | None = None,
             victim_config: dict | None, decoder_config: dict | None, log: Callable[[str], None]) -> Pipeline:
    """The run's Pipeline from the plain `attack` and `engine` config sections: the corpus, the validated
    training settings, and the cache under cache_dir/attacks keyed on the code of harness/, metrics/ and
    attacks/."""
    corpus = load_corpus(attack["corpus"], victim.tokenizer, seed)
    settings = TrainSettings(**{k: v for k, v in attack["train"].items() if k != "threads"}, seed=seed)
    try:
        settings.validate()
    except ValueError as exc:
        raise UserError(f"attack.train: {exc}") from None
    return Pipeline(victim=victim, decoder=decoder, eval_prompts=prompts, corpus=corpus,
                    corpus_record={**attack["corpus"], "provenance": corpus.source, "seed": seed},
                    store=Store(cache_dir), seed=seed, train_settings=settings, offload=tuple(engine["offload"]),
                    sigma_scale=float(engine["sigma_scale"]), sensitivity_rule=engine["sensitivity_rule"],
                    slalom_frac_bits=int(engine["slalom_frac_bits"]), slalom_scaling=str(engine["slalom_scaling"]),
                    capture_batch_size=attack["capture"]["batch_size"],
                    capture_max_new_tokens=attack["capture"]["max_new_tokens"],
                    code=provenance.source_digest(dirs=("harness", "metrics", "attacks")), log=log,
                    victim_config=victim_config, decoder_config=decoder_config, workload=workload,
                    eval_epsilon_lengths=eval_epsilon_lengths)


@dataclass
class Cell:
    """What one attack run measured."""

    configuration: str
    setting: str
    component: str
    layer: int
    floor: float
    trained_under: dict[str, Any]         # the attacker's training configuration and ε
    attacker: dict[str, Any]              # its record (key, cache hit, training log)
    capture: Capture                      # the evaluation prompts as the device saw them
    reconstructions: list[list[int]]
    scores: controls.Scores
    margin: float                         # the gate margin, percentage points
    positive: controls.ControlResult
    positive_key: str
    negative: controls.ControlResult
    negative_key: str
    verdict: dict[str, Any]
    bayes: dict[str, Any] | None
    bayes_metrics: dict[str, Any]

    def metrics(self, privacy: Mapping[str, Any]) -> dict[str, Any]:
        """results.json `metrics`, with the accounting's flat `privacy` keys (harness.splitee.accounting)."""
        m: dict[str, Any] = {"chance_floor_token_f1": self.floor, **self.scores.metrics, **self.verdict,
                             "gate_margin_pp": self.margin}
        m.update(self.positive.f1.flat("positive_control_token_f1"))
        m["positive_control_pass"] = self.positive.passed
        m.update(self.negative.f1.flat("negative_control_token_f1"))
        m["negative_control_pass"] = self.negative.passed
        m.update(self.bayes_metrics)
        m["verdict"] = controls.worst([self.verdict["attack_verdict"], self.bayes_metrics.get("bayes_verdict")])
        m.update(privacy)
        training = self.attacker.get("training") or {}
        m["train_steps"] = training.get("steps")
        m["train_minutes"] = (training.get("seconds") or 0.0) / 60.0 if training else None
        m["train_best_val_loss"] = training.get("best_val_loss")
        eps = self.capture.epsilons
        m["epsilon_mean"] = (sum(e for e in eps if e is not None) / len(eps)
                             if configurations.get(self.configuration).gaussian else None)
        return m

    def sections(self, pipe: Pipeline, attack: Mapping[str, Any]) -> dict[str, Any]:
        """results.json `attack`, `controls`, `training` and `bayes`."""
        return {
            "attack": {"setting": self.setting, "component": self.component, "layer": self.layer,
                       "trained_under": self.trained_under, "train": attack["train"],
                       "corpus": {**pipe.corpus_record, "n_stream_tokens": pipe.corpus.n_stream_tokens},
                       "capture": attack["capture"]},
            "controls": {"chance_floor_token_f1": self.floor,
                         "positive": {"attacker": self.positive_key, "passed": self.positive.passed},
                         "negative": {"attacker": self.negative_key, "passed": self.negative.passed}},
            "training": {"attacker": {k: v for k, v in self.attacker.items() if k != "state"},
                         "positive_control": self.positive_key, "negative_control": self.negative_key},
            "bayes": None if self.bayes is None else {k: v for k, v in self.bayes.items()
                                                      if k not in ("top1", "topk", "guesses")},
        }

    def samples(self, prompts: Sequence[Any]) -> list[dict[str, Any]]:
        """samples.jsonl: one row per evaluation prompt (harness.workloads.Prompt)."""
        rows = []
        for i, prompt in enumerate(prompts):
            row = {"id": prompt.id, "prompt": prompt.text, "prompt_ids": list(prompt.input_ids),
                   "n_prompt_tokens": len(prompt.input_ids), "epsilon": self.capture.epsilons[i],
                   "output_ids": self.reconstructions[i], **self.scores.rows[i]}
            if self.bayes is not None:
                row.update({"bayes_top1": self.bayes["top1"][i], "bayes_top5": self.bayes["topk"][i],
                            "bayes_output_ids": self.bayes["guesses"][i]})
            rows.append(row)
        return rows

    def notes(self) -> list[str]:
        notes = []
        if self.component == "lm_head":
            notes.append("the LM head exposes only the positions whose logits are computed (the last prompt position "
                         "at prefill, then one per decode step), not every position")
        why = [n for n, c in (("positive", self.positive), ("negative", self.negative)) if not c.passed]
        if why:
            notes.append(f"the learned attacker's {' and '.join(why)} control failed: its verdict cannot be "
                         f"at_chance{'' if self.negative.passed else ' nor leak'}")
        f1 = self.scores.f1
        if f1.hi < self.floor - self.margin:
            notes.append(f"the learned attacker scores below the chance floor ({f1.mean:.2f} against "
                         f"{self.floor:.2f}): it failed, which says nothing about the masks (inconclusive)")
        if self.configuration not in BAYES_MODELLED:
            notes.append(f"the Bayes attacker models no mask or a Gaussian one, not {self.configuration}'s: it was not "
                         "run, so the verdict is the learned attacker's alone")
        if self.bayes_metrics and not self.bayes_metrics["bayes_positive_control_pass"]:
            notes.append("the Bayes attacker's positive control (t3) failed: its verdict cannot be at_chance")
        return notes


def attack_cell(pipe: Pipeline, configuration: str, epsilon: float | None, attack: Mapping[str, Any], *,
                semantic_model: Any = None) -> Cell:
    """Run the cell `attack` (the plain attack config section: setting, component, layer, bayes, controls)
    names under `configuration` at ε: the attack, both controls, the verdict, and the Bayes attacker on
    layer-0 QKV when it is enabled, QKV is offloaded and it models the configuration's mask (none or Gaussian,
    BAYES_MODELLED: Slalom's residues are read by the learned attackers only)."""
    setting, component, layer = attack["setting"], attack["component"], attack["layer"]
    prompts = pipe.eval_prompts
    check_component(component, layer, pipe.offload, len(pipe.victim.model.model.layers))
    decode = lambda ids: pipe.victim.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    floor = controls.floor(prompts)

    # The attack itself.
    train_conf, train_eps = ((UNMASKED, None) if setting in (NOISE_FREE, NOISE_OBLIVIOUS)
                             else (configuration, epsilon))
    inverter, attacker = pipe.attacker(train_conf, train_eps, component, layer)
    cap = pipe.eval_capture(configuration, epsilon, component, layer)
    recon = pipe.reconstruct(inverter, attacker["key"], cap, component)
    scores = controls.score(prompts, recon, decode, semantic_model=semantic_model)

    # Controls: the noise-free attacker on t3 (positive), the shuffled-pairs attacker on t3 (negative).
    clean_cap = cap if configuration == UNMASKED else pipe.eval_capture(UNMASKED, None, component, layer)
    if setting == NOISE_FREE:
        positive_f1, positive_key = scores.f1, attacker["key"]
    else:
        clean, clean_rec = pipe.attacker(UNMASKED, None, component, layer)
        positive_f1 = controls.score(prompts, pipe.reconstruct(clean, clean_rec["key"], clean_cap, component),
                                     decode, text_metrics=False).f1
        positive_key = clean_rec["key"]
    shuffled, shuffled_rec = pipe.attacker(UNMASKED, None, component, layer, shuffled=True)
    negative_f1 = controls.score(prompts, pipe.reconstruct(shuffled, shuffled_rec["key"], clean_cap, component),
                                 decode, text_metrics=False).f1
    checks = attack["controls"]
    margin = float(checks["gate_margin_pp"])
    bound = float(checks["per_item_bound_pp"])
    positive = controls.positive_control(positive_f1, floor, float(checks["positive_margin_pp"]))
    negative = controls.negative_control(negative_f1, floor, margin)

    # The Bayes-optimal token attacker on layer-0 QKV, and its positive control: the same attacker on t3.
    b = attack["bayes"]
    bayes_out, bayes_metrics = None, {}
    if b["enabled"] and "qkv" in pipe.offload and configuration in BAYES_MODELLED:
        run_bayes = lambda conf, eps, ks: pipe.bayes(conf, eps, ks, b["top_k"], b["prior"],  # noqa: E731
                                                     b["rows_per_chunk"], b["vocab_per_chunk"])
        bayes_out = run_bayes(configuration, epsilon, list(b["k"]))
        clean_bayes = bayes_out if configuration == UNMASKED else run_bayes(UNMASKED, None, [1])
        bayes_metrics = _bayes_metrics(bayes_out, clean_bayes, prompts, margin, float(checks["positive_margin_pp"]),
                                       bound)
    f1_values = [row["token_f1"] for row in scores.rows]
    earned = controls.earned(f1_values, floor, scores.f1.lo, scores.f1.hi, bound)

    return Cell(configuration=configuration, setting=setting, component=component, layer=layer, floor=floor,
                trained_under={"configuration": train_conf, "epsilon": train_eps}, attacker=attacker, capture=cap,
                reconstructions=recon, scores=scores, margin=margin, positive=positive, positive_key=positive_key,
                negative=negative, negative_key=shuffled_rec["key"],
                verdict={**controls.verdict(scores.f1, floor, margin, positive, negative, certify=earned),
                         **controls.earned_flat("token_f1", earned, bound)},
                bayes=bayes_out, bayes_metrics=bayes_metrics)


def _bayes_metrics(out: dict, clean: dict, prompts: list[list[int]], margin: float,
                   positive_margin: float, per_item_bound_pp: float = 100.0) -> dict[str, Any]:
    """The Bayes attacker's results.json keys, with its verdict (attacks/controls.py: `classify` against
    the token F1 of its own guesses for the other prompts, positive control on t3; at_chance on the interval
    the prompts earned at `per_item_bound_pp`)."""
    from metrics.proportions import proportion_ci

    m: dict[str, Any] = {}
    m.update(proportion_ci(out["top1"]).flat("bayes_top1"))
    m.update(proportion_ci(out["topk"]).flat(f"bayes_top{out['top_k']}"))
    scored = controls.score(prompts, out["guesses"], None, text_metrics=False)
    f1 = scored.f1
    m.update(f1.flat("bayes_token_f1"))
    reference = controls.exposure_free_f1(prompts, out["guesses"])
    earned = controls.earned([row["token_f1"] for row in scored.rows], reference, f1.lo, f1.hi, per_item_bound_pp)
    m.update(controls.earned_flat("bayes_token_f1", earned, per_item_bound_pp))
    m["bayes_token_f1_chance"] = reference
    clean_f1 = f1 if clean is out else controls.score(prompts, clean["guesses"], None, text_metrics=False).f1
    clean_reference = reference if clean is out else controls.exposure_free_f1(prompts, clean["guesses"])
    m.update(clean_f1.flat("bayes_positive_control_token_f1"))
    m["bayes_positive_control_pass"] = bool(clean_f1.lo >= clean_reference + positive_margin)
    m["bayes_verdict"] = controls.classify(f1.lo, f1.hi, reference, margin,
                                           positive_passed=m["bayes_positive_control_pass"], negative_passed=True,
                                           certify=earned)
    m["bayes_gate"] = m["bayes_verdict"] == controls.AT_CHANCE
    m["bayes_top1_chance"] = out["chance_top1"]
    m["bayes_sigma_mean"] = out["sigma_mean"]
    for point in out["k_curve"]:
        k = point["k"]
        m[f"bayes_top1_k{k}"] = point["top1"]
        m[f"bayes_top1_k{k}_ci_lo"] = point["top1_ci_lo"]
        m[f"bayes_top1_k{k}_ci_hi"] = point["top1_ci_hi"]
        if "top1_predicted" in point:
            m[f"bayes_top1_k{k}_predicted"] = point["top1_predicted"]
    m["bayes_leak_k"] = controls.repeat_leak_k({**m, "gate_margin_pp": margin})
    return m

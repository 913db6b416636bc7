"""A restored reconstruction as another attacker of the same configuration (paper §7.4.4, Table 7).

Each attacker's raw reconstructions of a finished attack run are restored with an instruct model
(harness/splitee/restoration.py) and scored against the prompts with the attack's own metrics
(attacks/controls.py `score`), beside the raw ones; the restored text gets its own no-signal floor, the
token F1 of restorations made for the *other* prompts (attacks/controls.exposure_free_f1: a fluent restorer
writes generic words that match any prompt a little), and a verdict against that floor with the source
run's controls.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Which samples.jsonl field holds each attacker's reconstruction (attacks/splitee/suite.py `samples`).
RECONSTRUCTION_FIELDS = {"learned": "output_ids", "bayes": "bayes_output_ids"}
HEADLINE = ("token_precision", "token_recall", "token_f1", "exact_match", "bleu", "rouge_l", "semantic_similarity")
STAGES = ("raw", "restored")


@dataclass
class Restored:
    """What restoring one source run's reconstructions measured."""

    attackers: dict[str, dict[str, Any]]          # per attacker: raw and restored metrics, Δ token F1, floor, verdict
    texts: dict[str, list[str]]                   # per attacker: the restored texts, in prompt order
    rows: dict[str, list[dict[str, Any]]]         # per attacker: each prompt's raw and restored scores
    notes: list[str]

    def metrics(self, source_verdict: str | None) -> dict[str, Any]:
        """results.json `metrics`: each attacker's headline raw and restored, its change, floor and verdict, and
        `verdict`: the worst of the source attack's and the restored ones."""
        from attacks import controls

        out = {f"{a}_{stage}_{k}": v[stage].get(k) for a, v in self.attackers.items() for stage in STAGES
               for k in HEADLINE}
        out.update({f"{a}_{k}": v[k] for a, v in self.attackers.items()
                    for k in ("delta_token_f1", "delta_token_f1_ci_lo", "delta_token_f1_ci_hi",
                              "restored_floor_token_f1", "restored_verdict")})
        verdict = controls.worst([source_verdict, *[a["restored_verdict"] for a in self.attackers.values()]])
        out.update({"source_verdict": source_verdict, "verdict": verdict})
        return out

    def samples(self, source_samples: Sequence[Mapping[str, Any]],
                decode: Callable[[Any], str]) -> list[dict[str, Any]]:
        """samples.jsonl: per prompt, each attacker's raw and restored text and token F1."""
        return [{"id": s.get("id"), "prompt": s.get("prompt"),
                 **{f"{a}_raw_text": decode(s[RECONSTRUCTION_FIELDS[a]]) for a in self.attackers},
                 **{f"{a}_restored_text": self.texts[a][i] for a in self.attackers},
                 **{f"{a}_{stage}_token_f1": self.rows[a][i][stage]["token_f1"]
                    for a in self.attackers for stage in STAGES}}
                for i, s in enumerate(source_samples)]


def source_controls(source_metrics: Mapping[str, Any], attacker: str) -> tuple[bool, bool]:
    """Whether the source run's positive and negative controls passed for `attacker` (the Bayes attacker's
    negative control holds by construction: nothing is trained)."""
    m = source_metrics
    if attacker == "learned":
        return (bool(m.get("positive_control_pass", m.get("attack_valid"))),
                bool(m.get("negative_control_pass", m.get("attack_valid"))))
    return bool(m.get("bayes_positive_control_pass", True)), True


def restore_attackers(restorer: Any, tokenizer: Any, source_samples: Sequence[Mapping[str, Any]], section: Any,
                      semantic_model: Any, margin: float, source_metrics: Mapping[str, Any],
                      per_item_bound_pp: float = 100.0) -> Restored:
    """Restore and score the reconstructions of each attacker of `section.attackers` (the restore section:
    instruction, max_new_tokens, batch_size) that the source samples hold; `margin`: the verdict's m in pp."""
    from attacks import controls
    from harness.splitee.restoration import restore_texts
    from metrics.intervals import mean_ci

    def decode(ids: Any) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    prompts = [list(s["prompt_ids"]) for s in source_samples]
    out = Restored({}, {}, {}, [])
    for attacker in section.attackers:
        field = RECONSTRUCTION_FIELDS[attacker]
        if any(field not in s for s in source_samples):
            out.notes.append(f"the source run has no {attacker} reconstructions ({field}): not restored")
            continue
        raw_ids = [list(s[field]) for s in source_samples]
        restored = restore_texts(restorer, [decode(r) for r in raw_ids], section.instruction,
                                 max_new_tokens=section.max_new_tokens, batch_size=section.batch_size,
                                 desc=f"restore {attacker}")
        restored_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in restored]
        raw = controls.score(prompts, raw_ids, decode, semantic_model)
        rest = controls.score(prompts, restored_ids, decode, semantic_model)
        delta = mean_ci([b["token_f1"] - a["token_f1"] for a, b in zip(raw.rows, rest.rows)])
        floor = controls.exposure_free_f1(prompts, restored_ids)
        positive, negative = source_controls(source_metrics, attacker)
        f1 = rest.f1
        earned = controls.earned([row["token_f1"] for row in rest.rows], floor, f1.lo, f1.hi, per_item_bound_pp)
        out.attackers[attacker] = {
            "raw": {k: v for k, v in raw.metrics.items() if not k.startswith("bleu_signature")},
            "restored": {k: v for k, v in rest.metrics.items() if not k.startswith("bleu_signature")},
            "delta_token_f1": delta.mean, "delta_token_f1_ci_lo": delta.lo, "delta_token_f1_ci_hi": delta.hi,
            "restored_floor_token_f1": floor,
            **controls.earned_flat("restored_token_f1", earned, per_item_bound_pp),
            "restored_verdict": controls.classify(f1.lo, f1.hi, floor, margin, positive_passed=positive,
                                                  negative_passed=negative, certify=earned),
        }
        out.rows[attacker] = [{"raw": a, "restored": b} for a, b in zip(raw.rows, rest.rows)]
        out.texts[attacker] = restored
    return out

"""DecodeLeak's audit of one collab run (paper 003 §3): the exposure sets of every decoding the run made
(harness/collab/experiment.py Decodings), scored on the private evidence against the cloud alone's floor;
the informed attacker on the signal against the same attacker on the null signal (the verdict), with the
undefended run as positive and a second null as negative control; and the cloud's inversion of x_priv
(`collab.inversion.enabled`). Only the view and what the cloud owns reach the attacker
(attacks/collab/decodeleak.py); the evidence reaches the scoring."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from attacks.collab import decodeleak as leak
from attacks.collab.evidence_recall import Vocabulary, tokenise_evidence
from harness.collab import prompts, protocol
from harness.collab.experiment import Decodings, Parties
from metrics import roc

ROC_TEST, INVERSION_TEST = "informed_token_er", "inversion"


@dataclass
class Audit:
    curves: leak.Curves              # the run's exposure sets, per example
    floor_curves: leak.Curves        # the cloud alone's
    curves_out: dict[str, Any]       # leak.summarise: every metric at every K, its floor and excess
    informed_out: dict[str, Any]     # the informed attacker's, `informed_` keys
    verdict: dict[str, Any]          # leak.verdict with its controls
    roc: dict[str, Any]              # the verdict's per-example scores as a membership-style test (metrics/roc.py)


def audit(c: DictConfig, cache_dir: Any, parties: Parties, examples: list[Any], runs: Decodings, ks: list[int],
          k_rep: int) -> Audit:
    """The audit of `runs` on `examples` at every K of `ks`, its verdict at `k_rep` (c: the collab section;
    cache_dir: where the floor's inversion is cached)."""
    cloud, vocab, top = parties.cloud, parties.vocab, max(ks)
    vocab_info = Vocabulary(parties.edge.tokenizer)
    evidence = [tokenise_evidence(e.evidence, vocab_info, bool(c.evidence.leading_space)) for e in examples]

    memo: dict = {}     # edge-side exposure sets by (query, synced tokens): one forward per distinct sequence

    def sets_of(sig: protocol.Signals) -> list[list[list[int]]]:
        return [leak.exposure_sets(sig.view, e.id, cloud=cloud.model, vocab=vocab, top=top, memo=memo)
                for e in examples]

    run_sets = sets_of(runs.signals)
    curves = leak.score_sets(run_sets, evidence, vocab_info, ks)
    floor_curves = leak.score_sets(runs.floor.sets, evidence, vocab_info, ks)
    # The verdict: the informed attacker (signal ∪ its own no-signal guesses) on the signal against the same
    # attacker on the null signal; the controls likewise (attacks/collab/decodeleak.py).
    # Each pair's steps matched as collab.controls.step_matching says (decodeleak.py, "Steps").
    matching = str(c.controls.step_matching)
    null_sets = sets_of(runs.null)

    def pair(signal: list[list[list[int]]], null: list[list[list[int]]]) -> tuple[leak.Curves, leak.Curves]:
        return leak.paired_scores(signal, null, evidence, vocab_info, ks, prior=runs.floor.sets,
                                  step_matching=matching)

    informed = leak.score_sets(run_sets, evidence, vocab_info, ks, prior=runs.floor.sets)   # reported, all steps
    verdict_run, informed_null = pair(run_sets, null_sets)
    pos = None if runs.undefended is None else pair(sets_of(runs.undefended), sets_of(runs.no_context))
    neg = pair(sets_of(runs.null_again), null_sets)
    inv = c.inversion
    if inv.enabled:
        def inversions(all_sets: list[list[list[int]]]) -> list[str]:
            chunks, floor = parties.pair.batches(len(examples))
            return leak.invert_all(cloud.model, cloud.tokenizer, [prompts.encode(cloud.tokenizer, prompts.inversion_text(
                e, cloud.tokenizer, s, int(inv.k), int(inv.max_steps))) for e, s in zip(examples, all_sets)],
                int(inv.max_new_tokens), batch_size=len(chunks[0]) if chunks else 1, min_rows=floor)

        inv_key = {"edge": parties.edge.source, "cloud": cloud.source, "examples": runs.key["examples"], "top": top,
                   "max_new_tokens": int(c.max_new_tokens), "inversion": dict(inv), "run": "floor_inversion",
                   "engine": runs.key["engine"]}
        guesses = {"run": inversions(run_sets),
                   "floor": protocol.cached(cache_dir, inv_key, lambda: inversions(runs.floor.sets))}
        for curves_, texts in ((curves, guesses["run"]), (floor_curves, guesses["floor"])):
            curves_.inversion = [leak.rouge1(e.context, g) for e, g in zip(examples, texts)]
            curves_.inversion_text = list(texts)
    curves_out = leak.summarise(curves, floor_curves, ks)
    v = leak.verdict(verdict_run, informed_null, pos, neg, k_rep, float(c.controls.gate_margin_pp),
                     float(c.controls.positive_margin_pp), float(c.controls.per_item_bound_pp))
    v["step_matching"] = matching
    informed_out = {f"informed_{k}": val for k, val in leak.summarise(informed, floor_curves, ks).items()
                    if not k.startswith("floor_") and "inversion" not in k}
    # The same per-example scores as a test: does an example's Token-ER tell the signal from its null?
    test = roc.roc(verdict_run.values("token_er", k_rep), informed_null.values("token_er", k_rep),
                   positive=f"informed Token-ER@{k_rep} of each example on the signal",
                   negative=f"informed Token-ER@{k_rep} of each example on the null signal (the edge without x_priv)")
    tests = {ROC_TEST: test}
    if curves.inversion:     # the inversion from the run's exposure sets against from the cloud alone's, per example
        tests[INVERSION_TEST] = roc.roc([r["inversion_rouge1_recall"] for r in curves.inversion],
                                        [r["inversion_rouge1_recall"] for r in floor_curves.inversion],
                                        positive="inversion ROUGE-1 recall of x_priv from the run's exposure sets",
                                        negative="the same from the cloud alone's own top-K (the floor)")
    return Audit(curves, floor_curves, curves_out, informed_out, v, tests)


def metrics(a: Audit, k_rep: int) -> dict[str, Any]:
    """results.json `metrics`' leakage part: every metric at the verdict's K with its floor and excess, the
    informed attacker's, the verdict's statistic and its ROC (`auc`, `tpr_at_fpr`), the inversion's, in this order."""
    rep, curves_out, v = str(k_rep), a.curves_out, a.verdict
    out: dict[str, Any] = {}
    for m in leak.METRICS:
        out[f"{m}_at_{k_rep}"] = curves_out[f"{m}_at_k"][rep]
        out[f"floor_{m}_at_{k_rep}"] = curves_out[f"floor_{m}_at_k"][rep]
        out[f"excess_{m}_at_{k_rep}"] = curves_out[f"excess_{m}_at_k"][rep]
    out[f"informed_token_er_at_{k_rep}"] = a.informed_out["informed_token_er_at_k"][rep]
    out[f"informed_excess_token_er_at_{k_rep}"] = a.informed_out["informed_excess_token_er_at_k"][rep]
    out[f"null_excess_token_er_at_{k_rep}"] = v["null_excess_token_er"]
    out[f"null_excess_token_er_at_{k_rep}_ci"] = v["null_excess_token_er_ci"]
    out.update(roc.flat(a.roc[ROC_TEST]))
    if INVERSION_TEST in a.roc:
        out.update(roc.flat(a.roc[INVERSION_TEST], "inversion_"))
    out.update({k: curves_out[k] for k in ("inversion_rouge1_recall", "inversion_rouge1_f1",
                                           "floor_inversion_rouge1_recall", "excess_inversion_rouge1_recall")
                if k in curves_out})
    return out

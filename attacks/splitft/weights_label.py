"""The label set of a step, read from the client's weight update (`client_weights`; paper 002's strong
threat model, issue 12): the server knows θ after every step, so it knows the update Δθ = θ_{s+1} − θ_s
of two consecutive recorded steps of one client, and that update is a gradient of the loss whose labels
are the next tokens, i.e. the private text. No s'_A, s'_B or gradient crossing is read, no parameter fitted.

The derivation. The LM head W (V × d) maps the final hidden state h_t to the logits z_t = W h_t; the step's
loss is L = (1/N) Σ_t −log softmax(z_t)_{y_t} over the N = B·(T − 1) positions of the batch, so row v's
gradient is

    g_v = ∂L/∂W_v = (1/N) Σ_t (p_tv − 1[y_t = v]) h_t,    p_t = softmax(z_t).

A row v that is no label of the batch (the bulk: all but at most N of the V rows) gets only the first
part, g_v = (1/N) Σ_t p_tv h_t: a positive mixture of the batch's hidden states, and while the model
spreads its probability over the vocabulary (an untrained or small model; a real LM on every token it
does not find plausible), nearly the same mixture for every bulk row, ≈ (p̄_v) Σ_t h_t. A label row gets
−(1/N) Σ_{t: y_t = v} (1 − p_tv) h_t on top: the hidden states it is the label of, with the opposite sign.
Where those share the batch's common direction (⟨h_t, Σ_s p_sv h_s⟩ > 0: the final hidden states of an LM
share a large mean component), a label row points against the bulk. The update reads the same with either
optimizer the clients use (`splitft.optimizer`):

    SGD    Δ_v = −η g_v                                         (norms differ by 1/p; directions as g)
    AdamW  Δ_v = −η (m̂_v / (√v̂_v + ε) + λ W_v),  first step: −η (g_v / (|g_v| + ε) + λ W_v) ≈ −η sign(g_v)

Adam normalises each entry, so every row moves by about η per entry (where |g| ≫ ε; on the tiny random
model the bulk's first-step gradients are near ε, so norms still rank there once, not after) and a norm-based
score carries nothing (tests/splitft/test_splitft.py checks both); the sign pattern is what survives. So the
attacker scores each row by its direction against the bulk's:

    b = median_v Δ_v   (coordinate-wise, over the V rows of the head's update)
    score_v = −cos(Δ_v, b);   predicted label set = {v : score_v > 0}   (anti-aligned with the bulk)

The median, not the mean: under SGD Σ_v g_v = (1/N) Σ_t (Σ_v p_tv − 1) h_t = 0 exactly, so the mean row
of the update is zero (float noise) and anchors nothing, while the label rows (≤ N of V) cannot move the
median off a bulk row. The threshold 0 is cosine's own zero: no set size is chosen or told (the number
predicted is reported as `weights_label_n_predicted`).

Where it does not apply, and what it cannot see (docs/splitft.md):
- The head must train. A tied head is A's input embedding (harness/splitft/trainable.py): it trains with
  A, and the rows of the batch's *input* tokens get the embedding's gradient too; the inputs are the labels
  shifted by one, so the extra rows are mostly labels anyway. With LoRA only adapters train, and with
  `splitft.train_head=false` a tied head is frozen: the head's rows never move and the attacker is skipped
  with that reason (`weights_label_skipped`), not scored. An untied head with A frozen is C's and trains.
- Pairs: only steps s, s+1 of the same client in the same round (the view's meta `steps`), both recorded
  (`splitft.record.steps_per_round` ≥ 2). Between rounds the weights jump to the FedAvg average, which
  mixes every client's updates: such pairs are not used. The last recorded step of a round has no
  successor in the view (the client's reply to FedAvg holds it but is not recorded), so with
  steps_per_round = r each client and recorded round gives r − 1 examples.
- The truth of the pair (s, s+1) is the distinct label tokens of step s's batch. AdamW's moments carry the
  earlier steps of the round (the optimizer is fresh each round, harness/splitft/client.py): the first pair
  of a round is exactly the sign step above; later ones are a mix, m̂ of step j weighing step j−1's
  gradient ≈ 47 % at j = 2, so earlier batches' labels enter the prediction and precision falls
  (tests/splitft/test_splitft_weights.py). SGD has no memory.
- AdamW's decoupled decay −ηλW_v (λ = 0.01) is in Δ; it is ≈ 1 % of the sign step's size per entry and
  changes no sign except where |g_v| ≲ ε, so it is left in.
- Float resolution: Δ_v is a difference of float32 weights. On a real model with SGD at a small step the
  bulk rows' update can fall below half a unit in the last place of W and the stored weights do not move:
  the median is 0, there is no anchor and nothing is predicted (F1 0, so the verdict says inconclusive,
  not at_chance). The rows that did move are then mostly labels: a magnitude attacker would read them,
  this one does not.
- Defences act on the crossings, not on the labels, so none of the configurations changes what the update
  is a gradient of; PrivPair's ŝ_B, DP's or dχ's noise change the h_t it mixes (smashed-data DP at ε = 1
  lowered the smoke's F1 from 89 to 72, docs/splitft.md), not which rows are labels.

The positive control (`undefended_updates`): the update one fresh step of the clients' optimizer (the
view's meta `optimizer`) would make from θ_s on step s's batch without a defence (the plain model A∘B∘C,
the true labels), from the evaluator's truth. Scored like the attack by attacks/splitft/cell.py, against
the distinct label tokens of the step, with a frequency prior (`frequency_prior`) beside the exposure-free
reference.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from attacks.splitft.white_box import ServerCopy
from harness.splitft.client import make_optimizer
from harness.splitft.privpair import token_ce
from harness.splitft.step import CLIENT_WEIGHTS


def head_span(copy: ServerCopy) -> tuple[int, torch.Size] | None:
    """(offset, shape) of the LM head's weight in the flat `client_weights` vector, or None when the clients
    do not train it (a tied head is found under its embedding name: named_parameters lists it once)."""
    head = copy.model.get_output_embeddings().weight
    params = dict(copy.model.named_parameters())
    offset = 0
    for name in copy.names:
        if params[name] is head:
            return offset, head.shape
        offset += params[name].numel()
    return None


def step_pairs(copy: ServerCopy) -> list[tuple[int, int]]:
    """(s, s + 1) for every recorded step s whose successor is recorded too, by the same client in the same
    round (the view's meta `steps`; a step missing from it is never paired: a FedAvg may lie between)."""
    steps = copy.view.meta["splitft"].get("steps", {})
    who = {int(s): (v["client"], v["round"]) for s, v in steps.items()}
    recorded = {e.step for e in copy.view.select(channel=CLIENT_WEIGHTS)}
    return [(s, s + 1) for s in sorted(recorded)
            if s + 1 in recorded and s in who and who[s] == who.get(s + 1)]


def why_not(copy: ServerCopy) -> str | None:
    """The reason the attacker has nothing to read in this view, or None."""
    if head_span(copy) is None:
        meta = copy.view.meta["splitft"]
        if (meta.get("lora") or {}).get("enabled"):
            return "the LM head is frozen: with LoRA only the adapters train, so its rows never move"
        return ("the LM head is frozen: it is tied to A's input embedding and A does not train "
                "(splitft.train_head=false), so its rows never move")
    if len(step_pairs(copy)) < 2:
        return ("fewer than 2 pairs of consecutive recorded steps of one client in one round "
                "(splitft.record.steps_per_round >= 2 gives steps_per_round - 1 per client and recorded round)")
    return None


def _head(copy: ServerCopy, step: int) -> torch.Tensor:
    offset, shape = head_span(copy)
    return copy.weights[step][offset:offset + shape.numel()].view(shape)


def updates(copy: ServerCopy) -> dict[int, torch.Tensor]:
    """Per pair (s, s + 1): the head's update W_{s+1} − W_s (V × d), keyed by s (exact in float32 where the
    two weights lie within a factor 2 of each other, Sterbenz: every entry a step moves by less than itself)."""
    return {s: _head(copy, t) - _head(copy, s) for s, t in step_pairs(copy)}


def bulk_scores(delta: torch.Tensor) -> torch.Tensor:
    """score_v = −cos(Δ_v, median_v Δ_v) for every row v of a head's update (module docstring); 0 for a row
    that did not move, and for every row when the median row is 0 (no anchor)."""
    bulk = delta.median(dim=0).values
    if not bool(bulk.any()):
        return torch.zeros(delta.shape[0])
    return -F.cosine_similarity(delta, bulk[None], dim=-1, eps=1e-30)


def predict(delta: torch.Tensor) -> list[int]:
    """The predicted label set (sorted token ids): the rows anti-aligned with the bulk."""
    return (bulk_scores(delta) > 0).nonzero().flatten().tolist()


def label_set(ids: torch.Tensor) -> list[int]:
    """The truth of a step: its batch's distinct label tokens (the next tokens, positions 1..T−1), sorted."""
    return sorted(set(ids[:, 1:].flatten().tolist()))


def infer_label_sets(copy: ServerCopy, deltas: dict[int, torch.Tensor] | None = None) -> list[tuple[int, list[int]]]:
    """(s, predicted label set) for every pair (s, s + 1), from the recorded updates or from `deltas`."""
    deltas = updates(copy) if deltas is None else deltas
    return [(s, predict(d)) for s, d in sorted(deltas.items())]


def undefended_updates(copy: ServerCopy, truth: dict[int, dict[str, Any]]) -> dict[int, torch.Tensor]:
    """The positive control's updates: per pair (s, s + 1), the head's update of one fresh step of the
    clients' optimizer (the view's meta; SGD for a view from before it recorded one) from θ_s on step s's
    batch through the plain model (no defence, true labels). The score is scale-free and both updates are
    lr times a direction (AdamW's: −lr(ĝ + λθ)), so lr does not change the prediction."""
    meta = copy.view.meta["splitft"]
    name, lr = str(meta.get("optimizer", "sgd")), float(meta.get("lr", 1.0))
    head = copy.model.get_output_embeddings().weight
    out = {}
    for s, _ in step_pairs(copy):
        part = copy.at(s)
        ids = truth[s]["ids"]
        head.requires_grad_(True)
        try:
            with torch.enable_grad():
                (g,) = torch.autograd.grad(token_ce(part.forward(ids), ids).mean(), head)
        finally:
            head.requires_grad_(False)
        start = head.detach().clone()
        moved = start.clone().requires_grad_(True)
        moved.grad = g.detach()
        make_optimizer(name, [moved], lr).step()
        out[s] = moved.detach() - start
    return out


def frequency_prior(public: list[list[int]], n: int) -> list[int]:
    """The n most frequent label tokens of the public blocks (D_align), ties by id: an exposure-free guess
    of the same size as the attacker's."""
    counts = Counter(t for block in public for t in block[1:])
    return sorted(t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n])

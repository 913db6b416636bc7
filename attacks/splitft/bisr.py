"""BiSR's forward attack (Bidirectional Semi-white-box Reconstruction, Chen et al. 2024, arXiv 2409.00960;
paper 002 ref. [23]), in its forward form BiSR(f): refine an initial guess of the input tokens by matching
the smashed data the server received through its white-box copy of A.

BiSR chains a learning-based guess (its SIP inverter), a backward refinement on the gradients (BiSR(b))
and this forward one. Its forward step, as its authors' SplitLLM code (`SmashedDataMatchingAttacker`)
implements it: start from the token embeddings of the previous stage's guess, optimise them with AdamW
so that A(x) matches the intercepted s'_A in cosine (1 − cos per token, averaged), then read every
position's token as argmax_v ⟨x_t, E_v⟩. What we take, and what we changed:

- The initial guess (`init`): `label` (default) uses the other direction of the same split, which BiSR's
  "auto-regressive" argument is about: the server's label inference argmax f_C(s'_B) predicts token t+1 at
  position t (attacks/splitft/label.py), so x_{t+1} starts at the embedding of that prediction and x_0,
  which nothing predicts, at a random token's. `sip`: BiSR's own first stage, a learned inverter's guess of
  the input tokens (here the attack suite's inverter trained on public blocks, attacks/splitft/inverter.py;
  position t starts at its guess for x_t). `random`: random tokens (the code's fallback without a prior
  stage); `mean`: the mean embedding everywhere (the EIA's start). With BiSR(b) on, the suite passes its
  labels in place of the label attack's (init=label).
- The weights (`weights`): `client`, the client's A of that step (`client_weights`: the strong threat
  model of paper 002 §III); `pretrained`, the pretrained A (BiSR's semi-white-box setting: the
  "not-too-far" property makes the pretrained weights a good stand-in for the fine-tuned ones).
- The learning rate is `lr` × the standard deviation of the embedding matrix (the scale x lives at), as in
  attacks/splitft/eia.py, instead of an absolute rate tuned per model.

It differs from attacks/splitft/eia.py (the EIA optimisation) in the start (a guess from s'_B, not the
mean embedding), the loss (cosine only, BiSR's default) and the decoder (inner product). Reads
`smashed_up`, `client_weights` and, through the label guesses, `smashed_down`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from attacks.splitft.white_box import PRETRAINED, ServerCopy
from harness.splitft.config import BISR_INITS, BISR_WEIGHTS
from harness.splitft.step import SMASHED_UP

INITS, WEIGHTS = BISR_INITS, BISR_WEIGHTS


def initial_embeddings(vocab: torch.Tensor, shape: tuple[int, int], init: str,
                       labels: Sequence[Sequence[int]] | None, generator: torch.Generator) -> torch.Tensor:
    """(rows, seq, d) starting points: the label guesses shifted by one (x_0, which nothing predicts, a
    random token), the inverter's input guesses in place (sip), random tokens, or the mean embedding (a
    poor start for a cosine loss: every position starts at the same point; on the tiny test model it
    recovered 33% of tokens in 60 steps where random starts recovered all, probe 2026-12-01)."""
    rows, seq = shape
    if init == "mean":
        return vocab.mean(0).expand(rows, seq, -1).clone()
    x = vocab[torch.randint(0, vocab.shape[0], (rows, seq), generator=generator)].clone()
    if init in ("label", "sip"):
        if labels is None:
            raise ValueError(f"BiSR init={init} needs the previous stage's guesses")
        shift = 1 if init == "label" else 0       # label: position t predicted token t+1
        for r, guess in enumerate(labels):
            ids = torch.as_tensor(list(guess)[: seq - shift], dtype=torch.long)
            x[r, shift: shift + len(ids)] = vocab[ids]
    return x


def reconstruct(part, target: torch.Tensor, start: torch.Tensor, vocab: torch.Tensor, steps: int,
                lr: float) -> list[list[int]]:
    """Token ids per row of one s'_A (rows, seq, d), from the starting embeddings `start`."""
    x = start.clone().requires_grad_(True)
    optimiser = torch.optim.AdamW([x], lr=lr * float(vocab.std()), weight_decay=0.01)
    for _ in range(steps):
        optimiser.zero_grad()
        out = part.run_layers(x, part.context(x), 0, part.k)
        loss = (1 - F.cosine_similarity(out, target, dim=-1)).mean()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        return (x.detach() @ vocab.T).argmax(-1).tolist()


def bisr_forward(copy: ServerCopy, labels: Mapping[tuple[int, int], Sequence[int]] | None, *, steps: int,
                 lr: float, max_examples: int, init: str = "label", weights: str = "client",
                 seed: int = 0) -> list[tuple[int, int, list[int]]]:
    """(step, row, recovered input ids) for up to `max_examples` rows of the recorded s'_A; `labels` maps
    (step, row) to the previous stage's guesses for that row: next-token labels (init=label) or input
    tokens (init=sip)."""
    if init not in INITS or weights not in WEIGHTS:
        raise ValueError(f"BiSR: init must be one of {INITS} and weights one of {WEIGHTS}, got {init!r}, {weights!r}")
    generator = torch.Generator().manual_seed(seed)
    vocab = copy.vocab_embeddings.detach()
    out: list[tuple[int, int, list[int]]] = []
    for exposure in copy.view.select(channel=SMASHED_UP):
        if len(out) >= max_examples:
            break
        target = exposure.tensor[: max_examples - len(out)]
        part = copy.at(exposure.step if weights == "client" else PRETRAINED)
        guesses = ([labels[(exposure.step, r)] for r in range(target.shape[0])] if init in ("label", "sip")
                   else None)
        start = initial_embeddings(vocab, tuple(target.shape[:2]), init, guesses, generator)
        for row, ids in enumerate(reconstruct(part, target, start, vocab, steps, lr)):
            out.append((exposure.step, row, ids))
    return out

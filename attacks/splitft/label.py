"""Label inference (paper 002 §IV, after BiSR): the server decodes what it computed for the client with
its white-box C. In LLM fine-tuning the labels are the next tokens, i.e. the text itself.

For each recorded step, the server holds s'_B (`smashed_down`: its own output on what it received) and
the client's C as of that step (`client_weights`, the weights after the previous step); its guess for the label at position t is
argmax f_C(s'_B)_t. Against PrivPair it decodes s'_B, not the ŝ_B its W2 would give: W2 never leaves the
client. Scored by next-token top-1 accuracy and multiset token F1 against the true labels (attacks/
splitft/cell.py).

Its floor (issue 31): the constant guess, the most frequent label token of the same labels at every
position (attacks/labels.py `constant_guesses`); on WikiText-2 blocks it scores about 5 % top-1. The verdict's reference is the
larger of the exposure-free reference and the constant guess's F1, so a leak must beat both."""
from __future__ import annotations

import torch

from attacks.splitft.white_box import ServerCopy
from harness.splitft.step import SMASHED_DOWN


@torch.no_grad()
def infer_labels(copy: ServerCopy) -> list[tuple[int, int, list[int]]]:
    """(step, row, predicted labels for positions 0..T-2) for every row of every recorded s'_B."""
    out = []
    for exposure in copy.view.select(channel=SMASHED_DOWN):
        part = copy.at(exposure.step)
        s_b = exposure.tensor
        logits = part.tail(s_b, part.context(s_b))
        for row, ids in enumerate(logits[:, :-1].argmax(-1).tolist()):
            out.append((exposure.step, row, ids))
    return out

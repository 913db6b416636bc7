"""Sanitising a workload's prompts: only the tokens of the user's text are replaced; the chat template and
special tokens around them go out as they are. What leaves the client is recorded in the adversary view on
the channel `sanitized_tokens` (one exposure per prompt, the whole sequence the accelerator receives)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.adversary_view import AdversaryView, Exposure

CHANNEL = "sanitized_tokens"


@dataclass
class SanitizedPrompts:
    input_ids: list[list[int]]        # what the model receives: template + sanitised text
    spans: list[tuple[int, int]]      # [start, end) of the text inside each sequence (public: the template is)
    original_text_ids: list[list[int]]

    def text_ids(self) -> list[list[int]]:
        """The sanitised text tokens of each prompt."""
        return [ids[a:b] for ids, (a, b) in zip(self.input_ids, self.spans)]


def text_span(input_ids: Sequence[int], text_ids: Sequence[int]) -> tuple[int, int]:
    """Where the text's own tokens sit in the templated sequence (the last occurrence: a system preamble of
    the template comes first)."""
    n, m = len(input_ids), len(text_ids)
    seq, sub = list(input_ids), list(text_ids)
    for start in range(n - m, -1, -1):
        if seq[start:start + m] == sub:
            return start, start + m
    raise ValueError("the prompt's text tokens are not a contiguous part of its templated input ids")


def sanitize_prompts(sanitizer: Any, prompts: Sequence[Any], tokenizer: Any, seed: int) -> SanitizedPrompts:
    """Each workload prompt (harness.workloads.Prompt) with its text tokens sanitised, all in one batch."""
    text_ids = [list(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in prompts]
    spans = [text_span(p.input_ids, t) for p, t in zip(prompts, text_ids)]
    clean = sanitizer(text_ids, seed)
    input_ids = [list(p.input_ids[:a]) + c + list(p.input_ids[b:]) for p, (a, b), c in zip(prompts, spans, clean)]
    return SanitizedPrompts(input_ids, spans, text_ids)


def adversary_view(sanitized: SanitizedPrompts, meta: dict[str, Any]) -> AdversaryView:
    """The record of what crossed: each sanitised sequence, and the public layout (the text spans)."""
    view = AdversaryView(meta={**meta, "text_spans": [list(s) for s in sanitized.spans]})
    for ids in sanitized.input_ids:
        t = torch.tensor(ids, dtype=torch.long)
        view.exposures.append(Exposure(op="prompt", layer=None, step=0, shape=tuple(t.shape), tensor=t, channel=CHANNEL))
    return view


def read_view(view: AdversaryView) -> list[list[int]]:
    """The sanitised text tokens of each prompt, read from the view alone (what every attacker starts from)."""
    exposures = view.select(channel=CHANNEL)
    spans = view.meta["text_spans"]
    return [e.tensor.tolist()[a:b] for e, (a, b) in zip(exposures, spans)]


def read_prefixes(view: AdversaryView) -> list[list[int]]:
    """The tokens before each prompt's text span (the template's part: public, unchanged by the sanitiser)."""
    exposures = view.select(channel=CHANNEL)
    spans = view.meta["text_spans"]
    return [e.tensor.tolist()[:a] for e, (a, _) in zip(exposures, spans)]

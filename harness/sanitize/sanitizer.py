"""A sanitiser built from the config: the mechanism of the configuration, its parameter, the shared table.

This is the client/TEE side of paper 001: the prompt's text tokens are replaced here, before anything leaves;
what leaves is the sanitised sequence (harness/sanitize/prompts.py records it in the adversary view).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness import configurations
from harness import token_embeddings as embeddings
from harness.sanitize import mechanisms
from harness.sanitize.mechanisms import Settings
from harness.token_embeddings import Table


@dataclass
class Sanitizer:
    table: Table
    settings: Settings
    keep: torch.Tensor | None = None   # (V,) token ids left unchanged besides non-candidates (stop words)
    chunk: int = 256

    def __call__(self, sequences: Sequence[Sequence[int]], seed: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(int(seed))
        return mechanisms.sanitize(sequences, self.table, self.settings, generator, keep=self.keep, chunk=self.chunk)

    def with_mechanism(self, mechanism: str) -> Sanitizer:
        """The same table and window with another mechanism (the attackers' identity control)."""
        s = self.settings
        return Sanitizer(self.table, Settings(mechanism, s.window, s.sigma, s.parameter if mechanism != mechanisms.IDENTITY
                                              else None, s.may_return_original, s.custext_k), self.keep, self.chunk)


def mechanism_of(configuration: str) -> str:
    """A sanitiser configuration is named after its mechanism (harness/configurations.py)."""
    entry = configurations.get(configuration)
    if entry.system != configurations.SANITIZE:
        raise ValueError(f"configuration {configuration} is not a sanitiser")
    return configuration


def settings_of(section: Any, configuration: str, epsilon: float | None) -> Settings:
    mechanism = mechanism_of(configuration)
    return Settings(mechanism, int(section.window), float(section.sigma),
                    configurations.effective_epsilon(configuration, epsilon),
                    bool(section.dx_stencil_may_return_original), int(section.custext_k))


def build(section: Any, configuration: str, epsilon: float | None, model: Any, tokenizer: Any) -> Sanitizer:
    """The sanitiser of `configuration` at `epsilon` with the `sanitize` config section's table and window."""
    vectors = embeddings.load_vectors(str(section.embeddings), model)
    settings = settings_of(section, configuration, epsilon)
    size = embeddings.vocab_size(tokenizer, vectors)
    texts = embeddings.token_texts(tokenizer, size) if (section.vocab_filter is not None
                                                        or settings.mechanism == mechanisms.CUSTEXT_PLUS) else None
    candidates = embeddings.candidate_ids(tokenizer, vectors, section.vocab_filter, texts)
    table = Table(vectors[:size], candidates, str(section.distance))
    keep = None
    if settings.mechanism == mechanisms.CUSTEXT_PLUS:
        keep = stopword_mask(texts, section.stopwords)
    return Sanitizer(table, settings, keep, int(section.chunk))


def stopword_mask(texts: Sequence[str], stopwords: Sequence[str]) -> torch.Tensor:
    """(V,) True for the tokens whose text, stripped of spaces and lower-cased, is a stop word."""
    words = {w.strip().lower() for w in stopwords}
    return torch.tensor([t.strip().lower() in words for t in texts], dtype=torch.bool)

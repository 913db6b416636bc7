"""Utility of a collaborative answer: option accuracy (option benchmarks) or ROUGE-L to a reference.

Option accuracy reads the option the generation states: the option word that occurs first in the
generated text (case-insensitive, on word boundaries); a generation naming no option is wrong. The
prompt asks for the option first (harness/collab/prompts.py), so this is the model's stated answer, not a
likelihood comparison of the options.
"""
from __future__ import annotations

import re
from collections.abc import Sequence


def stated_option(text: str, options: Sequence[str]) -> str | None:
    best, where = None, None
    for o in options:
        m = re.search(rf"\b{re.escape(o.lower())}\b", text.lower())
        if m and (where is None or m.start() < where):
            best, where = o, m.start()
    return best


def option_correct(text: str, options: Sequence[str], answer: str) -> float:
    """100.0 when the stated option is the answer, else 0.0."""
    return 100.0 if stated_option(text, options) == answer else 0.0

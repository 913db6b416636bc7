"""Utility of a collaborative answer: option accuracy (option benchmarks) or ROUGE-L to a reference.

Option accuracy reads the option the generation states: the option word that occurs first in the
generated text (case-insensitive, on word boundaries); a generation naming no option is wrong. The
prompt asks for the option first (harness/collab/prompts.py), so this is the model's stated answer.
`collab.option_scoring=likelihood` reads instead the option with the highest log-likelihood as the answer's
opening (harness/collab/protocol.option_loglik computes the scores; `best_option` picks).
"""
from __future__ import annotations

import re
from collections import Counter
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


def best_option(scores: dict[str, float]) -> str | None:
    """Likelihood option scoring's pick: the option with the highest log-likelihood; None when no option
    has a finite one or the best is tied (a decoder that gives every option probability 0 picks none)."""
    finite = {o: s for o, s in scores.items() if s > float("-inf")}
    if not finite:
        return None
    top = max(finite.values())
    best = [o for o, s in finite.items() if s == top]
    return best[0] if len(best) == 1 else None


def scored_correct(scores: dict[str, float], answer: str) -> float:
    """100.0 when likelihood option scoring picks the answer, else 0.0."""
    return 100.0 if best_option(scores) == answer else 0.0


def constant_answer_floor(answers: Sequence[str]) -> float:
    """The accuracy (%) of the best answer that ignores the input: always the most frequent gold answer. A
    system whose accuracy does not clear it shows no skill, so a defence cannot lower its accuracy measurably
    and the benchmark says nothing about the defence's cost."""
    if not answers:
        return 0.0
    return 100.0 * Counter(answers).most_common(1)[0][1] / len(answers)

"""Words and content words of English text: what the collab system's evidence rule
(harness/collab/benchmarks.py) selects its evidence by and what Evidence Recall (attacks/collab/evidence_recall.py)
counts, in one place so that both read a text the same way.

A word is a run of letters, digits, apostrophes and hyphens starting with a letter or digit; a content word
is one that, lower-cased and stripped of apostrophes and hyphens at its ends, is not an English stopword
(scikit-learn's list), has at least two characters (or is a number) and holds a letter or digit.
"""
from __future__ import annotations

import re

WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")


def stopwords() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS)


def words(text: str) -> list[str]:
    return WORD.findall(text)


def is_content_word(word: str, stop: frozenset[str] | None = None) -> bool:
    w = word.lower().strip("'-")
    stop = stopwords() if stop is None else stop
    return bool(w) and w not in stop and (len(w) >= 2 or w.isdigit()) and any(ch.isalnum() for ch in w)

"""The prompts of the two parties and of the inversion attacker (paper 003 §2.1, A.1.2, A.5 Prompt D).

The edge conditions on (x_priv, x_pub), the cloud on x_pub only; both get the same output instruction and
then share the generated prefix y_<t (appended after each party's own prompt).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.collab.benchmarks import Example

INVERSION_TEMPLATE = (
    "### Task\n\nReconstruct the private context from the public query and signal exposure sequence.\n\n"
    "### Inputs\n\nPublic query:\n\n{x_pub}\n\nSignal exposure sequence:\n\n{exposure_sequence}\n\n"
    "### Output\n\nFree-text estimate of the private context only.")


def public_text(example: Example) -> str:
    """x_pub as both parties read it: the query, the options and the output instruction."""
    if example.options:
        return (f"Question: {example.query}\nOptions: {', '.join(example.options)}\n"
                "Answer with one of the options first, then give a short reason.")
    return example.query


def party_text(example: Example, *, private: bool) -> str:
    """The edge's text (private context first) or the cloud's (public text only)."""
    pub = public_text(example)
    return f"Context: {example.context}\n\n{pub}" if private else pub


def encode(tokenizer: Any, text: str) -> list[int]:
    """A user turn through the chat template when the tokenizer has one, else the plain text with BOS."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def exposure_sequence(tokenizer: Any, steps: Sequence[Sequence[int]], k: int, max_steps: int) -> str:
    """{E_t^k} as text: one line per step, `t: tok | tok | ...` with each token decoded as it stands
    (an empty set, e.g. a CoVeil step that uploaded nothing, reads `t: (none)`)."""
    lines = []
    for t, ids in enumerate(steps[:max_steps], 1):
        toks = [tokenizer.decode([int(i)]).strip() or repr(tokenizer.decode([int(i)])) for i in list(ids)[:k]]
        lines.append(f"{t}: {' | '.join(toks) if toks else '(none)'}")
    return "\n".join(lines)


def inversion_text(example: Example, tokenizer: Any, steps: Sequence[Sequence[int]], k: int, max_steps: int) -> str:
    return INVERSION_TEMPLATE.format(x_pub=public_text(example),
                                     exposure_sequence=exposure_sequence(tokenizer, steps, k, max_steps))

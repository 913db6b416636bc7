"""Restoring attack reconstructions with an instruct model (paper §7.4.4, Table 7).

The paper hands every raw reconstruction to a large instruction model told to fix corrupted words and
repeated fragments without adding information, then scores the restored text against the prompt with the
reconstruction's own metrics: restoration shows how much prompt information a broken reconstruction holds
beyond what its raw scores say. Here the model is any local instruct model (SmolLM2-135M-Instruct by
default, any hub model for users with network); it sees only the attacker's text.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def restore_texts(loaded: Any, texts: Sequence[str], instruction: str, *, max_new_tokens: int, batch_size: int,
                  desc: str = "restore") -> list[str]:
    """Greedy restoration of each text: the instruction as the system turn (folded into the user turn for
    a chat template without a system role), the text as the user turn; returns the decoded replies."""
    from harness.progress import progress

    tok, model = loaded.tokenizer, loaded.model
    prompts = [_chat(tok, instruction, text) if loaded.has_chat_template else f"{instruction}\n\n{text}\n\n"
               for text in texts]
    out: list[str] = []
    bar = progress(desc=desc, total=len(prompts), unit="text")
    try:
        for start in range(0, len(prompts), batch_size):
            batch = tok(prompts[start:start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.inference_mode():
                ids = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tok.pad_token_id)
            replies = ids[:, batch["input_ids"].shape[1]:]
            out.extend(tok.decode(r, skip_special_tokens=True).strip() for r in replies)
            bar.update(len(replies))
    finally:
        bar.close()
    return out


def _chat(tok: Any, instruction: str, text: str) -> str:
    messages = [{"role": "system", "content": instruction}, {"role": "user", "content": text}]
    try:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:   # templates without a system role reject it: one user turn instead (why: Gemma's)
        return tok.apply_chat_template([{"role": "user", "content": f"{instruction}\n\n{text}"}], tokenize=False,
                                       add_generation_prompt=True)

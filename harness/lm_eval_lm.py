"""An lm-evaluation-harness LM whose every forward pass runs through a SplitEngine: the one path by which
splitbench scores lm-eval tasks. runners/lm_eval_model.py registers it as lm-eval's `splitbench` model (the
engine built from a configuration); harness/sanitize/tasks.py scores the sanitisers' task accuracy (paper 001
§4.2) with it on the plain engine (the cpu or gpu configuration, no masks).

- loglikelihood (multiple-choice and likelihood tasks): one forward pass per request batch through the
  engine, as generation's prefill runs it (SplitEngine.log_probs), masks included;
- generate_until: SplitEngine.generate, greedy (the engine decodes greedily; sampling settings in a task's
  generation_kwargs are not honoured), cut at the task's stop strings;
- loglikelihood_rolling (perplexity tasks): the whole text in one window, refused past the context length.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lm_eval.evaluator
from lm_eval.api.model import LM

from harness.errors import UserError
from harness.provenance import git_state

NAME = "splitbench"


def _splitbench_commit() -> str | None:
    return git_state()["commit"]   # git run with its output captured


# lm-eval records results' `git_hash` by running `git describe` in the working directory with its stderr on the
# terminal: "fatal: not a git repository" once per evaluation outside a checkout (five times per sanitize smoke
# run), and inside one the hash of whatever repository the user stands in. The code that scored the requests
# is splitbench's: record its commit, quietly.
lm_eval.evaluator.get_git_commit_hash = _splitbench_commit


class EngineLM(LM):
    """lm-eval's three request types answered by `engine` (a SplitEngine) with `tokenizer`."""

    def __init__(self, engine: Any, tokenizer: Any, *, batch_size: int = 1, max_length: int | None = None,
                 view: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.tokenizer = tokenizer
        # What the model sees of a request's context (a sanitiser: SanitizedContexts); None = the context as is.
        self.view = view
        self.batch_size = int(batch_size)
        limit = getattr(engine.model.config, "max_position_embeddings", None)
        self.max_length = int(max_length or limit or 2048)

    def get_model_info(self) -> dict[str, Any]:
        """What lm-eval's results record under `config` (evaluator.simple_evaluate): the engine, the device it
        really ran on (lm-eval's own `device` is its --device default, cuda:0 on any machine), the batch size
        and splitbench's code version."""
        from harness.devices import describe_device
        from harness.provenance import code_version

        engine = self.engine
        device = (engine.accelerator.description if engine.accelerator is not None
                  else describe_device(engine.run_device))
        return {"splitbench": {**getattr(self, "run_info", {}), "device": device, "batch_size": self.batch_size,
                               "engine": engine.describe(), "code": code_version()}}

    # ---------------------------------------------------------------- tokens
    @property
    def prefix_token_id(self) -> int:
        tok = self.tokenizer
        return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split of a (context, continuation) pair into tokens (HFLM._encode_pair): the context's
        trailing spaces move to the continuation, the pair is tokenised whole and cut where the context ends."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self._encode(context + continuation)
        ctx = self._encode(context) if context else [self.prefix_token_id]
        cont = whole[len(ctx):] if context else self._encode(continuation)
        return ctx, cont

    # ---------------------------------------------------------------- requests
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        out: list[tuple[float, bool]] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start:start + self.batch_size]
            seqs = []
            for ctx, cont in chunk:
                seq = (ctx + cont)[-(self.max_length + 1):]
                if len(cont) >= len(seq):
                    raise UserError(f"{NAME}: a continuation of {len(cont)} tokens leaves no context within "
                                    f"max_length={self.max_length}")
                seqs.append(seq[:-1])   # the last token is only predicted
            logps = self.engine.log_probs(seqs, pad_token_id=self.tokenizer.pad_token_id)
            for (_, cont), seq, logp in zip(chunk, seqs, logps):
                rows = logp[len(seq) - len(cont):]          # the positions that predict the continuation
                target = rows.new_tensor(cont, dtype=rows.dtype).long()
                picked = rows.gather(1, target[:, None]).squeeze(1)
                out.append((float(picked.sum()), bool((rows.argmax(-1) == target).all())))
        return out

    def _seen(self, context: str) -> str:
        return context if self.view is None else self.view(context)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        # The continuation (the answer being scored) is never sanitised: only what the user would send is.
        return self._score([self._pair(self._seen(req.args[0]), req.args[1]) for req in requests])

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        if self.view is not None:
            raise UserError(f"{NAME}: loglikelihood_rolling (perplexity tasks) scores the text itself; under a "
                            "sanitiser there is no context to sanitise, so it is refused")
        out = []
        for req in requests:
            tokens = self._encode(req.args[0])
            if len(tokens) + 1 > self.max_length + 1:
                raise UserError(f"{NAME}: a text of {len(tokens)} tokens is past max_length={self.max_length} "
                                "(rolling windows are not implemented)")
            out.append(self._score([([self.prefix_token_id], tokens)])[0][0])
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = []
        for req in requests:
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.get("max_gen_toks", 256))
            ids = self._encode(self._seen(context))[-(self.max_length - max_new):] or [self.prefix_token_id]
            result = self.engine.generate([ids], max_new, pad_token_id=self.tokenizer.pad_token_id,
                                          eos_token_id=self.tokenizer.eos_token_id, stop_at_eos=True)
            # The engine stops at EOS; the task's stop strings cut the text.
            text = self.tokenizer.decode(result.output_ids[0], skip_special_tokens=True)
            for stop in until:
                if stop and stop in text:
                    text = text.split(stop)[0]
            out.append(text)
        return out


class SanitizedContexts:
    """A request context as a token sanitiser (paper 001) leaves it: tokenised, sanitised as one sequence
    with `seed`, decoded. Each distinct text is sanitised once and remembered, so every request of a doc
    (each option of a multiple-choice question) sees one and the same sanitised context, and the result
    depends on (seed, text) only, not on the order or batching of lm-eval's requests."""

    def __init__(self, sanitize: Callable[[list[list[int]], int], list[list[int]]], tokenizer: Any, seed: int) -> None:
        self.sanitize, self.tokenizer, self.seed = sanitize, tokenizer, int(seed)
        self.seen: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        if text not in self.seen:
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            out = self.sanitize([ids], self.seed)[0] if ids else ids
            self.seen[text] = self.tokenizer.decode(out, skip_special_tokens=False,
                                                    clean_up_tokenization_spaces=False)
        return self.seen[text]


def plain_lm(model: Any, tokenizer: Any, batch_size: int) -> EngineLM:
    """EngineLM on the unprotected engine where `model` lies: the cpu configuration for a model on the CPU,
    gpu for one on CUDA (no masks, no noise, so the engine's seed reads nothing)."""
    from harness.splitee.engine import EngineSettings, SplitEngine

    configuration = "gpu" if model.device.type == "cuda" else "cpu"
    return EngineLM(SplitEngine(model, EngineSettings(configuration=configuration)), tokenizer,
                    batch_size=batch_size)

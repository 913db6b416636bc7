"""splitbench as an lm-evaluation-harness model: any lm-eval task scored by a model that runs under a SpliTEE
configuration (its masks, Slalom's fixed point, the unprotected baselines).

    import runners.lm_eval_model   # registers "splitbench" in lm_eval's model registry
    lm_eval.simple_evaluate(model="splitbench", model_args="model=smollm2-135m,configuration=ep1,epsilon=1",
                            tasks=[...])
    splitbench-lm-eval run --model splitbench --model_args model=smollm2-135m,configuration=ep1,epsilon=1 \\
        --include_path DIR --tasks TASK                  # lm-eval's own command line, with splitbench registered

lm-eval 0.4 finds models in its own registry only (no entry-point discovery), so the registration happens
on import of this module; `splitbench-lm-eval` is lm-eval's CLI after that import.

The model and the engine come from splitbench's own config (conf/, composed by Hydra with `model=`,
`configuration=`, `epsilon=` and `seed=` as overrides, then validated), so a task sees exactly what a
fidelity run computes:
- loglikelihood (multiple-choice and likelihood tasks): one forward pass per request batch through the
  engine, as generation's prefill runs it (SplitEngine.log_probs), masks included;
- generate_until: SplitEngine.generate, greedy (the engine decodes greedily; sampling settings in a task's
  generation_kwargs are not honoured), cut at the task's stop strings;
- loglikelihood_rolling (perplexity tasks): the whole text in one window, refused past the context length.

Which other systems fit: the token sanitisers change what the model sees, not how it computes, and are
scored by harness/sanitize/tasks.py on sanitised task files; the collab defences change the decoding
distribution of two models at once, which lm-eval's single-model requests cannot express. Neither is
served here.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from harness.errors import UserError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
NAME = "splitbench"


def compose(overrides: list[str]) -> Any:
    """splitbench's config with `overrides`, validated (one-line UserErrors), outside a Hydra app."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from harness import schema
    from runners.registry import runner_systems
    from runners.run import render_error

    try:
        if GlobalHydra.instance().is_initialized():   # inside a Hydra app or a test's initialize(): compose with it
            cfg = hydra_compose(config_name="config", overrides=overrides)
        else:
            with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
                cfg = hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise UserError(f"{NAME}: {render_error(exc)}") from None
    schema.validate(cfg, runner_systems())
    return cfg


@register_model(NAME)
class SplitbenchLM(LM):
    """An lm-eval LM whose every forward pass runs through a SplitEngine."""

    def __init__(self, model: str = "smollm2-135m", configuration: str = "ep1", epsilon: float | None = None,
                 seed: int | None = None, batch_size: int | str = 1, max_length: int | None = None,
                 **ignored: Any) -> None:
        super().__init__()
        from harness.models import load_model
        from runners.common import make_engine

        # lm-eval passes device/max_batch_size for every model; the engine decides where things run.
        ignored.pop("device", None)
        ignored.pop("max_batch_size", None)
        if ignored:
            raise UserError(f"{NAME}: unknown model_args {', '.join(sorted(ignored))} (known: model, configuration, "
                            "epsilon, seed, batch_size, max_length)")
        overrides = [f"model={model}", f"configuration={configuration}"]
        overrides += [f"epsilon={epsilon}"] if epsilon is not None else []
        overrides += [f"seed={seed}"] if seed is not None else []
        cfg = compose(overrides)
        self.cfg = cfg
        self.loaded = load_model(cfg.model, cache_dir=cfg.paths.cache_dir)
        self.tokenizer = self.loaded.tokenizer
        self.engine = make_engine(cfg, configuration, self.loaded.model)
        self.batch_size = 1 if str(batch_size).startswith("auto") else int(batch_size)
        limit = getattr(self.loaded.model.config, "max_position_embeddings", None)
        self.max_length = int(max_length or limit or 2048)

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

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self._score([self._pair(*req.args) for req in requests])

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
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
            ids = self._encode(context)[-(self.max_length - max_new):] or [self.prefix_token_id]
            result = self.engine.generate([ids], max_new, pad_token_id=self.tokenizer.pad_token_id,
                                          eos_token_id=self.tokenizer.eos_token_id, stop_at_eos=True)
            # The engine stops at EOS; the task's stop strings cut the text.
            text = self.tokenizer.decode(result.output_ids[0], skip_special_tokens=True)
            for stop in until:
                if stop and stop in text:
                    text = text.split(stop)[0]
            out.append(text)
        return out


def main() -> None:
    """`splitbench-lm-eval`: lm-eval's command line with the splitbench model registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv[0] = "splitbench-lm-eval"
    cli_evaluate()


if __name__ == "__main__":
    main()

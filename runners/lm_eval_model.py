"""splitbench as an lm-evaluation-harness model: any lm-eval task scored by a model that runs under a SpliTEE
configuration (its masks, Slalom's fixed point, the unprotected baselines) or sees its requests through a
token sanitiser (paper 001: stencil, dx_noise, dx_stencil, custext_plus).

    import runners.lm_eval_model   # registers "splitbench" in lm_eval's model registry
    lm_eval.simple_evaluate(model="splitbench", model_args="model=smollm2-135m,configuration=ep1,epsilon=1",
                            tasks=[...])
    splitbench-lm-eval run --model splitbench --model_args model=smollm2-135m,configuration=ep1,epsilon=1 \\
        --include_path DIR --tasks TASK                  # lm-eval's own command line, with splitbench registered

lm-eval 0.4 finds models in its own registry only (no entry-point discovery), so the registration happens
on import of this module; `splitbench-lm-eval` is lm-eval's CLI after that import.

The LM itself is harness/lm_eval_lm.EngineLM, the path the sanitisers' task accuracy also takes
(harness/sanitize/tasks.py, on the plain engine). The model and the engine come from splitbench's own config (conf/, composed by Hydra with `model=`,
`configuration=`, `epsilon=` and `seed=` as overrides, then validated), so a task sees exactly what a
fidelity run computes:
- loglikelihood (multiple-choice and likelihood tasks): one forward pass per request batch through the
  engine, as generation's prefill runs it (SplitEngine.log_probs), masks included;
- generate_until: SplitEngine.generate, greedy (the engine decodes greedily; sampling settings in a task's
  generation_kwargs are not honoured), cut at the task's stop strings;
- loglikelihood_rolling (perplexity tasks): the whole text in one window, refused past the context length.

Which other systems fit: the token sanitisers change what the model sees, not how it computes: each
request's context is sanitised on the client side (seeded by `seed`, once per distinct text, so every option
of a multiple-choice doc sees one sanitised context) and run on the plain engine (cpu/gpu, `baseline`).
lm-eval hands the model rendered requests, not the task's fields, so the whole context is sanitised, the
template's words included, and a stderr line says so; the continuations scored are left as they are, and
perplexity tasks are refused. The paper's per-field reading (user fields only, the template re-rendered) is
harness/sanitize/tasks.py's, for the four tasks it knows. The collab defences change the decoding
distribution of two models at once, which lm-eval's single-model requests cannot express: not served.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lm_eval.api.registry import register_model

from harness.errors import UserError
from harness.lm_eval_lm import NAME, EngineLM

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


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
class SplitbenchLM(EngineLM):
    """harness.lm_eval_lm.EngineLM on the engine of a configuration composed from splitbench's config."""

    def __init__(self, model: str = "smollm2-135m", configuration: str = "ep1", epsilon: float | None = None,
                 seed: int | None = None, batch_size: int | str = 1, max_length: int | None = None,
                 **ignored: Any) -> None:
        from harness import configurations
        from harness.models import load_model
        from runners.common import make_engine, resolve_baseline

        # lm-eval passes device/max_batch_size for every model; the engine decides where things run.
        ignored.pop("device", None)
        ignored.pop("max_batch_size", None)
        if ignored:
            raise UserError(f"{NAME}: unknown model_args {', '.join(sorted(ignored))} (known: model, configuration, "
                            "epsilon, seed, batch_size, max_length)")
        known = configurations.get(configuration)   # UserError for an unknown name, before any model loads
        if known.uses_epsilon and epsilon is None:
            # conf's default ε would silently pick a privacy level; the caller names it.
            raise UserError(f"{NAME}: configuration={configuration} needs its privacy parameter: add "
                            f"epsilon=... to model_args")
        overrides = [f"model={model}", f"configuration={configuration}"]
        overrides += [f"epsilon={epsilon}"] if epsilon is not None else []
        overrides += [f"seed={seed}"] if seed is not None else []
        cfg = compose(overrides)
        self.cfg = cfg
        self.loaded = load_model(cfg.model, cache_dir=cfg.paths.cache_dir)
        engine_configuration, view = configuration, None
        if known.system == configurations.SANITIZE:
            # A token sanitiser (paper 001) changes what the model sees, not how it computes: each request's
            # context is sanitised on the client side, then run on the plain engine, as runners/splitee/fidelity.py does.
            from harness.lm_eval_lm import SanitizedContexts
            from harness.sanitize import sanitizer

            sanitize = sanitizer.build(cfg.sanitize, configuration,
                                       configurations.effective_epsilon(configuration, cfg.epsilon),
                                       self.loaded.model, self.loaded.tokenizer)
            view = SanitizedContexts(sanitize, self.loaded.tokenizer, cfg.seed)
            engine_configuration = resolve_baseline(cfg.baseline)
            print(f"{NAME}: {configuration} sanitises each request's whole context (the task's template "
                  "included); the continuations scored are not sanitised", file=sys.stderr)
        super().__init__(make_engine(cfg, engine_configuration, self.loaded.model), self.loaded.tokenizer,
                         batch_size=1 if str(batch_size).startswith("auto") else int(batch_size),
                         max_length=max_length, view=view)


def main() -> None:
    """`splitbench-lm-eval`: lm-eval's command line with the splitbench model registered."""
    from lm_eval.__main__ import cli_evaluate

    from harness.lm_eval_tasks import with_shipped_tasks

    sys.argv[0] = "splitbench-lm-eval"
    sys.argv = with_shipped_tasks(sys.argv)   # the tasks splitbench ships (splitbench_mc) need no --include_path
    try:
        cli_evaluate()
    except UserError as exc:
        print(f"splitbench: error: {str(exc).removeprefix(NAME + ': ')}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()

"""splitbench as an lm-evaluation-harness model: any lm-eval task scored by a model that runs under a SpliTEE
configuration (its masks, Slalom's fixed point, the unprotected baselines) or sees its requests through a
token sanitiser (paper 001: stencil, dx_noise, dx_stencil, custext_plus).

    import runners.lm_eval_model   # registers "splitbench" in lm_eval's model registry
    lm_eval.simple_evaluate(model="splitbench", model_args="model=smollm2-135m,configuration=ep1,epsilon=1",
                            tasks=[...])
    splitbench-lm-eval run --model splitbench --model_args model=smollm2-135m,configuration=ep1,epsilon=1 \\
        --include_path DIR --tasks TASK                  # lm-eval's own command line, with splitbench registered

lm-eval 0.4 finds models in its own registry only (no entry-point discovery), so the registration happens
on import of this module; `splitbench-lm-eval` is lm-eval's CLI after that import. Plain `lm_eval --model
splitbench` cannot find the model: --help and the one-line error of an unknown model say so.

What `splitbench-lm-eval` adds to lm-eval's command line:
- results of each configuration in a folder of their own, `--output_path OUT` becoming
  `OUT/<model>/<configuration>/<eps=ε|eps=na>/` (the main CLI's layout; lm-eval's own would put every
  configuration of a model in `OUT/<model>/`, told apart by a timestamp only);
- the results' `config.device` and `config.batch_size` are what ran (lm-eval records its --device default,
  cuda:0, and its own --batch_size), `git_hash` is splitbench's commit, and `config.splitbench` holds the
  engine (EngineLM.get_model_info);
- `batch_size` in --model_args is the batch size (it wins over --batch_size, which lm-eval defaults to 1);
- epsilon given to a configuration that ignores it gets the main CLI's note;
- an argument lm-eval refuses while it reads its configuration (`--tasks nope_task`) or an unknown model is
  one line `splitbench: error: ...`, exit 2;
- progress bars stay off when stderr is not a terminal (harness/progress.py).

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

import functools
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any, NoReturn

from harness.progress import quiet_bars_in_environment

# Before lm_eval imports tqdm, which reads TQDM_DISABLE once: no progress bars in logs and pipes.
quiet_bars_in_environment()

from lm_eval.api.registry import register_model  # noqa: E402

from harness.errors import UserError  # noqa: E402
from harness.lm_eval_lm import NAME, EngineLM  # noqa: E402

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
        if not known.uses_epsilon and epsilon is not None:   # the main CLI's note (common.epsilon_ignored_note)
            print(f"splitbench: note: configuration {configuration} ignores epsilon, so epsilon={float(epsilon):g} "
                  "is the same run", file=sys.stderr, flush=True)
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
        self.run_info = {"model": self.loaded.name, "model_source": self.loaded.source,
                         "configuration": configuration, "epsilon": configurations.effective_epsilon(configuration, epsilon)}

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "SplitbenchLM":
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None) -> "SplitbenchLM":
        """lm-eval's constructor call with model_args over its own settings: lm-eval passes batch_size (its
        --batch_size, 1 unless given) beside model_args, and `batch_size=2` in model_args was a TypeError
        (multiple values for batch_size). What the user wrote in model_args is what they meant."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)


HELP = (f"splitbench-lm-eval is lm-eval's command line with the model `{NAME}` registered: --model {NAME} "
        "--model_args model=M,configuration=C[,epsilon=E,seed=S,batch_size=B]. Plain `lm_eval --model splitbench` "
        "cannot find it: lm-eval 0.4 looks models up in its own registry only and does not load plug-in entry "
        "points, so run this command instead. --output_path OUT holds each configuration's results in "
        "OUT/<model>/<configuration>/<eps=E|eps=na>/.")


def _run_folder(output_path: str, model_args: Any) -> str:
    """`OUT/<model>/<configuration>/<eps=ε|eps=na>/results.json` for lm-eval's tracker, which writes a path
    ending in .json as `results_<date>.json` beside the tasks' samples files in that folder."""
    from harness import run_identity

    args = model_args if isinstance(model_args, dict) else {}
    model, configuration = str(args.get("model", "smollm2-135m")), str(args.get("configuration", "ep1"))
    epsilon = args.get("epsilon")
    eps = run_identity.eps_dirname(configuration, epsilon) if epsilon is not None else "eps=na"
    parts = [run_identity.plain_dirname("model", model), run_identity.plain_dirname("configuration", configuration),
             eps]
    return str(Path(output_path, *parts, "results.json"))


def _with_provenance(evaluate: Any) -> Any:
    """lm_eval.simple_evaluate whose results record what ran: config.device and config.batch_size the
    engine's (EngineLM.get_model_info, under config.splitbench), not lm-eval's --device default and
    --batch_size."""
    @functools.wraps(evaluate)
    def run(*args: Any, **kwargs: Any) -> Any:
        results = evaluate(*args, **kwargs)
        info = (results or {}).get("config", {}).get("splitbench")
        if info:
            results["config"].update(device=info["device"], batch_size=info["batch_size"])
        return results
    return run


def _refused(exc: BaseException) -> str | None:
    """One line for an argument lm-eval refuses: a ValueError raised while it reads its configuration (an
    unknown task: lm_eval/config/) or looks the model up (lm_eval/api/registry.py); None for anything else."""
    frames = [f.filename.replace("\\", "/") for f in traceback.extract_tb(exc.__traceback__)]
    if not isinstance(exc, ValueError) or not frames:
        return None
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "/lm_eval/api/registry.py" in frames[-1]:
        return (f"{text.split(' Supported model names')[0]} (this command registers --model {NAME}; plain "
                f"`lm_eval --model {NAME}` cannot find it: lm-eval does not load plug-in entry points)")
    if "/lm_eval/config/" in frames[-1]:
        return f"{text} (lm-eval's task names: `lm-eval ls tasks`; a folder of your own: --include_path DIR)"
    return None


def main() -> None:
    """`splitbench-lm-eval`: lm-eval's command line (lm_eval.__main__.cli_evaluate) with the splitbench model
    registered and what the module docstring lists."""
    import lm_eval
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    def refuse(message: str) -> NoReturn:
        print(f"splitbench: error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2)

    from harness.lm_eval_tasks import with_shipped_tasks

    sys.argv[0] = "splitbench-lm-eval"
    sys.argv = with_shipped_tasks(sys.argv)   # the tasks splitbench ships (splitbench_mc) need no --include_path
    setup_logging()
    parser = HarnessCLI()
    parser._parser.prog = "splitbench-lm-eval"
    for node in (parser._parser, parser._subparsers.choices["run"]):   # raw-text help: wrapped here
        node.description = f"{textwrap.fill(HELP, 100)}\n\n{node.description or ''}"
    args = parser.parse_args()
    if isinstance(getattr(args, "model_args", None), dict) and "batch_size" in args.model_args:
        args.batch_size = args.model_args["batch_size"]   # what lm-eval prints and records is what runs
    if getattr(args, "model", None) == NAME and getattr(args, "output_path", None) \
            and not str(args.output_path).endswith(".json"):
        try:
            args.output_path = _run_folder(args.output_path, args.model_args)
        except UserError as exc:
            refuse(str(exc))
    lm_eval.simple_evaluate = _with_provenance(lm_eval.simple_evaluate)
    try:
        parser.execute(args)
    except UserError as exc:
        refuse(str(exc).removeprefix(NAME + ": "))
    except ValueError as exc:
        message = _refused(exc)
        if message is None:
            raise
        refuse(message)


if __name__ == "__main__":
    main()

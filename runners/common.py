"""What every runner does the same way: load the model and workload, build engines from the config,
generate in batches, and finish a run (the results header DESIGN.md's contract names, provenance, the
atomic write, the terminal summary and the W&B mirror) through one `finish()`.

Runners compose; this module holds their shared plumbing so each runner file keeps only its experiment.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness import configurations
from harness.errors import UserError


@dataclass
class Inputs:
    """The model, the workload and the prompts' token ids one run works on."""

    loaded: Any                 # harness.models.LoadedModel
    workload: Any               # harness.workloads.Workload
    prompts: list[list[int]]
    pad: int
    eos: int | None

    def decode_all(self, rows: Sequence[Sequence[int]]) -> list[str]:
        """Generated ids as text, special tokens dropped (what every text metric compares)."""
        return [self.loaded.tokenizer.decode(ids, skip_special_tokens=True) for ids in rows]

    def epsilon_lengths(self, reading: str) -> list[int]:
        """Each prompt's n for EPN's ε = 1/√n: `text`, the prompt's own text tokens (the paper's reading),
        or `input_ids`, every token the model sees (chat template included); cfg.epn_n chooses."""
        if reading == "text":
            return [p.n_text_tokens for p in self.workload.prompts]
        return [len(p) for p in self.prompts]

    def generate_kwargs(self, cfg: DictConfig) -> dict[str, Any]:
        """Keyword arguments of generate_batches: the config's `generation` section and EPN's n (epn_n)."""
        gen = cfg.generation
        return dict(batch_size=gen.batch_size, max_new_tokens=gen.max_new_tokens, pad_token_id=self.pad,
                    eos_token_id=self.eos, stop_at_eos=gen.stop_at_eos,
                    epsilon_lengths=self.epsilon_lengths(cfg.epn_n))


def load_inputs(cfg: DictConfig, placement: Any = None) -> Inputs:
    """The model (placed as `placement` says: a system's placement node; None = float32 on the CPU), the
    workload and its prompts' ids."""
    from harness.models import load_model
    from harness.workloads import load_workload

    loaded = load_model(cfg.model, cache_dir=cfg.paths.cache_dir, placement=placement)
    workload = load_workload(cfg.workload, loaded.tokenizer, cfg.seed)
    pad, eos = special_ids(loaded.tokenizer)
    return Inputs(loaded, workload, [list(p.input_ids) for p in workload.prompts], pad, eos)


def results_header(cfg: DictConfig, experiment: str, inputs: Inputs | None = None, *,
                   generation: bool | dict[str, Any] = True, model: Any = None, workload: str | None = None,
                   workload_info: dict[str, Any] | None = None, n_prompts: int | None = None) -> dict[str, Any]:
    """The results.json fields every experiment shares (DESIGN.md contract), in one order.

    `inputs`: the run's model, workload and prompts (load_inputs). A runner whose model or data are its own
    names them instead: `model` a LoadedModel (its name and source), or the name alone of a model another
    run ran (no model_source); `workload` its name, `workload_info` its record (left out when None),
    `n_prompts` how many examples it scored. `generation`: True records cfg.generation (the run generates
    with it), False nothing, a dict the run's own generation settings."""
    if inputs is not None:
        model, workload, n_prompts = inputs.loaded, inputs.workload.name, len(inputs.prompts)
        workload_info = {k: v for k, v in workload_record(inputs.workload).items() if k != "name"}
    header: dict[str, Any] = {"experiment": experiment, "experiment_name": cfg.experiment_name, "status": "ok"}
    if model is None or isinstance(model, str):
        header["model"] = model
    else:
        header.update(model=model.name, model_source=model.source)
    header["workload"] = workload
    if workload_info is not None:
        header["workload_info"] = workload_info
    header["n_prompts"] = n_prompts
    if generation is True:
        header["generation"] = OmegaConf.to_container(cfg.generation, resolve=True)
    elif generation:
        header["generation"] = dict(generation)
    return header


def finish(cfg: DictConfig, ctx: Any, results: dict[str, Any], samples: Sequence[dict[str, Any]], *,
           summary: Callable[[dict[str, Any]], str], engines: dict[str, dict] | None = None,
           provenance_extra: dict[str, Any] | None = None, side_files: dict[str, Any] | None = None,
           before_done: Callable[[], None] | None = None, mirror_rows: Sequence[dict[str, Any]] | None = None,
           mirror_columns: Sequence[str] = (), placement: dict[str, Any] | None = None,
           mirror_history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The tail every runner shares: add the privacy parameter (harness.configurations.privacy_parameter of
    its `configuration` and `epsilon`, unless the runner recorded its own), tags, config hash, run name and
    provenance to `results` (which starts with results_header), write side files, samples.jsonl, results.json and .done atomically
    (ctx.run_dir.write_results), print `summary(results)`, then mirror to W&B (rows: `mirror_rows`, default
    the samples; step history: `mirror_history`, see step_history). `placement`: where each of the run's
    models ran, by role (LoadedModel.placement()); None for SpliTEE's runners, whose model is float32 on the CPU
    with the engines' accelerator in `engines`. Returns the full results."""
    from harness import provenance
    from harness.wandb_mirror import mirror

    # the job's wall and CPU time, model loading included (runners/plan.py estimates a sweep's cost from the
    # wall time; the CPU time sums to a sweep's cost across sessions and loads)
    started = getattr(ctx, "started", None)
    wall = {} if started is None else {"wall_s": round(time.time() - started, 3),
                                       "cpu_s": round(time.process_time() - ctx.started_cpu, 3)}
    results = {
        **results,
        "privacy_parameter": results.get("privacy_parameter") or configurations.privacy_parameter(
            results.get("configuration"), results.get("epsilon")),
        "tags": list(cfg.tags),
        "config_hash": ctx.config_hash,
        "run_dir": ctx.name,
        "provenance": provenance.collect(OmegaConf.to_container(cfg, resolve=True), cfg.seed, engines=engines,
                                         extra={"placement": placement or _splitee_placement(), **wall,
                                                **(provenance_extra or {})}),
    }
    ctx.run_dir.write_results(results, samples, side_files=side_files, before_done=before_done)
    print(summary(results), flush=True)
    mirror(cfg, ctx.run_dir.path, results, samples if mirror_rows is None else mirror_rows, name=ctx.name,
           table_columns=tuple(mirror_columns), history=mirror_history)
    return results


def _splitee_placement() -> dict[str, Any]:
    """SpliTEE's models: float32 on the CPU (the TEE side); the engines put the offloaded ops on the accelerator
    and record it under provenance.engines."""
    import torch

    from harness.devices import describe_device

    return {"model": {"device": describe_device(torch.device("cpu")), "dtype": "float32", "device_map": None,
                      "note": "offloaded ops on each engine's accelerator (provenance.engines)"}}


def step_history(series: dict[str, Sequence[float]]) -> list[dict[str, Any]]:
    """Per-step series (e.g. one training loss curve per seed) as W&B step records: one record per step
    index holding every series that has that step, so steps only increase (wandb.log drops a step that
    goes back)."""
    n = max((len(v) for v in series.values()), default=0)
    return [{"step": i, **{k: float(v[i]) for k, v in series.items() if i < len(v)}} for i in range(n)]


def batch_history(series: dict[str, Sequence[float | None]]) -> list[dict[str, Any]]:
    """Per-batch series (e.g. each batch's tokens per second, BatchedGeneration.batch_tokens_per_second) as W&B
    step records, the step the batch's index; a batch with no value (None) is left out of its series."""
    return paired_history({k: [(i, x) for i, x in enumerate(v) if x is not None] for k, v in series.items()})


def paired_history(series: dict[str, Sequence[Sequence[float]]]) -> list[dict[str, Any]]:
    """Series of (step, value) pairs (e.g. a training's losses at its validation steps) as W&B step records:
    one record per step any series has, in increasing step order, holding every series' value there."""
    steps: dict[int, dict[str, float]] = {}
    for name, pairs in series.items():
        for step, value in pairs:
            steps.setdefault(int(step), {})[name] = float(value)
    return [{"step": s, **steps[s]} for s in sorted(steps)]


def loss_history(curves: dict[str, dict | None]) -> list[dict[str, Any]]:
    """The W&B step history of learned attackers' training (attacks/inversion.train): `<name>/train_loss`
    and `<name>/val_loss` at each validation step, from each curve's `train_history` and `val_history`
    ((step, loss) pairs); a None curve logs nothing."""
    series: dict[str, Any] = {}
    for name, curve in curves.items():
        if curve is not None:
            series[f"{name}/train_loss"] = curve["train_history"]
            series[f"{name}/val_loss"] = curve["val_history"]
    return paired_history(series)


def tradeoff(*, leakage_metric: str | None = None, leakage: float | None = None,
             leakage_ci: Sequence[float] | None = None, attacker: str | None = None,
             utility_metric: str | None = None, utility: float | None = None,
             utility_ci: Sequence[float] | None = None, reference: str | None = None,
             leakage_floor: float | None = None, point: str | None = None,
             setting: str | None = None) -> dict[str, Any]:
    """The run's part of one point on the cross-system privacy–utility chart (results.json `tradeoff`; the
    report's tradeoff section, runners/report/tradeoff.py, puts every system's runs on the same axes).

    Leakage is what the strongest attacker run against this configuration recovered, in % (higher =
    worse; `leakage_floor`, in %, its no-signal floor where one exists); utility is what the protected run
    kept against `reference`, in % (higher = better); each with its 95% interval over examples. A run that
    measures only one of them leaves the other None (SpliTEE's fidelity runs give utility, its attack runs
    leakage); the report joins parts of the same system, model, configuration, privacy parameter and
    `point` (what else tells the configuration's runs apart, e.g. a sanitiser's window "L=5 σ=1.25"; runs
    that must join, such as a fidelity run and the attack runs of the same configuration, give the same).
    `setting` is the benchmark and mode a run that measures both halves measured them on (collab's benchmark,
    fusion mode and α; a sanitiser's lm-eval tasks; split fine-tuning's data and split): runs of different
    settings never join, and each setting is its own series on the chart; a run without one (a sanitiser's
    fidelity run) joins every setting's point of its configuration."""
    def interval(ci: Sequence[float] | None) -> list[float] | None:
        return None if ci is None or ci[0] is None or ci[1] is None else [float(ci[0]), float(ci[1])]

    def opt(value: float | None) -> float | None:
        return None if value is None else float(value)

    return {"point": point or None, "setting": setting or None,
            "leakage": None if leakage is None else {
                "metric": leakage_metric, "value": float(leakage), "ci": interval(leakage_ci),
                "attacker": attacker, "floor": opt(leakage_floor)},
            "utility": None if utility is None else {
                "metric": utility_metric, "value": float(utility), "ci": interval(utility_ci),
                "reference": reference}}


def overridden(key: str) -> bool:
    """Whether this job's command-line overrides (its own, in a sweep) set `key`."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return False
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in HydraConfig.get().overrides.task)


def epsilon_ignored_note(cfg: DictConfig) -> str | None:
    """describe_skip for runners of one configuration: why a job that set ε is the same run as another
    (its configuration ignores ε), else None."""
    if not configurations.get(cfg.configuration.name).uses_epsilon and overridden("epsilon"):
        return (f"configuration {cfg.configuration.name} ignores epsilon, so epsilon={cfg.epsilon:g} "
                "is the same run")
    return None


def test_side(cfg: DictConfig, inputs: Inputs, seed: int) -> tuple[str, list[list[int]]]:
    """The configuration the engine runs for cfg.configuration and the prompts it is given. SpliTEE's
    configurations: themselves and the prompts as they are. A token sanitiser (paper 001): its prompts'
    text tokens sanitised on the client side (seeded by `seed`), then run as the baseline does (the plain
    gpu/cpu engine, cfg.baseline)."""
    name = cfg.configuration.name
    if configurations.get(name).system != configurations.SANITIZE:
        return name, inputs.prompts
    from harness.sanitize import prompts, sanitizer

    loaded = inputs.loaded
    sanitize = sanitizer.build(cfg.sanitize, name, cfg.epsilon, loaded.model, loaded.tokenizer)
    return resolve_baseline(cfg.baseline), prompts.sanitize_prompts(sanitize, inputs.workload.prompts,
                                                                      loaded.tokenizer, seed).input_ids


def test_point(cfg: DictConfig) -> str | None:
    """What tells two runs of one configuration and privacy parameter apart on the privacy–utility chart
    (`tradeoff` `point`), for the runners that run a sanitiser (sanitize, and fidelity's test side): the window
    of the Stencil mechanisms, the output set of CusText+; None for any other configuration."""
    name, section = cfg.configuration.name, cfg.sanitize
    if name in ("stencil", "dx_stencil"):
        return f"L={section.window} σ={section.sigma:g}"
    if name == "custext_plus":
        return f"k={section.custext_k}"
    return None


def resolve_baseline(choice: str) -> str:
    """`auto` → gpu where CUDA exists, else cpu; explicit choices stand."""
    if choice != "auto":
        return choice
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


def mask_seeds(cfg: DictConfig) -> list[int]:
    """The mask replicates of a run: cfg.mask_seeds, or the run's seed alone (null)."""
    return [int(cfg.seed)] if cfg.mask_seeds is None else [int(s) for s in cfg.mask_seeds]


def make_engine(cfg: DictConfig, configuration: str, model: Any, *, seed: int | None = None) -> Any:
    """A SplitEngine for `configuration` from cfg.engine (a `_target_` node for EngineSettings); `seed`
    seeds its masks (default: the run's seed)."""
    from hydra.utils import instantiate

    from harness.splitee.engine import SplitEngine

    settings = instantiate(
        cfg.engine,
        configuration=configuration,
        epsilon=configurations.effective_epsilon(configuration, cfg.epsilon),
        seed=cfg.seed if seed is None else seed,
        _convert_="all",  # plain lists, not ListConfig, inside the settings
    )
    settings.offload = tuple(settings.offload)
    return SplitEngine(model, settings)


@dataclass
class BatchedGeneration:
    """GenerationResults of consecutive batches, joined: ids in prompt order, times and bytes summed."""

    output_ids: list[list[int]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    boundary: dict[str, float] = field(default_factory=dict)
    bank: dict[str, Any] = field(default_factory=dict)
    epsilons: list[float | None] = field(default_factory=list)
    n_generated_tokens: int = 0
    slalom: dict[str, Any] | None = None  # Slalom's wrap-arounds per op, summed over batches (None: not slalom)
    # Each batch's generation wall time divided by its prompts, in batch order: a slow spell of a shared
    # machine shows as one batch out of line with the others (the timing report prints them).
    batch_seconds_per_prompt: list[float] = field(default_factory=list)
    # Each batch's generated tokens over its generation wall time (None: no time measured), in batch order:
    # the W&B step history (batch_history), not results.json.
    batch_tokens_per_second: list[float | None] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float | None:
        total = self.timings.get("total", 0.0)
        return self.n_generated_tokens / total if total > 0 else None

    def per_prompt(self) -> dict[str, float]:
        n = max(1, len(self.output_ids))
        return {k: v / n for k, v in self.timings.items()}

    def add(self, res: Any, n_prompts: int) -> None:
        """Join the next batch's GenerationResult (of n_prompts prompts)."""
        from harness.splitee.mechanisms import merge_slalom_stats

        self.output_ids.extend([list(map(int, ids)) for ids in res.output_ids])
        for key, value in res.timings.items():
            self.timings[key] = self.timings.get(key, 0.0) + float(value)
        for key, value in (res.boundary or {}).items():
            self.boundary[key] = self.boundary.get(key, 0) + value
        self.bank = dict(res.bank or {})  # the engine's bank counters are cumulative: keep the last
        self.epsilons.extend(getattr(res, "epsilons", None) or [None] * n_prompts)
        self.n_generated_tokens += int(res.n_generated_tokens)
        self.slalom = merge_slalom_stats(self.slalom, getattr(res, "slalom", None))
        total = float(res.timings.get("total", 0.0))
        self.batch_seconds_per_prompt.append(total / max(1, n_prompts))
        self.batch_tokens_per_second.append(int(res.n_generated_tokens) / total if total > 0 else None)


def generate_batches(engine: Any, prompts: Sequence[Sequence[int]], *, batch_size: int, max_new_tokens: int,
                     pad_token_id: int, eos_token_id: int | None, stop_at_eos: bool, desc: str,
                     epsilon_lengths: Sequence[int] | None = None) -> BatchedGeneration:
    from harness.progress import progress

    out = BatchedGeneration()
    starts = range(0, len(prompts), batch_size)
    for start in progress(starts, desc=desc, unit="batch"):
        batch = [list(p) for p in prompts[start:start + batch_size]]
        res = engine.generate(batch, max_new_tokens, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                              stop_at_eos=stop_at_eos,
                              epsilon_lengths=None if epsilon_lengths is None
                              else list(epsilon_lengths[start:start + batch_size]))
        out.add(res, len(batch))
    return out


def special_ids(tokenizer: Any) -> tuple[int, int | None]:
    """(pad, eos) for left-padded batches: the tokenizer's pad, else its eos, else 0."""
    eos = tokenizer.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = eos if eos is not None else 0
    return int(pad), (None if eos is None else int(eos))


def workload_record(workload: Any) -> dict[str, Any]:
    return {"name": workload.name, "source": workload.source, "chat_template": workload.chat_template,
            "filter": dict(workload.filter), "prompt_ids": [p.id for p in workload.prompts]}


def load_semantic(cfg: DictConfig) -> Any:
    """The similarity model cfg.semantic_model (None: the metric is skipped), cached under paths.cache_dir."""
    if not cfg.semantic_model:
        return None
    from harness.models import cache_root
    from metrics.semantic import SemanticModelError, load_semantic_model

    try:
        return load_semantic_model(cfg.semantic_model, cache_dir=cache_root(cfg.paths.cache_dir))
    except SemanticModelError as exc:   # metrics' own error: the user's to fix (not installed, unknown)
        raise UserError(str(exc)) from None


def summary_head(results: dict[str, Any], *details: str, model: str | None = None,
                 against: str | None = None) -> str:
    """The first line of a run's terminal summary, the same in every runner: "<experiment_name>: <model> ·
    <configuration> (<privacy parameter>)[ vs <against>] · <details> · ...". The parameter is named as the
    configuration names it (configurations.parameter_label: ε=1, η=150, λ=4) and left out where it does
    not use one; `model` replaces results' model (e.g. a pair of models)."""
    parameter = configurations.parameter_label(results["configuration"], results["epsilon"])
    head = (f"{results['experiment_name']}: {model or results['model']} · {results['configuration']}"
            f"{f' ({parameter})' if parameter else ''}{f' vs {against}' if against else ''}")
    return " · ".join([head, *details])


def metric_lines(metrics: dict[str, Any], names: Sequence[str], width: int) -> list[str]:
    """The metric table of a run's terminal summary: a header, then "name  value  [lo, hi]" for each of
    `names` the run has (results.json has everything)."""
    lines = [f"  {'metric':<{width}}{'value':>8}   95% CI"]
    for name in names:
        value = metrics.get(name)
        if value is None:
            continue
        lo, hi = metrics.get(f"{name}_ci_lo"), metrics.get(f"{name}_ci_hi")
        ci = f"[{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
        lines.append(f"  {name:<{width}}{value:>8.2f}   {ci}")
    return lines

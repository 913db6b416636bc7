"""The floating-point study's protocol (paper §7.3.2, Table 4; docs/fp_bound.md §7): op instances with
the σ the engine would mask their inputs with, and the trials that measure the unmasking error of each
against the exact reference and the bound.

For each op instance (a weight matrix and the captured real inputs of that op, harness/splitee/numerics/op_inputs.py)
`draw` picks `trials` output elements as a grid: ⌈trials/r⌉ captured input vectors, each masked once with
η ~ N(0, σ²I) as the engine masks a token (one mask for all output rows), times r weight rows drawn
without replacement; every precision and kernel (harness/splitee/numerics/kernels.py) sees the same draws.
`study_model` runs the whole protocol on a model; harness/splitee/numerics/summary.py pools the trials.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from harness import configurations
from harness.architectures import OP_MEMBERS, decoder_layers
from harness.progress import progress as progress_bar
from harness.splitee.noise_bank import stream_seed
from harness.splitee.numerics import kernels as kernel_grids
from harness.splitee.numerics.bound import bound_from_sums, evaluation_factor, first_order_bound
from harness.splitee.numerics.precisions import U64, precision
from harness.splitee.numerics.reference import reference_dot_grid, reference_error_bound
from harness.splitee.offload import all_op_instances, op_linears
from harness.splitee.sensitivity import down_sensitivity, sensitivity_table

if TYPE_CHECKING:
    from harness.splitee.numerics.op_inputs import CapturedInputs


def studied_configurations() -> tuple[str, ...]:
    """The configurations whose masking the study models: the Gaussian ones (σ = Δ·noise factor), then
    the unmasked split one (plain: σ = 0, the error of the unmasked offload alone)."""
    plain = tuple(n for n in configurations.names(split=True, gaussian=False)
                  if configurations.get(n).mechanism == "plain")
    return configurations.names(gaussian=True) + plain


def member_names(op: str) -> tuple[str, ...]:
    """q, k, v / o / gate, up / lm_head: the paper's names of an op's linear modules."""
    if op == "lm_head":
        return ("lm_head",)
    return tuple(m.rsplit(".", 1)[-1].removesuffix("_proj") for m in OP_MEMBERS[op])


# ---------------------------------------------------------------------------------------------------
# Instances
# ---------------------------------------------------------------------------------------------------


@dataclass
class OpInstance:
    """One weight matrix and the captured real inputs of its op (paper: one of 6·L + 1 instances)."""

    op: str                       # q, k, v, o, gate, up, lm_head, down
    layer: int | None
    weight: torch.Tensor          # [out, d], fp32
    inputs: torch.Tensor          # [K, d], fp32: captured inputs
    sigma: torch.Tensor           # [K], fp64: the mask scale each captured vector would get
    offloaded: bool = True
    delta: float | None = None

    @property
    def label(self) -> str:
        return self.op if self.layer is None else f"{self.op}[{self.layer}]"


def sigma_per_vector(delta: float, prompt_lengths: torch.Tensor, configuration: str, epsilon: float | None,
                     sigma_scale: float = 1.0) -> torch.Tensor:
    """The mask scale each captured vector would get: Δ times its prompt row's noise factor
    (harness/configurations.noise_factors: sigma_scale/ε, 0 without noise), as in
    harness/splitee/mechanisms.Gaussian."""
    if configuration not in studied_configurations():
        raise ValueError(f"no Gaussian masks in configuration {configuration!r}")
    factors = configurations.noise_factors(configuration, epsilon, prompt_lengths.tolist(), sigma_scale)
    return delta * torch.tensor(factors, dtype=torch.float64)


def build_instances(model: nn.Module, captured: CapturedInputs, configuration: str, epsilon: float | None, *,
                    offload: Sequence[str], sensitivity_rule: str = "paper", sigma_scale: float = 1.0,
                    include_down: bool = True) -> list[OpInstance]:
    """One OpInstance per weight matrix of every offloaded op (q, k, v, o, gate, up per layer; the LM
    head), with that op's Δ (harness/splitee/sensitivity.py); Down per layer as the non-offloaded
    reference, with `down_sensitivity`. Paper order: layer by layer, the LM head last, Down after."""
    ops = tuple(o for o in ("qkv", "o", "gate_up", "lm_head") if o in offload)
    deltas = {(row.op, row.layer): row.delta for row in sensitivity_table(model, ops, sensitivity_rule)}
    out: list[OpInstance] = []
    for op, layer in all_op_instances(model, ops):
        x, lengths = captured.inputs[(op, layer)], captured.prompt_lengths[(op, layer)]
        sigma = sigma_per_vector(deltas[(op, layer)], lengths, configuration, epsilon, sigma_scale)
        for name, (_, module) in zip(member_names(op), op_linears(model, op, layer)):
            out.append(OpInstance(name, layer, module.weight.detach().float(), x, sigma, True, deltas[(op, layer)]))
    if include_down:
        for row in down_sensitivity(model):
            x, lengths = captured.inputs[("down", row.layer)], captured.prompt_lengths[("down", row.layer)]
            sigma = sigma_per_vector(row.delta, lengths, configuration, epsilon, sigma_scale)
            weight = decoder_layers(model)[row.layer].mlp.down_proj.weight.detach().float()
            out.append(OpInstance("down", row.layer, weight, x, sigma, False, row.delta))
    return out


# ---------------------------------------------------------------------------------------------------
# Trials
# ---------------------------------------------------------------------------------------------------


@dataclass
class InstanceStats:
    """Sums over one instance's trials, for one precision and kernel."""

    op: str
    layer: int | None
    offloaded: bool
    precision: str
    kernel: str
    accumulate: str               # the accumulation precision the bound assumed
    d: int
    delta: float | None
    sigma_mean: float
    n: int = 0                    # finite trials
    n_overflow: int = 0           # trials whose result over- or underflowed to inf/nan (excluded)
    sum_error: float = 0.0
    sum_bound: float = 0.0        # +inf when the bound does not exist (d·u_acc ≥ 1)
    sum_first_order: float = 0.0
    sum_abs_exact: float = 0.0
    violations: int = 0           # trials with error > bound (+ the reference's own tolerance)
    violations_first_order: int = 0
    max_error: float = 0.0
    max_error_over_bound: float = 0.0
    max_reference_slack_over_bound: float = 0.0

    @property
    def mean_error(self) -> float:
        return self.sum_error / self.n if self.n else math.nan

    @property
    def mean_bound(self) -> float:
        return self.sum_bound / self.n if self.n else math.nan

    def as_dict(self) -> dict:
        return {**asdict(self), "mean_error": self.mean_error, "mean_bound": self.mean_bound}


@dataclass
class Draws:
    """One instance's trials: which captured vectors (each masked once), which weight rows, the masks."""

    vectors: torch.Tensor         # [B] indices into inputs
    rows: torch.Tensor            # [r] indices into weight rows
    eta: torch.Tensor             # [B, d] fp64: σ·z


def draw(instance: OpInstance, trials: int, rows_per_vector: int, generator: torch.Generator) -> Draws:
    out, d = instance.weight.shape
    r = min(rows_per_vector, out)
    b = max(1, math.ceil(trials / r))
    vectors = torch.randint(0, instance.inputs.shape[0], (b,), generator=generator)
    rows = torch.randperm(out, generator=generator)[:r]
    z = torch.randn(b, d, generator=generator, dtype=torch.float64)
    return Draws(vectors, rows, instance.sigma[vectors].double()[:, None] * z)


def trial_grid(trials: int, rows_per_vector: int) -> str:
    """How `draw` lays out `trials` output elements per instance, in words (results.json)."""
    vectors = -(-trials // rows_per_vector)
    return f"{vectors} vectors x min({rows_per_vector}, out_features) rows"


def _measure(stats: InstanceStats, err: torch.Tensor, bound: torch.Tensor, first: torch.Tensor, ref: torch.Tensor,
             slack: torch.Tensor, finite: torch.Tensor) -> None:
    err, bound, first, ref, slack = (t[finite] for t in (err, bound, first, ref, slack))
    stats.n += int(err.numel())
    stats.n_overflow += int((~finite).sum())
    if err.numel() == 0:
        return
    stats.sum_error += err.sum().item()
    stats.sum_bound += bound.sum().item()
    stats.sum_first_order += first.sum().item()
    stats.sum_abs_exact += ref.abs().sum().item()
    stats.violations += int((err > bound + slack).sum())
    stats.violations_first_order += int((err > first + slack).sum())
    stats.max_error = max(stats.max_error, err.max().item())
    ratio = torch.where(bound > 0, err / bound, torch.where(err > 0, math.inf, 0.0))
    stats.max_error_over_bound = max(stats.max_error_over_bound, ratio.max().item())
    srat = torch.where(bound > 0, slack / bound, torch.zeros_like(slack))
    stats.max_reference_slack_over_bound = max(stats.max_reference_slack_over_bound, srat.max().item())


def study_instance(instance: OpInstance, draws: Draws, precisions: Sequence[str], kernels: Sequence[str],
                   accumulation: dict[str, str], chunk_elements: int = 8_000_000) -> list[InstanceStats]:
    """Every (precision, kernel) on one instance's draws; the work is split over chunks of vectors so
    that a [chunk, r, d] product tensor stays below `chunk_elements` elements."""
    w_rows = instance.weight[draws.rows]
    r, d = w_rows.shape
    out: list[InstanceStats] = []
    chunk = max(1, chunk_elements // max(1, r * d))
    sigma_mean = instance.sigma[draws.vectors].double().mean().item()
    for name in precisions:
        prec = precision(name)
        dt = prec.dtype
        w = w_rows.to(dt)
        w64 = w.double()
        per_kernel = {k: InstanceStats(instance.op, instance.layer, instance.offloaded, prec.name, k,
                                       accumulation.get(k, prec.name), d, instance.delta, sigma_mean)
                      for k in kernels}
        for start in range(0, draws.vectors.numel(), chunk):
            idx = draws.vectors[start:start + chunk]
            x = instance.inputs[idx].to(dt)
            eta = draws.eta[start:start + chunk].to(dt)
            x64, eta64 = x.double(), eta.double()
            ref, method = reference_dot_grid(x, w)                   # [b, r], of the working operands
            s_xeta = (x64 + eta64).abs() @ w64.abs().T
            s_eta = eta64.abs() @ w64.abs().T
            s_wx = x64.abs() @ w64.abs().T
            first = first_order_bound(s_xeta, s_eta, d, prec) * evaluation_factor(d)
            masked = x + eta                                        # fl(x + η) in the working precision
            for kernel in kernels:
                stats = per_kernel[kernel]
                a, b = kernel_grids.grid(kernel, masked, w), kernel_grids.grid(kernel, eta, w)
                result = (a - b).double()                           # fl(a − b), exact in fp64 after
                err = (result - ref).abs()
                bound = bound_from_sums(s_xeta, s_eta, ref.abs(), d, prec, stats.accumulate)
                slack = reference_error_bound(ref, s_wx, d, method) + U64 * err
                finite = torch.isfinite(a.double()) & torch.isfinite(b.double()) & torch.isfinite(result)
                _measure(stats, err, bound, first, ref, slack, finite)
        out.extend(per_kernel[k] for k in kernels)
    return out


def run_study(instances: Iterable[OpInstance], *, precisions: Sequence[str], kernels: Sequence[str], trials: int,
              rows_per_vector: int, seed: int, probes: dict[str, dict] | None = None,
              chunk_elements: int = 8_000_000,
              progress: Callable[[OpInstance], None] | None = None) -> list[InstanceStats]:
    """`study_instance` over every instance with its own random stream (seed, label)."""
    probes = probes or {}
    accumulation = {name: {"library": kernel_grids.library_accumulation(name, probes.get(name)), "sequential": name}
                    for name in precisions}
    stats: list[InstanceStats] = []
    instances = list(instances)
    for inst in progress_bar(instances, desc=f"fp study ({', '.join(precisions)})", unit="op"):
        generator = torch.Generator().manual_seed(stream_seed(seed, "fp_error", inst.label))
        draws = draw(inst, trials, rows_per_vector, generator)
        for name in precisions:
            stats.extend(study_instance(inst, draws, [name], kernels, accumulation[name], chunk_elements))
        if progress is not None:
            progress(inst)
    return stats


# ---------------------------------------------------------------------------------------------------
# The protocol on a model
# ---------------------------------------------------------------------------------------------------


@dataclass
class StudyRun:
    """What `study_model` found: the accumulation probes, the instances and every trial's sums."""

    probes: dict[str, dict]
    instances: list[OpInstance]
    stats: list[InstanceStats]

    def instance_counts(self) -> dict[str, int]:
        offloaded = sum(1 for i in self.instances if i.offloaded)
        return {"offloaded": offloaded, "down": len(self.instances) - offloaded}

    def design(self, precisions: Sequence[str], down_precisions: Sequence[str], kernels: Sequence[str], trials: int,
               rows_per_vector: int) -> dict[str, Any]:
        """results.json's record of what was run: the headline (the first precision and kernel), every
        precision (Down's apart) and kernel, the instances and the trials per instance."""
        return {"headline": {"precision": precisions[0], "kernel": kernels[0]}, "precisions": list(precisions),
                "down_precisions": list(down_precisions), "kernels": list(kernels),
                "n_instances": self.instance_counts(),
                "trials_per_instance": {"requested": trials, "rows_per_vector": rows_per_vector,
                                        "actual": trial_grid(trials, rows_per_vector)}}

    def sensitivities(self) -> dict[str, list[dict[str, Any]]]:
        """Δ and mean σ per op instance (op, layer), offloaded and Down (sensitivity.json)."""
        def rows(offloaded: bool) -> list[dict[str, Any]]:
            seen, out = set(), []
            for i in self.instances:
                if i.offloaded == offloaded and (i.op, i.layer) not in seen:
                    seen.add((i.op, i.layer))
                    out.append({"op": i.op, "layer": i.layer, "delta": i.delta, "sigma_mean": float(i.sigma.mean())})
            return out

        return {"offloaded": rows(True), "down": rows(False)}


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def study_model(model: nn.Module, captured: CapturedInputs, configuration: str, epsilon: float | None, *,
                offload: Sequence[str], sensitivity_rule: str, sigma_scale: float, precisions: Sequence[str],
                kernels: Sequence[str], trials: int, rows_per_vector: int, seed: int, include_down: bool,
                down_precisions: Sequence[str] = (), threads: int | None = None) -> StudyRun:
    """The paper's protocol on `model`: probe how torch accumulates in every precision, build the
    instances (Down too with `include_down`), then run the offloaded ones in `precisions` and Down in
    `down_precisions` (none: Down is described, not run), on `threads` torch threads."""
    with _torch_threads(threads):
        probes = {p: kernel_grids.probe_accumulation(p) for p in dict.fromkeys([*precisions, *down_precisions])}
        instances = build_instances(model, captured, configuration, epsilon, offload=tuple(offload),
                                    sensitivity_rule=sensitivity_rule, sigma_scale=sigma_scale,
                                    include_down=include_down)
        common = dict(kernels=list(kernels), trials=trials, rows_per_vector=rows_per_vector, seed=seed, probes=probes)
        stats = run_study([i for i in instances if i.offloaded], precisions=list(precisions), **common)
        if down_precisions:
            stats += run_study([i for i in instances if not i.offloaded], precisions=list(down_precisions), **common)
    return StudyRun(probes, instances, stats)

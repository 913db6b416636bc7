"""Floating-point error of unmasking, measured against a proven bound (paper §5.5, §7.3.2, Table 4).

The TEE recovers one output element ⟨w, x⟩ as fl(⟨w, fl(x+η)⟩) − fl(⟨w, η⟩): the device's answer minus
the correction, both in a working precision with unit roundoff u = 2^−p. docs/fp_bound.md derives, step
by step, the bound implemented here (`forward_error_bound`, `bound_from_sums`):

    |fl(fl(⟨w, fl(x+η)⟩) − fl(⟨w, η⟩)) − ⟨w, x⟩|
        ≤ (1+u)·(c₁·Σ|wᵢ||xᵢ+ηᵢ| + c₂·Σ|wᵢ||ηᵢ|) + u·|⟨w, x⟩|,
    c₁ = (1+u)(1+γ_d(u_acc))(1+ρ) − 1,   c₂ = (1+γ_d(u_acc))(1+ρ) − 1,   γ_n(v) = n·v/(1−n·v)  (Higham §3.1)

where u_acc is the precision the dot products accumulate in and ρ = u when that accumulator is wider
than the working precision (its result is rounded once more when stored), else 0. With u_acc = u this is
at most (1+u)(γ_{d+1}·Σ|w||x+η| + γ_d·Σ|w||η|) + u|⟨w,x⟩|. The bound is infinite when d·u_acc ≥ 1 (bf16
with d ≥ 256, fp16 with d ≥ 2048): Higham's γ_d does not exist there.

Operands. w, x and η are the working-precision numbers the TEE holds (x and w rounded from the fp32 model
once, η drawn and rounded); the reference ⟨w, x⟩ is the exact dot product of those operands, computed by
`exact_dot` (error-free products and an error-free pairwise sum: as accurate as twice fp64, see there), so
the error measured is the unmasking's alone, not the cost of storing the model in that precision.

Kernels (`KERNELS`), evaluated on the same trials:
- "library": torch's F.linear in the working dtype, what the engine calls. On CPU torch accumulates bf16
  and fp16 GEMMs in fp32 and rounds the result once (`probe_accumulation` measures this; the bound then
  uses u_acc = 2^−24 for it). fp32/fp64 GEMMs sum in blocks in the working precision: any summation tree
  obeys γ_d, so the bound's model still holds.
- "sequential": recursive summation in the working precision, every product and every addition rounded
  to it (the bound's model exactly, by construction; `sequential_dot`).
A kernel outside the model shows up as a non-zero `violations` count: it is reported, never filtered.

The study (`run_study`): for each op instance (a weight matrix and the captured real inputs of that op),
draw `trials` output elements as a grid: ⌈trials/r⌉ captured input vectors, each masked once with
η ~ N(0, σ²I) as the engine masks a token (one mask for all output rows), times r weight rows drawn
without replacement; every precision and kernel sees the same draws.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

U64 = 2.0**-53


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: torch.dtype
    p: int                 # significand bits, the implicit bit included

    @property
    def u(self) -> float:
        """Unit roundoff of round-to-nearest, 2^−p."""
        return 2.0**-self.p


PRECISIONS: dict[str, Precision] = {
    "fp64": Precision("fp64", torch.float64, 53),
    "fp32": Precision("fp32", torch.float32, 24),
    "fp16": Precision("fp16", torch.float16, 11),
    "bf16": Precision("bf16", torch.bfloat16, 8),
}
KERNELS = ("library", "sequential")


def precision(name: str | Precision) -> Precision:
    if isinstance(name, Precision):
        return name
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; choose from {', '.join(PRECISIONS)}") from None


# ---------------------------------------------------------------------------------------------------
# The bound (docs/fp_bound.md)
# ---------------------------------------------------------------------------------------------------


def gamma(n: int, u: float) -> float:
    """γ_n = n·u/(1−n·u) (Higham 2002, Lemma 3.1); +inf where n·u ≥ 1 and the lemma says nothing."""
    nu = n * u
    return nu / (1.0 - nu) if nu < 1.0 else math.inf


def bound_coefficients(d: int, prec: str | Precision, accumulate: str | Precision | None = None) -> tuple[float, float]:
    """(c₁, c₂) of the bound for dot products of length d (docs/fp_bound.md, Theorem 1 and Corollary 2).

    `accumulate` is the precision the dot product sums in (None: the working precision itself). When it
    is wider, the accumulated value is rounded once more to the working precision (ρ = u).
    """
    prec = precision(prec)
    acc = prec if accumulate is None else precision(accumulate)
    if acc.u > prec.u:
        raise ValueError(f"accumulating {prec.name} in the narrower {acc.name} is outside the bound's model")
    u, g = prec.u, gamma(d, acc.u)
    rho = u if acc.u < u else 0.0
    if math.isinf(g):
        return math.inf, math.inf
    # (1+u)(1+g)(1+ρ) − 1 and (1+g)(1+ρ) − 1 expanded into sums of non-negative terms: evaluating them as
    # written would itself cancel catastrophically in fp64 when g ≈ 10⁻¹⁴ (the fp64 case).
    c2 = g + rho + g * rho
    c1 = u + c2 + u * c2
    return c1, c2


def evaluation_factor(d: int) -> float:
    """Covers the bound's own evaluation in fp64 (sums of d non-negative terms, a few more operations):
    the fp64 result times this factor is ≥ the exact value of the bound (docs/fp_bound.md §4)."""
    return 1.0 + 4.0 * gamma(d + 8, U64)


def bound_from_sums(s_xeta: torch.Tensor, s_eta: torch.Tensor, abs_wx: torch.Tensor, d: int,
                    prec: str | Precision, accumulate: str | Precision | None = None) -> torch.Tensor:
    """The bound from its three ingredients (fp64 tensors of one shape): Σ|wᵢ||xᵢ+ηᵢ|, Σ|wᵢ||ηᵢ|, |⟨w,x⟩|."""
    prec = precision(prec)
    c1, c2 = bound_coefficients(d, prec, accumulate)
    if math.isinf(c1):
        return torch.full_like(s_xeta, math.inf, dtype=torch.float64)
    u = prec.u
    b = (1 + u) * (c1 * s_xeta.double() + c2 * s_eta.double()) + u * abs_wx.double()
    return b * evaluation_factor(d)


def first_order_bound(s_xeta: torch.Tensor, s_eta: torch.Tensor, d: int, prec: str | Precision) -> torch.Tensor:
    """γ_d·(Σ|w||x+η| + Σ|w||η|): the two dot products' error terms only, in the working precision,
    without the rounding of x+η and of the final subtraction (docs/fp_bound.md §5). Reported beside the
    full bound because this is the form a reader most likely meets; it is not a proven bound."""
    g = gamma(d, precision(prec).u)
    if math.isinf(g):
        return torch.full_like(s_xeta, math.inf, dtype=torch.float64)
    return g * (s_xeta.double() + s_eta.double())


def to_working(t: torch.Tensor, prec: str | Precision) -> torch.Tensor:
    """Round to the working precision (the operands the TEE holds)."""
    return t.to(precision(prec).dtype)


def forward_error_bound(w: torch.Tensor, x: torch.Tensor, eta: torch.Tensor, prec: str | Precision,
                        accumulate: str | Precision | None = None) -> torch.Tensor:
    """Bound on |fl(fl(⟨w, fl(x+η)⟩) − fl(⟨w, η⟩)) − ⟨w, x⟩| per dot product, fp64.

    w, x, η broadcast against each other over leading dimensions; the last is the dot-product dimension
    d. They are first rounded to the working precision (a no-op for operands already in it); the bound is
    for those operands.
    """
    prec = precision(prec)
    w, x, eta = (to_working(t, prec).double() for t in torch.broadcast_tensors(w, x, eta))
    d = w.shape[-1]
    s_xeta = (w.abs() * (x + eta).abs()).sum(-1)
    s_eta = (w.abs() * eta.abs()).sum(-1)
    return bound_from_sums(s_xeta, s_eta, exact_dot(w, x).abs(), d, prec, accumulate)


# ---------------------------------------------------------------------------------------------------
# The exact reference
# ---------------------------------------------------------------------------------------------------

_SPLITTER = 2.0**27 + 1.0


def _two_product(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p + e = a·b exactly (Dekker 1971, without FMA; fp64, no overflow or underflow)."""
    p = a * b
    ca, cb = _SPLITTER * a, _SPLITTER * b
    ah = ca - (ca - a)
    al = a - ah
    bh = cb - (cb - b)
    bl = b - bh
    e = al * bl - (((p - ah * bh) - al * bh) - ah * bl)
    return p, e


def _sum2_pairwise(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, e) with s + e ≈ Σ over the last dimension: an error-free pairwise tree (Knuth's TwoSum at every
    node) whose exact rounding errors are summed apart in fp64 into e (Ogita, Rump & Oishi 2005, Sum2,
    in pairwise order). Each level adds the first half to the second (contiguous blocks: fast)."""
    err = torch.zeros(p.shape[:-1], dtype=torch.float64)
    while p.shape[-1] > 1:
        if p.shape[-1] % 2:
            p = torch.cat([p, torch.zeros(*p.shape[:-1], 1, dtype=p.dtype)], dim=-1)
        half = p.shape[-1] // 2
        a, b = p[..., :half], p[..., half:]
        s = a + b
        z = s - a
        err += ((a - (s - z)) + (b - z)).sum(-1)
        p = s
    return p[..., 0], err


def exact_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """⟨a, b⟩ over the last dimension, "exactly": as if computed in twice fp64 and rounded once (fp64).

    Products of numbers with at most 26 significant bits (fp32, bf16, fp16) are exact in fp64; fp64
    products are split error-free into p + e (`_two_product`). The p go through `_sum2_pairwise`; its
    exact rounding errors and the tiny e (|e| ≤ 2^−53·|p|) are summed in plain fp64 and added to the
    tree's sum in one final rounding. Error ≤ 2^−53·|⟨a,b⟩| + O(d·log d·2^−106)·Σ|aᵢbᵢ|
    (`reference_error_bound`, docs/fp_bound.md §4); tests check it against exact rational arithmetic.
    """
    a64, b64 = torch.broadcast_tensors(a.double(), b.double())
    if a.dtype == torch.float64 or b.dtype == torch.float64:
        p, e = _two_product(a64, b64)
        s, err = _sum2_pairwise(p)
        return s + (err + e.sum(-1))
    s, err = _sum2_pairwise(a64 * b64)
    return s + err


def reference_dot_grid(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The reference ⟨w, x⟩ for a [B, d] × [r, d] grid of working-precision operands, and its method.

    fp64 operands: `exact_dot`. Narrower operands: an fp64 GEMM: every product is exact in fp64, so the
    only error is the fp64 summation's, ≤ γ_d(2^−53)·Σ|wᵢxᵢ| in any order (`reference_error_bound`).
    """
    if x.dtype == torch.float64:
        return exact_dot(x[:, None, :], w[None, :, :]), "sum2"
    return x.double() @ w.double().T, "fp64"


def reference_error_bound(ref: torch.Tensor, s_wx: torch.Tensor, d: int, method: str = "sum2") -> torch.Tensor:
    """How far the reference can be from the exact ⟨w, x⟩ (s_wx = Σ|wᵢxᵢ|, fp64; docs/fp_bound.md §4).

    "sum2" (`exact_dot`): 2^−53·|ref|·(1 + 2^−51) + 4·γ_{2d}·2^−53·(⌈log₂ d⌉ + 2)·Σ|wᵢxᵢ|.
    "fp64" (exact products, fp64 sum in any order): γ_d·Σ|wᵢxᵢ|·(1 + 2^−51).
    """
    if method == "fp64":
        return gamma(d, U64) * s_wx.double() * (1 + 4 * U64)
    levels = math.ceil(math.log2(max(2, d))) + 2
    return U64 * ref.abs() * (1 + 4 * U64) + 4 * gamma(2 * d, U64) * U64 * levels * s_wx.double()


# ---------------------------------------------------------------------------------------------------
# Working-precision kernels
# ---------------------------------------------------------------------------------------------------


def recursive_sum(p: torch.Tensor) -> torch.Tensor:
    """p[0] + p[1] + … over the FIRST dimension, left to right, each addition rounded to p's dtype.

    torch computes an elementwise bf16/fp16 operation in fp32 and rounds the result; rounding twice
    (to fp32, then to p bits) equals rounding once for + and × when 24 ≥ 2p + 2 (Figueroa 1995), true
    for bf16 (p = 8) and fp16 (p = 11), so every step is correctly rounded (tests compare with scalar
    loops). torch.cumsum and .sum() accumulate bf16/fp16 in fp32 and are therefore not used.
    """
    acc = p[0].clone()
    for i in range(1, p.shape[0]):
        acc.add_(p[i])
    return acc


def sequential_dot(a: torch.Tensor, b: torch.Tensor, prec: str | Precision) -> torch.Tensor:
    """⟨a, b⟩ over the last dimension by recursive summation in the working precision (Higham §3.1's
    model: products rounded, then s ← fl(s + pᵢ) in order). Returns the working dtype."""
    dt = precision(prec).dtype
    products = torch.mul(*torch.broadcast_tensors(a.to(dt), b.to(dt)))
    return recursive_sum(products.movedim(-1, 0).contiguous())


def sequential_grid(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[B, d] × [r, d] → [B, r] of sequential dot products in x's dtype (x and w already in it)."""
    products = x[:, None, :] * w[None, :, :]
    return recursive_sum(products.movedim(-1, 0).contiguous())


def library_grid(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[B, d] × [r, d] → [B, r] with torch's F.linear in x's dtype: the engine's own call."""
    return F.linear(x, w)


def probe_accumulation(prec: str | Precision, d: int = 1024, n: int = 64, seed: int = 0) -> dict:
    """What torch's F.linear does in this precision here: n single dot products of length d and one
    [n, d] × [d, n] GEMM, compared with the exactly rounded results and with recursive summation.

    kind:
    - "wide-accumulator": every result lies within the bound of an fp32 accumulation rounded once to
      the working precision, and at least 90% equal the exactly rounded value (a result one ulp off
      the exact rounding is expected where fp32's own error straddles a rounding boundary);
    - "sequential": every result equals recursive summation in the working precision;
    - "other": neither (e.g. blocked or vectorised summation in the working precision).
    """
    prec = precision(prec)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64).to(prec.dtype)
    w = torch.randn(n, d, generator=g, dtype=torch.float64).to(prec.dtype)
    # Both shapes the harness uses: one dot product per call, and an [n, d] × [d, n] GEMM.
    single = torch.stack([F.linear(x[i:i + 1], w[i:i + 1])[0, 0] for i in range(n)]).double()
    gemm = F.linear(x, w).double()

    def both(grid: torch.Tensor) -> torch.Tensor:
        return torch.cat([grid.diagonal(), grid.flatten()])

    lib = torch.cat([single, gemm.flatten()])
    exact = both(reference_dot_grid(x, w)[0])
    once = exact.to(prec.dtype).double()
    seq = both(sequential_grid(x, w).double())
    s_abs = both(x.double().abs() @ w.double().abs().T)
    g32 = gamma(d, PRECISIONS["fp32"].u)
    wide_bound = (1 + prec.u) * g32 * s_abs + prec.u * exact.abs()
    f_once = (lib == once).double().mean().item()
    f_seq = (lib == seq).double().mean().item()
    f_wide = ((lib - exact).abs() <= wide_bound * evaluation_factor(d)).double().mean().item()
    if prec.name in ("bf16", "fp16") and f_wide == 1.0 and f_once >= 0.9:
        kind = "wide-accumulator"
    elif f_seq == 1.0:
        kind = "sequential"
    else:
        kind = "other"
    return {"precision": prec.name, "kind": kind, "frac_rounded_once": f_once, "frac_sequential": f_seq,
            "frac_within_fp32_accumulation_bound": f_wide, "d": d, "n_results": int(lib.numel()),
            "torch": torch.__version__}


def library_accumulation(prec: str | Precision, probe: dict | None) -> str:
    """The accumulation precision the bound assumes for the library kernel: fp32 for bf16/fp16 when the
    probe found a wide accumulator rounded once; otherwise the working precision (valid for any
    summation order within it)."""
    prec = precision(prec)
    if prec.name in ("bf16", "fp16") and probe is not None and probe.get("kind") == "wide-accumulator":
        return "fp32"
    return prec.name


# ---------------------------------------------------------------------------------------------------
# The study
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
                if kernel == "library":
                    a, b = library_grid(masked, w), library_grid(eta, w)
                elif kernel == "sequential":
                    a, b = sequential_grid(masked, w), sequential_grid(eta, w)
                else:
                    raise ValueError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")
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
              chunk_elements: int = 8_000_000, progress=None) -> list[InstanceStats]:
    """`study_instance` over every instance with its own random stream (seed, label)."""
    from harness.split.noise_bank import stream_seed

    probes = probes or {}
    accumulation = {name: {"library": library_accumulation(name, probes.get(name)), "sequential": name}
                    for name in precisions}
    stats: list[InstanceStats] = []
    for inst in instances:
        generator = torch.Generator().manual_seed(stream_seed(seed, "fp_error", inst.label))
        draws = draw(inst, trials, rows_per_vector, generator)
        for name in precisions:
            stats.extend(study_instance(inst, draws, [name], kernels, accumulation[name], chunk_elements))
        if progress is not None:
            progress(inst)
    return stats


# ---------------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------------


@dataclass
class Summary:
    """Trials pooled over a group of instances (Table 4's numbers)."""

    precision: str
    kernel: str
    op: str                        # an op name, "offloaded" (all offloaded instances) or "down"
    accumulate: str
    n_instances: int
    n_trials: int
    n_overflow: int
    mean_true_error: float
    mean_bound: float
    bound_ratio: float             # mean bound / mean true error (the paper: about 4)
    bound_violation_rate: float    # fraction of trials with error > bound
    first_order_bound: float
    first_order_violation_rate: float
    max_error_over_bound: float
    mean_abs_exact: float
    sigma_mean: float
    delta_mean: float | None
    instance_error_ci: tuple[float, float] | None = None   # 95% t interval over instances' mean errors
    bound_finite: bool = True      # False where d·u_acc ≥ 1: the bound does not exist (results.json has null)
    d: list[int] = field(default_factory=list)


def summarise(stats: Sequence[InstanceStats], precision_name: str, kernel: str, op: str) -> Summary | None:
    """Pool `stats` of one precision and kernel: op = a single op name, "offloaded" or "down"."""
    if op == "offloaded":
        rows = [s for s in stats if s.offloaded]
    else:
        rows = [s for s in stats if s.op == op]
    rows = [s for s in rows if s.precision == precision_name and s.kernel == kernel]
    if not rows:
        return None
    n = sum(s.n for s in rows)
    err = sum(s.sum_error for s in rows)
    bnd = sum(s.sum_bound for s in rows)
    first = sum(s.sum_first_order for s in rows)
    mean_err = err / n if n else math.nan
    mean_bnd = bnd / n if n else math.nan
    ci = None
    means = [s.mean_error for s in rows if s.n]
    if len(means) >= 2:
        from metrics.intervals import mean_ci

        est = mean_ci(means)
        ci = (est.lo, est.hi)
    deltas = [s.delta for s in rows if s.delta is not None]
    return Summary(
        precision=precision_name, kernel=kernel, op=op,
        accumulate="/".join(sorted({s.accumulate for s in rows})),
        n_instances=len(rows), n_trials=n, n_overflow=sum(s.n_overflow for s in rows),
        mean_true_error=mean_err, mean_bound=mean_bnd,
        bound_ratio=mean_bnd / mean_err if n and mean_err > 0 else math.nan,
        bound_violation_rate=sum(s.violations for s in rows) / n if n else math.nan,
        first_order_bound=first / n if n else math.nan,
        first_order_violation_rate=sum(s.violations_first_order for s in rows) / n if n else math.nan,
        max_error_over_bound=max(s.max_error_over_bound for s in rows),
        mean_abs_exact=sum(s.sum_abs_exact for s in rows) / n if n else math.nan,
        sigma_mean=sum(s.sigma_mean for s in rows) / len(rows),
        delta_mean=sum(deltas) / len(deltas) if deltas else None,
        instance_error_ci=ci,
        bound_finite=math.isfinite(bnd),
        d=sorted({s.d for s in rows}),
    )


def summary_table(stats: Sequence[InstanceStats], precisions: Sequence[str], kernels: Sequence[str]) -> list[dict]:
    """One row per (precision, kernel, group): "offloaded" first, then each op in paper order, then down."""
    present = {s.op for s in stats}
    groups = ["offloaded", *[o for o in OP_ORDER if o in present and o != "down"], *(["down"] if "down" in present else [])]
    rows = []
    for p in precisions:
        for k in kernels:
            for g in groups:
                s = summarise(stats, p, k, g)
                if s is not None:
                    rows.append(asdict(s))
    return rows


# Paper order of the op types (§7.3.2: Q, K, V, O, Gate, Up, LM head), Down last (not offloaded).
OP_ORDER = ("q", "k", "v", "o", "gate", "up", "lm_head", "down")


# ---------------------------------------------------------------------------------------------------
# Instances from a model and its captured inputs
# ---------------------------------------------------------------------------------------------------


def sigma_per_vector(delta: float, prompt_lengths: torch.Tensor, configuration: str, epsilon: float | None,
                     sigma_scale: float = 1.0) -> torch.Tensor:
    """The mask scale each captured vector would get: Δ/ε (ep1), Δ·√n for its prompt of n tokens (epn,
    ε = 1/√n), 0 (t3); times the engine's sigma_scale, as in harness/split/mechanisms.Gaussian."""
    n = prompt_lengths.double()
    if configuration == "ep1":
        return torch.full_like(n, sigma_scale * delta / float(epsilon))
    if configuration == "epn":
        return sigma_scale * delta * n.sqrt()
    if configuration == "t3":
        return torch.zeros_like(n)
    raise ValueError(f"no Gaussian masks in configuration {configuration!r}")


def build_instances(model, captured, configuration: str, epsilon: float | None, *, offload: Sequence[str],
                    sensitivity_rule: str = "paper", sigma_scale: float = 1.0,
                    include_down: bool = True) -> list[OpInstance]:
    """One OpInstance per weight matrix of every offloaded op (q, k, v, o, gate, up per layer; the LM
    head), with that op's Δ (harness/split/sensitivity.py); Down per layer as the non-offloaded
    reference, with `down_sensitivity`. Paper order: layer by layer, the LM head last, Down after."""
    from harness.split.architectures import decoder_layers
    from harness.split.controlled_error import member_names
    from harness.split.offload import all_op_instances, op_linears
    from harness.split.sensitivity import down_sensitivity, sensitivity_table

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

"""How the TEE hides the input of one offloaded linear op and recovers W·x from the device's answer.

- Plain (T3): the input crosses in the clear.
- Gaussian (EP1, EPN): x + σ·η with η from the bank, σ = Δ_op·(per-row factor); the TEE subtracts σ·(W·η)
  (paper §4.3, §5.4). The factor comes from the configuration (harness/configurations.py noise_factors).
- Slalom (Tramèr & Boneh 2019, paper §7.2): fixed-point quantisation of inputs and weights, a uniform mask
  in Z_q, the device computes W_q·(x_q + r) mod q, the TEE subtracts the precomputed W_q·r mod q, re-centres
  into (−q/2, q/2] and de-quantises. Products are carried exactly in a float64 GEMM split over the input
  dimension so that every partial sum stays below 2^53.

Slalom's wrap-around. Re-centring returns the integer product P = W_q·x_q only while |P| ≤ (q−1)/2; past
that the TEE silently gets P − k·q. With Slalom's constants (8 fractional bits for inputs and for weights,
q = 2^23+2^21+7) every output must stay below (q−1)/2 / 2^16 ≈ 80, which SmolLM2's O projections in late
layers exceed on ordinary prompts. So, here:

1. Counting, in every Slalom run. For each input row x (one token) the TEE bounds max_r |W_q,r·x_q|,
   x_q = round(x·2^b), from two norms of x: ‖x_q‖∞ ≤ 2^b‖x‖∞ + 1/2 and ‖x_q‖₂ ≤ 2^b‖x‖₂ + √d/2, times
   max_r ‖W_q,r‖₁ (Hölder) or max_r ‖W_q,r‖₂ (Cauchy–Schwarz), computed once from the quantised weights.
   Where the smaller bound is ≤ (q−1)/2 no output of the row can wrap. Rows above it are checked exactly:
   the TEE computes their integer product itself (a float64 GEMM, exact because every partial sum is at
   most ‖x_q‖∞·max_r‖W_q,r‖₁ < 2^53) and counts the outputs with |P| > (q−1)/2. So the count is exact (no
   false negatives, no false positives) and costs two reductions over the input unless a row is in
   danger; a float estimate of W·x in the TEE would be no cheaper at full precision (it is the product
   Slalom offloads) and can miss a wrap at lower precision. The counts are kept per op instance
   (SlalomOpState), with the TEE time they took (`check_s`, part of `masking`).
2. Scaling (`scaling`), so that none occur. `fixed` is Slalom's: every input with `frac_bits` fractional
   bits; it reproduces the numbers measured before the counter existed, wrap-arounds included.
   `per_token` (the default) keeps `frac_bits` for every row whose bound is safe and gives each other row
   the largest number of fractional bits b = f − s (s ≥ 0) at which its bound is safe again: x_q =
   round(x·2^b), de-quantised by 2^−(b+f_w). No wrap-around can occur, and every row that is safe at
   Slalom's scale is computed exactly as Slalom computes it. `per_op` fixes the input bits once per op
   instance, from the worst case over every input the op can receive: after an RMSNorm x = α⊙x̂ with
   ‖x̂‖₂ ≤ √d, so sup|W_q,r·x| = √d·‖W_q,r⊙α‖₂; the O input is, per head h, a convex combination of value
   vectors W_V,g(h)·(α⊙x̂) + b_V,g(h), so sup|W_q,r·x| ≤ Σ_h (√d·‖W_q,r,h·W_V,g(h)·diag α‖₂ + |W_q,r,h·b_V,g(h)|)
   (with Slalom's quantised W_V and its input's rounding where Slalom computes V too); the input's own
   rounding adds ‖W_q,r‖₁/2. That worst case lies far above what prompts reach, so `per_op` gives up input
   bits on every token of most O projections, `per_token` only on the rows that need it (results.json
   records each op's bits). Every mode keeps Slalom's arithmetic (exact products mod q, masks uniform in
   Z_q, weights with `frac_bits` fractional bits), and a row's scale never reaches the device: it sees
   (x_q + r) mod q, uniform whatever the scale.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from harness.devices import cpu_has_any
from harness.errors import UserError

SLALOM_MODULUS = 2**23 + 2**21 + 7  # 10,485,767, Slalom's prime
SLALOM_SCALINGS = ("per_token", "per_op", "fixed")
FLOAT64_EXACT = 2**53
# Relative slack on the Cauchy–Schwarz bound for the float64 rounding of ‖·‖₂ (a sum of d < 10^6 squares
# rounds by less than d·2^−53 ≈ 10^−10 relative), and on the per_op worst case for the float32 RMSNorm and
# softmax of the model itself.
L2_SLACK = 1e-9
WORST_CASE_SLACK = 1e-3
MAX_SHIFT = 126  # input bits per_token may take away from one row (2^−126: every input rounds to 0)


def exact_chunk(max_abs_weight: float, modulus: int) -> int:
    """Largest input-dimension chunk whose float64 dot products of values in [0, q) stay exact."""
    return max(1, int((FLOAT64_EXACT - 1) // ((modulus - 1) * max(1.0, max_abs_weight))))


def exact_matmul_mod(x: torch.Tensor, w: torch.Tensor, modulus: int, chunk: int | None = None) -> torch.Tensor:
    """(x @ wᵀ) mod q for float64 tensors holding integers, x in [0, q): exact, never rounded."""
    d = x.shape[-1]
    if chunk is None:
        chunk = exact_chunk(w.abs().max().item(), modulus)
    out = None
    for start in range(0, d, chunk):
        part = torch.remainder(x[..., start:start + chunk] @ w[:, start:start + chunk].T, modulus)
        out = part if out is None else torch.remainder(out + part, modulus)
    return out


# ---------------------------------------------------------------------------------------------------
# Exact integer products on int8 GEMMs
# ---------------------------------------------------------------------------------------------------
# An integer matrix is a sum of balanced base-256 digit planes, v = Σ_k 256^k·v_k with every v_k in
# [−128, 127], so x·Wᵀ = Σ_{i,j} 256^(i+j)·(x_i·W_jᵀ): int8 GEMMs with int32 accumulation, exact while
# every partial sum stays below 2^31 (128·128·d < 2^31: d < 131,072), combined in int64. On CPUs with
# int8 dot-product instructions it streams a quarter of the float64 weights' bytes, and it gives the same
# integers: both kernels are exact.
DIGIT_BASE_BITS = 8
INT8_EXACT_WIDTH = (2**31 - 1) // (128 * 128)
# The int8 kernel computes (input digits) x (weight digits) products, 6 for Slalom's q and SmolLM2's
# weights, and combines as many output planes: it wins while the weights' bytes dominate (decode, a few
# rows), the float64 GEMM wins once the arithmetic does (prefill). benchmarks/exact_product.py times the two
# side by side per row count (docs/benchmarks/exact_product_smollm2-135m.md: on the 2-core machine int8
# is faster up to 15 rows of SmolLM2's Gate/Up product, even up to 128, slower from 192).
INT8_MAX_ROWS = 128
# Without int8 dot-product instructions torch._int_mm has no fast kernel: on an AVX2-only EPYC it is 6×
# slower than float64 at 1 row and 68–83× at 128 to 2,250 rows, one thread (benchmarks/exact_product.py,
# docs/benchmarks/exact_product_smollm2-135m_avx2.md). There float64 serves every call.
INT8_DOT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def native_int8_dot() -> bool:
    """Whether this CPU has int8 dot-product instructions (cpuinfo flags avx512_vnni, avx_vnni or amx_int8)."""
    return cpu_has_any(*INT8_DOT_FLAGS)


def digits_needed(max_abs: int) -> int:
    """Balanced base-256 digits that represent every integer of magnitude ≤ max_abs: n digits cover
    [−128·(256^n − 1)/255, 127·(256^n − 1)/255]."""
    n = 1
    while 127 * (256**n - 1) // 255 < max_abs:
        n += 1
    return n


def int8_digits(v: torch.Tensor, n: int) -> torch.Tensor:
    """[n, *v.shape] int8 planes with v = Σ_k 256^k·plane_k (v: integers, any integer or float dtype
    holding them exactly); ValueError if n digits cannot hold v."""
    v = v.to(torch.int64)
    planes = torch.empty((n, *v.shape), dtype=torch.int8)
    for k in range(n):
        digit = ((v + 128) & 255) - 128
        planes[k] = digit
        v = (v - digit) >> DIGIT_BASE_BITS
    if bool(v.any()):
        raise ValueError(f"{n} base-256 digits cannot hold these integers")
    return planes


class IntegerWeights:
    """Integer weight matrices (one per member, [out_m, d], integer-valued) stacked as int8 digit planes,
    for exact products with integer inputs in one int8 GEMM per call (`exact_int_matmul`)."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        d = weights[0].shape[1]
        if d > INT8_EXACT_WIDTH:
            raise ValueError(f"input width {d} exceeds the int8 GEMM's exact width {INT8_EXACT_WIDTH}")
        stacked = torch.cat([w.to(torch.int64) for w in weights])               # [out, d]
        self.splits = [w.shape[0] for w in weights]
        self.out, self.d = stacked.shape
        self.n_digits = digits_needed(int(stacked.abs().max()))
        # [d, n_digits·out]: the planes side by side, so one GEMM computes every plane's product.
        self.planes_t = int8_digits(stacked, self.n_digits).reshape(self.n_digits * self.out, self.d).t()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x @ Wᵀ exactly (x: [n, d] integers; int64 [n, out]), every member's columns side by side."""
        n = x.shape[0]
        x_digits = digits_needed(int(x.abs().max())) if x.numel() else 1
        planes = int8_digits(x, x_digits).reshape(x_digits * n, self.d)
        parts = torch._int_mm(planes, self.planes_t).view(x_digits, n, self.n_digits, self.out)
        out = parts[0, :, 0].to(torch.int64)
        for i in range(x_digits):
            for j in range(self.n_digits):
                if i or j:
                    out.add_(parts[i, :, j], alpha=1 << (DIGIT_BASE_BITS * (i + j)))
        return out

    def matmul_mod(self, x: torch.Tensor, modulus: int) -> list[torch.Tensor]:
        """(x @ Wᵀ) mod q per member (int32 in [0, q)), x holding residues in [0, q): centred first, so
        the input needs the fewest digits (|x| ≤ q/2)."""
        product = torch.remainder(self.matmul(centre(x.to(torch.int64), modulus)), modulus)
        return list(product.to(torch.int32).split(self.splits, dim=1))


class ExactProduct:
    """(x @ W_qᵀ) mod q per member for one op's quantised weights, by the faster of two exact kernels for
    the number of rows (INT8_MAX_ROWS): int8 digit GEMMs, or the float64 GEMM split over the input
    dimension. Both return the same integers; where int8 GEMMs are not available (torch._int_mm on this
    device) or not fast (`int8` None: the CPU's int8 dot-product instructions decide, native_int8_dot), or
    the weights are too wide for them, float64 serves every call. `int8` True or False forces the choice
    (tests, benchmarks)."""

    def __init__(self, weights_q: list[torch.Tensor], modulus: int, device: torch.device,
                 int8: bool | None = None) -> None:
        self.modulus, self.device = modulus, device
        self.float64 = [w.to(device) for w in weights_q]
        self.chunk = exact_chunk(max(w.abs().max().item() for w in weights_q), modulus)
        self.int8 = None
        wanted = native_int8_dot() if int8 is None else int8
        if wanted and device.type == "cpu" and hasattr(torch, "_int_mm") and weights_q[0].shape[1] <= INT8_EXACT_WIDTH:
            self.int8 = IntegerWeights(weights_q)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x: [n, d] residues in [0, q) (any integer or float dtype holding them); int32 [n, out_m] per member."""
        if self.int8 is not None and x.shape[0] <= INT8_MAX_ROWS:
            return self.int8.matmul_mod(x, self.modulus)
        flat = x.double()
        return [exact_matmul_mod(flat, w, self.modulus, self.chunk).to(torch.int32) for w in self.float64]


def quantise(t: torch.Tensor, frac_bits: int) -> torch.Tensor:
    """Fixed point: round(t·2^f), returned as float64 integers."""
    return torch.round(t.double() * float(2**frac_bits))


def centre(z: torch.Tensor, modulus: int) -> torch.Tensor:
    """Map residues in [0, q) to the signed representatives in (−q/2, q/2]."""
    return torch.where(z > modulus // 2, z - modulus, z)


def centred_difference(y: torch.Tensor, c: torch.Tensor, modulus: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """(y − c) mod q as its representative in (−q/2, q/2], for residues y, c in [0, q): y − c lies in
    (−q, q), so two sign tests replace the integer division of a remainder on the prefill's large outputs:
    an arithmetic shift by 31 is −1 for a negative int32 and 0 otherwise, and adds or takes q in one pass.
    `out`: where to write it (a view of a larger result), else a new tensor."""
    half = modulus // 2
    z = y - c if out is None else torch.sub(y, c, out=out)
    z.sub_(z >> 31, alpha=modulus)                   # [0, q): + q where negative
    return z.add_((half - z) >> 31, alpha=modulus)   # (−q/2, q/2]: − q above q/2


# ---------------------------------------------------------------------------------------------------
# Slalom's wrap-around: bounds, exact count, scaling
# ---------------------------------------------------------------------------------------------------

def widened_norms(norm_inf: torch.Tensor, norm_2: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of x ([n, d] float), from torch's row norms of x in x's dtype: ‖x‖∞ (exact) and ‖x‖₂ rounded
    up, both float64. A float sum of d squares errs by less than d·u relative (u = eps/2), and the square root
    halves that, so ‖x‖₂·(1 + d·eps) bounds it."""
    return norm_inf.double(), norm_2.double() * (1.0 + d * torch.finfo(norm_2.dtype).eps)


def row_bounds(inf: torch.Tensor, l2: torch.Tensor, bits, d: int, row_l1: float, row_l2: float) -> torch.Tensor:
    """Per input row, a sound upper bound on max_r |W_q,r·x_q| with x_q = round(x·2^bits) (bits: an int
    or one per row): ‖x_q‖∞ ≤ 2^b‖x‖∞ + 1/2 and ‖x_q‖₂ ≤ 2^b‖x‖₂ + √d/2, then the smaller of Hölder's
    max_r‖W_q,r‖₁·‖x_q‖∞ and Cauchy–Schwarz's max_r‖W_q,r‖₂·‖x_q‖₂ (float64; L2_SLACK covers its rounding).
    No output of a row whose bound is ≤ (q−1)/2 can wrap: the products are integers."""
    scale = torch.exp2(bits.double()) if isinstance(bits, torch.Tensor) else 2.0**bits
    return torch.minimum((inf * scale + 0.5) * row_l1, (l2 * scale + math.sqrt(d) / 2) * (row_l2 * (1.0 + L2_SLACK)))


def safe_norm_limits(bits: int, d: int, row_l1: float, row_l2: float, modulus: int,
                     dtype: torch.dtype) -> tuple[float, float]:
    """(largest ‖x‖∞, largest ‖x‖₂), as values of `dtype` (what torch's norms of an input in that dtype
    return), at which Hölder's bound alone, or Cauchy–Schwarz's alone, stays ≤ (q−1)/2 at `bits` input
    bits, evaluated exactly as widened_norms and row_bounds evaluate it (−inf: no norm is safe by that
    bound). Both bounds only grow with the norm, float rounding included, so a row with either norm at
    most its limit is a row row_bounds calls safe, and a row past both limits is one it calls unsafe:
    norms_past_limits decides "every row is safe" as the full bounds would, at a third of their operations."""
    limit = modulus // 2
    grow = 1.0 + d * torch.finfo(dtype).eps          # widened_norms's rounding-up of ‖x‖₂
    no = torch.tensor([math.inf], dtype=torch.float64)

    def holder(v: torch.Tensor) -> float:
        return row_bounds(v.double().view(1), no, bits, d, row_l1, math.inf).item()

    def cauchy(v: torch.Tensor) -> float:
        return row_bounds(no, v.double().view(1) * grow, bits, d, math.inf, row_l2).item()

    def largest(bound, estimate: float) -> float:
        if not math.isfinite(estimate):
            return math.inf
        v = torch.tensor(max(estimate, 0.0), dtype=dtype)
        down, up = torch.tensor(-math.inf, dtype=dtype), torch.tensor(math.inf, dtype=dtype)
        while bound(v) > limit:
            if v.item() == 0.0:
                return -math.inf
            v = torch.nextafter(v, down)
        while True:
            above = torch.nextafter(v, up)
            if not math.isfinite(above.item()) or bound(above) > limit:
                return v.item()
            v = above

    scale = 2.0**bits
    by_inf = (limit / row_l1 - 0.5) / scale if row_l1 > 0 else math.inf
    by_l2 = (limit / (row_l2 * (1.0 + L2_SLACK)) - math.sqrt(d) / 2) / scale / grow if row_l2 > 0 else math.inf
    return largest(holder, by_inf), largest(cauchy, by_l2)


def norms_past_limits(x: torch.Tensor, limit_inf: float, limit_l2: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """None when every row of x ([n, d]) is safe by either bound alone, its ‖x‖₂ or ‖x‖∞ within the op's
    limit (safe_norm_limits); else both row norms, for the full bounds. ‖x‖₂ first: Cauchy–Schwarz is the
    tighter bound on rows without outliers, so ‖x‖∞ is computed only when some row needs it."""
    norm_2 = torch.linalg.vector_norm(x, dim=-1)
    safe = norm_2 <= limit_l2
    if bool(safe.all()):
        return None
    norm_inf = torch.linalg.vector_norm(x, math.inf, dim=-1)
    if bool((safe | (norm_inf <= limit_inf)).all()):
        return None
    return norm_inf, norm_2


def exact_wraps(x_q: torch.Tensor, weights_q: list[torch.Tensor], row_l1: float, modulus: int) -> int:
    """Outputs whose integer product W_q·x_q has |P| > (q−1)/2 (the centred residue is then wrong), counted
    exactly in the TEE. float64 is exact here: every partial sum is at most ‖x_q‖∞·max_r‖W_q,r‖₁ (row_l1);
    an integer GEMM takes over where that could reach 2^53."""
    limit = modulus // 2
    exact_in_float64 = x_q.abs().max().item() * row_l1 < FLOAT64_EXACT
    xd = x_q.double() if exact_in_float64 else x_q.long()
    count = 0
    for w in weights_q:
        product = xd @ (w.T if exact_in_float64 else w.long().T)
        count += int((product.abs() > limit).sum())
    return count


def row_shifts(inf: torch.Tensor, l2: torch.Tensor, bits: int, d: int, row_l1: float, row_l2: float,
               modulus: int) -> torch.Tensor:
    """Per row, the smallest s ≥ 0 with row_bounds(…, bits − s, …) ≤ (q−1)/2 (int64): the closed form from
    either bound, then one more bit wherever float rounding left a row above the limit."""
    limit = modulus // 2
    cap_inf = (limit / row_l1 - 0.5) / inf if row_l1 > 0 else torch.full_like(inf, math.inf)
    cap_l2 = (limit / (row_l2 * (1.0 + L2_SLACK)) - math.sqrt(d) / 2) / l2 if row_l2 > 0 else torch.full_like(l2, math.inf)
    # The largest admissible 2^(bits−s): either bound suffices; a zero row admits any scale (cap = inf).
    cap = torch.maximum(cap_inf, cap_l2).clamp(min=2.0**-MAX_SHIFT)
    shift = torch.ceil(bits - torch.log2(cap)).clamp(0, MAX_SHIFT).to(torch.int64)
    while True:
        over = (row_bounds(inf, l2, bits - shift, d, row_l1, row_l2) > limit) & (shift < MAX_SHIFT)
        if not bool(over.any()):
            return shift
        shift = shift + over.to(torch.int64)


def worst_case_products(model, op_name: str, layer: int | None, weights_q: list[torch.Tensor],
                        value: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
    """sup over every input the op can receive of |W_q,r·x| for every output row r of every member
    (float64, rows concatenated), before the input's rounding; the derivation is in the module docstring.
    `value`, for O: (W̃_V, b), the V weights as Slalom quantised them (W_V,q/2^f) and the input bits of the
    layer's QKV, when Slalom computes V too; None: V is W_V itself."""
    from harness.architectures import architecture_of, decoder_layers, effective_gain, final_norm

    arch = architecture_of(model)
    if op_name == "lm_head":
        gain = effective_gain(final_norm(model), arch)
    elif op_name in ("qkv", "gate_up"):
        gain = effective_gain(getattr(decoder_layers(model)[layer], arch.qkv_norm if op_name == "qkv" else arch.mlp_norm), arch)
    elif op_name == "o":
        return _worst_case_o(model, decoder_layers(model)[layer], weights_q[0], arch, value)
    else:
        raise UserError(f"engine.slalom_scaling=per_op has no input bound for {op_name!r} (its input follows "
                        "SiLU/GELU): use slalom_scaling=per_token or drop it from engine.offload")
    root_d = math.sqrt(gain.numel())
    return torch.cat([root_d * torch.linalg.vector_norm(w * gain, dim=-1) for w in weights_q])


def _worst_case_o(model, layer, w_o: torch.Tensor, arch, value: tuple[torch.Tensor, int] | None) -> torch.Tensor:
    """Σ_h (√d·‖c_h⊙α‖₂ + |W_q,r,h·b_V|) with c_h = W_q,r,h·W_V,g(h). When Slalom computes V, V is
    W̃_V·(x + e) with W̃_V its quantised weights and |e| ≤ 2^−(b+1) the rounding of its input x at b bits,
    so W̃_V replaces W_V and ‖c_h‖₁·2^−(b+1) joins each term."""
    from harness.architectures import effective_gain

    attention = layer.self_attn
    gain = effective_gain(getattr(layer, arch.qkv_norm), arch)
    root_d = math.sqrt(gain.numel())
    heads = model.config.num_attention_heads
    head_dim = w_o.shape[1] // heads
    w_v = attention.v_proj.weight.detach().double() if value is None else value[0].double()  # [n_kv·head_dim, d]
    b_v = attention.v_proj.bias
    n_rep = heads // (w_v.shape[0] // head_dim)
    total = torch.zeros(w_o.shape[0], dtype=torch.float64)
    for h in range(heads):
        g = h // n_rep                                                 # grouped-query attention: repeat_kv
        block = w_o[:, h * head_dim:(h + 1) * head_dim]
        c = block @ w_v[g * head_dim:(g + 1) * head_dim]
        total += root_d * torch.linalg.vector_norm(c * gain, dim=-1)
        if value is not None:
            total += c.abs().sum(-1) * 2.0 ** -(value[1] + 1)
        if b_v is not None:
            total += (block @ b_v.detach().double()[g * head_dim:(g + 1) * head_dim]).abs()
    return total


def per_op_input_bits(worst_case: torch.Tensor, row_l1: torch.Tensor, frac_bits: int, modulus: int) -> int:
    """The largest k ≤ frac_bits with max_r (2^k·sup_r·(1 + WORST_CASE_SLACK) + ‖W_q,r‖₁/2) ≤ (q−1)/2."""
    limit = modulus // 2
    for k in range(frac_bits, frac_bits - MAX_SHIFT, -1):
        if (2.0**k * worst_case * (1.0 + WORST_CASE_SLACK) + row_l1 / 2).max().item() <= limit:
            return k
    raise UserError("Slalom's field cannot hold this op's products at any input scale; use slalom_scaling=per_token")


@dataclass
class SlalomOpState:
    """One op instance's Slalom constants, from its quantised weights, and its wrap-around counters
    (reset at the start of every generation)."""

    in_bits: int            # the input's fractional bits (per_op: chosen from the worst case; else frac_bits)
    weight_bits: int
    row_l1: float           # max over members and rows of ‖W_q,r‖₁ (an exact integer)
    row_l2: float           # max over members and rows of ‖W_q,r‖₂
    out_features: int       # summed over members
    worst_case: float | None = None   # per_op: max_r sup|W_q,r·x| the bits were chosen from
    rows: int = 0           # real input rows (tokens; padding left out) masked
    elements: int = 0       # their outputs (rows × out_features)
    wraps: int = 0          # outputs whose centred residue was not the product (|W_q·x_q| > (q−1)/2)
    rows_checked: int = 0   # rows whose bound was unsafe, checked exactly in the TEE
    rows_rescaled: int = 0  # per_token: rows given fewer input bits than frac_bits
    min_in_bits: int | None = None    # the fewest input bits any row got
    check_s: float = 0.0    # TEE seconds on bounds, rescaling and exact checks (inside `masking`)
    _limits: dict = field(default_factory=dict, repr=False)   # safe_norm_limits per (in_bits, dtype, d, q)

    def norm_limits(self, dtype: torch.dtype, d: int, modulus: int) -> tuple[float, float]:
        key = (self.in_bits, dtype, d, modulus)
        if key not in self._limits:
            self._limits[key] = safe_norm_limits(self.in_bits, d, self.row_l1, self.row_l2, modulus, dtype)
        return self._limits[key]

    def reset(self) -> None:
        self.rows = self.elements = self.wraps = self.rows_checked = self.rows_rescaled = 0
        self.min_in_bits, self.check_s = None, 0.0

    def counters(self) -> dict:
        return {"wraps": self.wraps, "elements": self.elements, "rows": self.rows, "rows_checked": self.rows_checked,
                "rows_rescaled": self.rows_rescaled, "in_bits": self.in_bits, "min_in_bits": self.min_in_bits,
                "weight_bits": self.weight_bits, "worst_case": self.worst_case, "check_s": self.check_s}


# ---------------------------------------------------------------------------------------------------
# Mechanisms
# ---------------------------------------------------------------------------------------------------

class Plain:
    name = "plain"

    def needs_bank(self) -> bool:
        return False

    def prepare(self, op, model) -> None:
        """Nothing to set up per op instance."""

    def run(self, op, x: torch.Tensor) -> list[torch.Tensor]:
        ctx = op.ctx
        sent = ctx.boundary.send(op.name, op.layer, x)
        with ctx.clock.time(op.category):
            ys = [F.linear(sent, w, b) for w, b in op.device_params]
        return ctx.boundary.receive(ys)


class Gaussian:
    name = "gaussian"

    def needs_bank(self) -> bool:
        return True

    def prepare(self, op, model) -> None:
        """Nothing to set up per op instance (σ comes from op.delta)."""

    @staticmethod
    def _sigma(op, x: torch.Tensor) -> torch.Tensor:
        """σ per batch row, shaped to broadcast over x: Δ_op times the Δ-free factors (1/ε or √n_prompt)
        the engine set for the current batch; made once per op and generation, not on every call."""
        key = (op.ctx.sigma_version, x.dim(), x.dtype)
        if getattr(op, "sigma_cache", None) is None or op.sigma_cache[0] != key:
            sigma = (op.delta * op.ctx.sigma_factor).to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
            op.sigma_cache = (key, sigma)
        return op.sigma_cache[1]

    def chunk_maker(self, op):
        from harness.splitee.noise_bank import gaussian_chunk_maker

        return gaussian_chunk_maker(op.tee_weights)

    def run(self, op, x: torch.Tensor) -> list[torch.Tensor]:
        ctx = op.ctx
        rows = x.shape[:-1]
        n = math.prod(rows)
        parts = op.take(n).parts
        with ctx.clock.time("masking"):
            sigma = self._sigma(op, x)
            if len(parts) == 1:
                (_, masks, corrections), = parts
                exposed = torch.addcmul(x, sigma, masks.view(*rows, -1))
            else:
                # A request spanning bank pieces (the prefill's): mask each piece's rows where they stand.
                spans = [(slice(lo, lo + m.shape[0]), m, cs) for lo, m, cs in parts]
                sigma_rows = sigma.expand(*rows, 1).reshape(n, 1)
                flat = x.reshape(n, -1)
                exposed = torch.empty_like(flat)
                for span, m, _ in spans:
                    torch.addcmul(flat[span], sigma_rows[span], m, out=exposed[span])
                exposed = exposed.view(*rows, -1)
        sent = ctx.boundary.send(op.name, op.layer, exposed)
        with ctx.clock.time(op.category):
            ys = [F.linear(sent, w, b) for w, b in op.device_params]
        ys = ctx.boundary.receive(ys)
        with ctx.clock.time("masking"):
            # The answers are fresh tensors owned by the TEE now: unmask in place, fused.
            if len(parts) == 1:
                return [y.addcmul_(sigma, c.view(*rows, -1), value=-1.0) for y, c in zip(ys, corrections)]
            flat_ys = [y.view(n, -1) for y in ys]
            for span, _, cs in spans:
                for y, c in zip(flat_ys, cs):
                    y[span].addcmul_(sigma_rows[span], c, value=-1.0)
            return ys


class Slalom:
    name = "slalom"

    def __init__(self, frac_bits: int = 8, modulus: int = SLALOM_MODULUS, scaling: str = "per_token") -> None:
        if scaling not in SLALOM_SCALINGS:
            raise UserError(f"engine.slalom_scaling={scaling!r} is not one of {', '.join(SLALOM_SCALINGS)}")
        self.frac_bits = frac_bits
        self.modulus = modulus
        self.scaling = scaling
        self._value: dict[int, tuple[torch.Tensor, int]] = {}  # per_op: each layer's V as Slalom computes it

    def needs_bank(self) -> bool:
        return True

    def quantised_weights(self, weights: list[torch.Tensor]) -> list[torch.Tensor]:
        return [quantise(w, self.frac_bits) for w in weights]

    def prepare(self, op, model) -> None:
        """op.slalom: the row norms of the quantised weights that the bounds use and, for per_op, the
        input bits chosen from the op's worst case."""
        l1 = torch.cat([w.abs().sum(-1) for w in op.tee_quantised])
        l2 = torch.cat([torch.linalg.vector_norm(w, dim=-1) for w in op.tee_quantised])
        state = SlalomOpState(self.frac_bits, self.frac_bits, l1.max().item(), l2.max().item(), l1.numel())
        if self.scaling == "per_op":
            # The engine prepares a layer's QKV before its O: O's bound needs the V that Slalom computes.
            value = self._value.get(op.layer) if op.name == "o" else None
            worst = worst_case_products(model, op.name, op.layer, op.tee_quantised, value)
            state.in_bits = per_op_input_bits(worst, l1, self.frac_bits, self.modulus)
            state.worst_case = worst.max().item()
            if op.name == "qkv":
                self._value[op.layer] = (op.tee_quantised[2] / 2.0**self.frac_bits, state.in_bits)
        op.slalom = state

    def chunk_maker(self, op):
        from harness.splitee.noise_bank import slalom_chunk_maker

        return slalom_chunk_maker(op.tee_quantised, op.tee_product)

    def quantise_input(self, op, x: torch.Tensor, real: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | int]:
        """x ([n, d] float) → (x_q int32 [n, d], the input bits: one int, or per_token an int64 [n, 1]);
        counts into op.slalom the wrap-arounds this input causes at its real rows (`real`, [n] bool; None: all
        rows; padding rows are computed too but reach no output)."""
        state, q, (n, d) = op.slalom, self.modulus, x.shape
        start = time.perf_counter()
        bits: torch.Tensor | int = state.in_bits
        unsafe = None   # None: no row can wrap
        norms = norms_past_limits(x, *state.norm_limits(x.dtype, d, q))
        if norms is not None:
            inf, l2 = widened_norms(*norms, d)
            unsafe = row_bounds(inf, l2, bits, d, state.row_l1, state.row_l2) > q // 2
            if self.scaling == "per_token" and bool(unsafe.any()):
                shift = torch.zeros(n, dtype=torch.int64)
                shift[unsafe] = row_shifts(inf[unsafe], l2[unsafe], bits, d, state.row_l1, state.row_l2, q)
                bits = (state.in_bits - shift)[:, None]
                state.rows_rescaled += int(((shift > 0) if real is None else (shift > 0) & real).sum())
                # row_shifts made every row safe but those it had to stop at MAX_SHIFT.
                capped = shift >= MAX_SHIFT
                unsafe = ((row_bounds(inf, l2, bits[:, 0], d, state.row_l1, state.row_l2) > q // 2) & capped
                          if bool(capped.any()) else None)
        checked = time.perf_counter()
        # x·2^b and its rounding are exact in float (b per row: a power of two per row); the integers fit int32.
        scale = torch.exp2(bits.to(x.dtype)) if isinstance(bits, torch.Tensor) else float(2.0**bits)
        x_q = torch.round(x * scale).to(torch.int32)
        resumed = time.perf_counter()
        if unsafe is not None and real is not None:
            unsafe = unsafe & real
        if unsafe is not None and bool(unsafe.any()):
            state.rows_checked += int(unsafe.sum())
            state.wraps += exact_wraps(x_q[unsafe], op.tee_quantised, state.row_l1, q)
        counted = n if real is None else int(real.sum())
        state.rows += counted
        state.elements += counted * state.out_features
        used = bits if not isinstance(bits, torch.Tensor) else (bits[:, 0] if real is None else bits[real, 0])
        least = used if not isinstance(used, torch.Tensor) else (int(used.min()) if used.numel() else state.in_bits)
        state.min_in_bits = least if state.min_in_bits is None else min(state.min_in_bits, least)
        state.check_s += (checked - start) + (time.perf_counter() - resumed)
        return x_q, bits

    def run(self, op, x: torch.Tensor) -> list[torch.Tensor]:
        ctx, q = op.ctx, self.modulus
        rows = x.shape[:-1]
        n = math.prod(rows)
        parts = op.take(n).parts
        with ctx.clock.time("masking"):
            # Real positions of this call (the engine's ctx.valid: prefill rows of left-padded prompts).
            valid = ctx.valid
            real = valid.reshape(n).cpu() if valid is not None and tuple(valid.shape) == tuple(rows) else None
            x_q, bits = self.quantise_input(op, x.reshape(n, x.shape[-1]), real)
            if len(parts) == 1:
                exposed = torch.remainder(x_q + parts[0][1], q)
            else:
                # A request spanning bank pieces (the prefill's): mask, and below unmask, each piece's rows
                # where they stand, rather than copy the pieces' masks and corrections into one tensor.
                exposed = torch.empty_like(x_q)
                for lo, m, _ in parts:
                    torch.remainder(x_q[lo:lo + m.shape[0]] + m, q, out=exposed[lo:lo + m.shape[0]])
            exposed = exposed.view(*rows, -1)
        sent = ctx.boundary.send(op.name, op.layer, exposed)
        with ctx.clock.time(op.category):
            ys = op.device_product(sent.reshape(-1, sent.shape[-1]))
        ys = ctx.boundary.receive(ys)
        with ctx.clock.time("masking"):
            # |z| < q/2 < 2^23 is exact in float32, and so is scaling by a power of two (per row, per_token).
            if isinstance(bits, torch.Tensor):
                scale = torch.exp2(-(bits + op.slalom.weight_bits).to(x.dtype))
            else:
                scale = 2.0 ** (-(bits + op.slalom.weight_bits))
            outs = []
            for member, (y, (_, b)) in enumerate(zip(ys, op.tee_params)):
                if len(parts) == 1:
                    z = centred_difference(y, parts[0][2][member], q)
                else:
                    z = torch.empty_like(y)
                    for lo, _, cs in parts:
                        span = slice(lo, lo + cs[member].shape[0])
                        centred_difference(y[span], cs[member], q, out=z[span])
                z = z.to(x.dtype).mul_(scale).view(*rows, -1)
                outs.append(z.add_(b) if b is not None else z)
            return outs


COUNTS = ("wraps", "elements", "rows", "rows_checked", "rows_rescaled", "check_s")


def slalom_stats(ops, scaling: str, frac_bits: int, modulus: int) -> dict:
    """The `slalom` block of results.json for one generation: wrap-arounds per op instance, per op type
    and in total, and the input bits each op ran with (SlalomOpState.counters)."""
    per_op = {op.label: {"op": op.name, "layer": op.layer, **op.slalom.counters()} for op in ops}
    return _summary({"scaling": scaling, "frac_bits": frac_bits, "modulus": modulus}, per_op)


def merge_slalom_stats(a: dict | None, b: dict | None) -> dict | None:
    """Two generations' slalom blocks as one: counts summed, the fewest input bits kept."""
    if a is None or b is None:
        return b if a is None else a
    per_op = {}
    for label, x in a["ops"].items():
        y = b["ops"][label]
        lows = [v for v in (x["min_in_bits"], y["min_in_bits"]) if v is not None]
        per_op[label] = {**x, **{k: x[k] + y[k] for k in COUNTS}, "min_in_bits": min(lows) if lows else None}
    return _summary({k: a[k] for k in ("scaling", "frac_bits", "modulus")}, per_op)


def _summary(head: dict, per_op: dict) -> dict:
    by_type: dict[str, dict] = {}
    for entry in per_op.values():
        row = by_type.setdefault(entry["op"], {"wraps": 0, "elements": 0, "instances": 0, "instances_with_wraps": 0})
        row["wraps"] += entry["wraps"]
        row["elements"] += entry["elements"]
        row["instances"] += 1
        row["instances_with_wraps"] += int(entry["wraps"] > 0)
    return {**head, **{k: sum(v[k] for v in per_op.values()) for k in COUNTS}, "by_op_type": by_type, "ops": per_op}


def make_mechanism(name: str, slalom_frac_bits: int = 8, slalom_scaling: str = "per_token"):
    """The mechanism a split configuration names (harness/configurations.py `mechanism`)."""
    if name == Plain.name:
        return Plain()
    if name == Gaussian.name:
        return Gaussian()
    if name == Slalom.name:
        return Slalom(slalom_frac_bits, scaling=slalom_scaling)
    raise ValueError(f"{name!r} is not a masking mechanism")

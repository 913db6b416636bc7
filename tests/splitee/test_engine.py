"""The split engine: exact equivalences, the noise it adds, Slalom's arithmetic, the bank, bad input."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy import stats

from harness.errors import UserError
from harness.models import load_model
from harness.splitee.engine import EngineSettings, SplitEngine
from harness.splitee.mechanisms import (
    INT8_EXACT_WIDTH,
    INT8_MAX_ROWS,
    SLALOM_MODULUS,
    SLALOM_SCALINGS,
    ExactProduct,
    IntegerWeights,
    centre,
    centred_difference,
    digits_needed,
    exact_matmul_mod,
    exact_wraps,
    int8_digits,
    norms_past_limits,
    quantise,
    row_bounds,
    row_shifts,
    safe_norm_limits,
    widened_norms,
    worst_case_products,
)

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"


def input_norms(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 row norms the Slalom check bounds with, from x as quantise_input computes them."""
    return widened_norms(torch.linalg.vector_norm(x, math.inf, dim=-1), torch.linalg.vector_norm(x, dim=-1), x.shape[-1])


@functools.lru_cache(maxsize=None)
def model(name: str):
    return load_model(OmegaConf.load(CONF / f"{name}.yaml"))


def prompts(n: int, length: int, vocab: int, seed: int = 0, vary: bool = True) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        size = length - (i % 5) * (length // 10) if vary else length
        out.append(torch.randint(3, vocab, (size,), generator=g).tolist())
    return out


def run(m, configuration: str, ps, new_tokens: int, **settings):
    engine = SplitEngine(m.model, EngineSettings(configuration, **settings))
    return engine, engine.generate(ps, new_tokens, pad_token_id=m.tokenizer.pad_token_id)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
def test_t3_matches_cpu_token_for_token_on_tiny_models(name):
    m = model(name)
    ps = prompts(6, 40, 5000)
    _, cpu = run(m, "cpu", ps, 24)
    _, t3 = run(m, "t3", ps, 24)
    assert t3.output_ids == cpu.output_ids
    assert all(len(o) == 24 for o in t3.output_ids)


def test_engine_greedy_loop_matches_transformers_generate():
    m = model("tiny-llama")
    p = prompts(1, 30, 5000)[0]
    _, cpu = run(m, "cpu", [p], 16)
    hf = m.model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                          max_new_tokens=16, do_sample=False, pad_token_id=m.tokenizer.pad_token_id)
    assert cpu.output_ids[0] == hf[0, len(p):].tolist()


def test_t3_matches_cpu_on_smollm2_chat_prompts():
    m = model("smollm2-135m")
    texts = ["Name three primary colours.", "Write one sentence about the sea.", "What is 12 times 7?"]
    ps = [m.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                          return_dict=False) for t in texts]
    ps = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in ps]
    _, cpu = run(m, "cpu", ps, 20)
    _, t3 = run(m, "t3", ps, 20)
    assert t3.output_ids == cpu.output_ids
    assert len(set(map(tuple, cpu.output_ids))) == 3  # the prompts really produced different answers


@pytest.mark.parametrize("configuration", ["ep1", "slalom"])
def test_a_checkpoint_is_the_shorter_generation_it_began_with(configuration):
    """timing.mode=prefix reads a k-token generation off a longer one: the same tokens, bytes and
    crossings as generating k tokens on their own (same seed, so the same masks), timings that grow with
    k, and the prefill's own breakdown inside the whole."""
    m = model("tiny-llama")
    ps = prompts(3, 20, 5000)
    pad = m.tokenizer.pad_token_id
    long = SplitEngine(m.model, EngineSettings(configuration, epsilon=1.0)).generate(ps, 9, pad_token_id=pad,
                                                                                   checkpoints=(3, 6, 9))
    previous = 0.0
    for k in (3, 6, 9):
        short = SplitEngine(m.model, EngineSettings(configuration, epsilon=1.0)).generate(ps, k, pad_token_id=pad)
        at = long.at(k)
        assert at.output_ids == short.output_ids and at.n_generated_tokens == 3 * k
        assert at.boundary == short.boundary
        assert at.timings["total"] > previous and set(at.timings) == set(short.timings)
        previous = at.timings["total"]
        if configuration == "slalom":
            assert at.slalom["rows"] == short.slalom["rows"]
    assert long.at(9).timings == long.timings
    assert 0 < long.prefill_timings["total"] == long.timings["prefill"]
    assert long.prefill_timings["masking"] <= long.timings["masking"]
    with pytest.raises(KeyError):
        long.at(4)
    with pytest.raises(UserError, match="checkpoints"):
        SplitEngine(m.model, EngineSettings("t3")).generate(ps, 3, pad_token_id=pad, checkpoints=(4,))


def test_ep1_with_zero_sigma_equals_t3_exactly():
    m = model("tiny-qwen3")
    ps = prompts(4, 30, 5000)
    e3 = SplitEngine(m.model, EngineSettings("t3", record_view=True))
    t3 = e3.generate(ps, 12, pad_token_id=0)
    e0 = SplitEngine(m.model, EngineSettings("ep1", epsilon=1.0, sigma_scale=0.0, record_view=True))
    ep = e0.generate(ps, 12, pad_token_id=0)
    assert ep.output_ids == t3.output_ids
    for a, b in zip(e3.view.exposures, e0.view.exposures):
        assert (a.op, a.layer, a.step) == (b.op, b.layer, b.step)
        assert torch.equal(a.tensor, b.tensor)


def _paper_deltas(model_) -> dict[tuple[str, int | None], float]:
    """Δ of every op computed here from the weights (paper §5.3, default rule): 2·√d·‖α‖₄ after an RMSNorm
    of gain α (QKV: the input norm; Gate/Up: the MLP norm; LM head: the final norm), times ‖W_V‖₂ for O."""
    def ln(norm) -> float:
        alpha = norm.weight.detach().double()          # Llama: the gain is the weight itself
        return 2 * math.sqrt(alpha.numel()) * torch.linalg.vector_norm(alpha, ord=4).item()

    out: dict[tuple[str, int | None], float] = {}
    for index, layer in enumerate(model_.model.layers):
        out["qkv", index] = ln(layer.input_layernorm)
        w_v = layer.self_attn.v_proj.weight.detach().double()
        out["o", index] = ln(layer.input_layernorm) * torch.linalg.matrix_norm(w_v, ord=2).item()
        out["gate_up", index] = ln(layer.post_attention_layernorm)
    out["lm_head", None] = ln(model_.model.norm)
    return out


def _noise_by_op(m, ps, new_tokens, configuration, **kw):
    """(masked − clean)/Δ per op type from two recorded views, the configuration's and T3's, with Δ computed
    from the weights (not taken from the engine)."""
    clean_engine, clean = run(m, "t3", ps, new_tokens, record_view=True)
    noisy_engine, noisy = run(m, configuration, ps, new_tokens, record_view=True, **kw)
    assert noisy.output_ids == clean.output_ids, "precondition: same tokens, so the clean inputs line up"
    deltas = _paper_deltas(m.model)
    out: dict[str, list[torch.Tensor]] = {}
    for c, n in zip(clean_engine.view.exposures, noisy_engine.view.exposures):
        assert (c.op, c.layer, c.step, c.shape) == (n.op, n.layer, n.step, n.shape)
        out.setdefault(c.op, []).append(((n.tensor - c.tensor) / deltas[(c.op, c.layer)]).double())
    return out


def test_ep1_noise_has_the_promised_scale_per_op():
    # A private tiny Llama whose norms have distinct, uneven gains, so that a Δ from the wrong norm, or from
    # a norm of α other than ‖α‖₄, gives a visibly wrong σ (with unit gains every norm's Δ would be equal).
    m = load_model(OmegaConf.load(CONF / "tiny-llama.yaml"))
    g = torch.Generator().manual_seed(5)
    norms = [n for layer in m.model.model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    with torch.no_grad():
        for i, norm in enumerate([*norms, m.model.model.norm]):
            norm.weight.copy_(0.25 + (1 + i) * torch.rand(norm.weight.shape, generator=g) ** 3)
    eps = 2.0
    ps = prompts(16, 60, 5000, vary=False)
    noise = _noise_by_op(m, ps, 100, "ep1", epsilon=eps)
    assert set(noise) == {"qkv", "o", "gate_up", "lm_head"}
    for op, parts in noise.items():
        z = torch.cat([p.flatten() for p in parts])   # (masked − clean)/Δ should be N(0, 1/ε²)
        assert z.numel() >= 100_000, op
        std = z.std().item()
        assert abs(std * eps - 1.0) < 0.03, (op, std)
        se = std / math.sqrt(z.numel())
        assert abs(z.mean().item()) < 3 * se, (op, z.mean().item(), se)


def test_epn_sigma_follows_inverse_sqrt_of_prompt_length_per_row():
    m = model("tiny-llama")
    ps = prompts(5, 80, 5000)   # lengths 80, 72, 64, 56, 48 in one left-padded batch
    noise = _noise_by_op(m, ps, 1, "epn")
    longest = max(map(len, ps))
    for row, p in enumerate(ps):
        # Only the real (unpadded) positions of this row; σ/Δ should be √n for its n tokens.
        z = torch.cat([t[row, longest - len(p):].flatten() for t in noise["qkv"]])
        assert abs(z.std().item() / math.sqrt(len(p)) - 1.0) < 0.03, (row, len(p), z.std().item())


def test_same_seed_same_masks_and_outputs_other_seed_other_masks():
    m = model("tiny-llama")
    ps = prompts(3, 20, 5000)
    a, ra = run(m, "ep1", ps, 6, epsilon=0.5, seed=7, record_view=True)
    b, rb = run(m, "ep1", ps, 6, epsilon=0.5, seed=7, record_view=True)
    c, _ = run(m, "ep1", ps, 6, epsilon=0.5, seed=8, record_view=True)
    assert ra.output_ids == rb.output_ids
    assert all(torch.equal(x.tensor, y.tensor) for x, y in zip(a.view.exposures, b.view.exposures))
    assert not torch.equal(a.view.exposures[0].tensor, c.view.exposures[0].tensor)


def test_no_bank_entry_is_served_twice_over_a_long_batched_generation():
    m = model("tiny-qwen3")
    ps = prompts(12, 50, 5000)
    engine, result = run(m, "ep1", ps, 120, epsilon=1.0, bank_capacity=500)
    assert result.bank["refills"] > 0
    for op in engine.ops:
        spans = sorted(op.bank.ledger)
        assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:])), op.label
        assert sum(hi - lo for lo, hi in spans) == op.bank.stats.entries_used <= op.bank.stats.entries_made
    rows = 12 * 50 + 12 * 119
    assert result.bank["entries_used"] == rows * 3 * 2 + 12 * 120


def test_bank_exhaustion_can_be_an_error():
    m = model("tiny-llama")
    with pytest.raises(UserError, match="exhausted"):
        run(m, "ep1", prompts(2, 20, 5000), 10, epsilon=1.0, bank_capacity=30, bank_on_exhaustion="error")


def test_slalom_unmasking_recovers_the_quantised_product_exactly():
    m = model("tiny-llama")
    engine = SplitEngine(m.model, EngineSettings("slalom"))
    engine._prepare_banks(64, 64)
    op = next(o for o in engine.ops if o.name == "gate_up")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, op.tee_weights[0].shape[1], generator=g) * 3
    outputs = op.mechanism.run(op, x)
    xq = quantise(x, 8).long()
    for out, wq in zip(outputs, op.tee_quantised):
        exact = xq @ wq.long().T                          # the integer product, no modular arithmetic
        assert exact.abs().max() < SLALOM_MODULUS // 2    # precondition: no wrap-around
        assert torch.equal(torch.round(out.double() * 2**16).long(), exact)


def test_int8_digit_kernel_gives_the_exact_integer_product():
    """The int8 kernel (balanced base-256 digit planes, int32 accumulation) against int64 arithmetic: for
    weights that need one and three digits, negative and positive inputs, the mod-q path at the row
    counts either side of INT8_MAX_ROWS (both kernels, same integers) and a width over the exact limit."""
    g = torch.Generator().manual_seed(5)
    for bound in (100, 2400, 40_000):
        w = torch.randint(-bound, bound + 1, (9, 70), generator=g)
        weights = IntegerWeights([w[:4].double(), w[4:].double()])
        assert weights.n_digits == digits_needed(int(w.abs().max()))
        x = torch.randint(-(1 << 30), 1 << 30, (6, 70), generator=g)
        assert torch.equal(weights.matmul(x), x @ w.T)
        product = ExactProduct([w[:4].double(), w[4:].double()], SLALOM_MODULUS, torch.device("cpu"), int8=True)
        assert product.int8 is not None   # the int8 kernel is tested whatever this CPU would choose
        for rows in (3, INT8_MAX_ROWS + 5):
            r = torch.randint(0, SLALOM_MODULUS, (rows, 70), generator=g)
            want = torch.remainder(r @ w.T, SLALOM_MODULUS)
            got = torch.cat(product(r), dim=1)
            assert got.dtype == torch.int32 and torch.equal(got.long(), want)
    assert [digits_needed(v) for v in (0, 127, 128, 32639, 32640)] == [1, 1, 2, 2, 3]
    with pytest.raises(ValueError):
        int8_digits(torch.tensor([128]), 1)
    with pytest.raises(ValueError):
        IntegerWeights([torch.zeros(2, INT8_EXACT_WIDTH + 1)])


def test_the_int8_kernel_is_chosen_only_where_the_cpu_has_int8_dot_products(monkeypatch):
    """Without VNNI or AMX int8 (an AVX2-only CPU, where torch._int_mm is 6-83x slower than float64)
    ExactProduct uses float64 for every call; with them, int8 up to INT8_MAX_ROWS rows."""
    from harness import devices

    w = [torch.randint(-100, 101, (4, 16), generator=torch.Generator().manual_seed(0)).double()]
    for flags, expected in ((frozenset({"avx2", "fma"}), False), (frozenset({"avx2", "avx512_vnni"}), True),
                            (frozenset({"amx_int8"}), True)):
        monkeypatch.setattr(devices, "cpu_flags", lambda flags=flags: flags)
        assert (ExactProduct(w, SLALOM_MODULUS, torch.device("cpu")).int8 is not None) == expected
    assert ExactProduct(w, SLALOM_MODULUS, torch.device("cpu"), int8=False).int8 is None


def test_exact_matmul_mod_is_exact_even_when_split_over_chunks():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, SLALOM_MODULUS, (5, 300), generator=g)
    w = torch.randint(-300, 301, (7, 300), generator=g)
    want = torch.remainder(x @ w.T, SLALOM_MODULUS)
    for chunk in (None, 1, 17, 300):
        got = exact_matmul_mod(x.double(), w.double(), SLALOM_MODULUS, chunk)
        assert torch.equal(got.long(), want)
    assert torch.equal(centre(torch.tensor([0.0, 5242883.0, 5242884.0]), SLALOM_MODULUS),
                       torch.tensor([0.0, 5242883.0, -5242883.0]))
    y, c = (torch.randint(0, SLALOM_MODULUS, (4000,), generator=g, dtype=torch.int32) for _ in range(2))
    edges = torch.tensor([0, SLALOM_MODULUS - 1, 5242883, 5242884, 0, 1], dtype=torch.int32)
    y, c = torch.cat([y, edges]), torch.cat([c, edges.flip(0)])
    assert torch.equal(centred_difference(y, c, SLALOM_MODULUS), centre(torch.remainder(y - c, SLALOM_MODULUS), SLALOM_MODULUS))


def test_slalom_masked_inputs_are_uniform_on_zq():
    m = model("tiny-llama")
    engine, _ = run(m, "slalom", prompts(8, 60, 5000), 4, record_view=True)
    values = torch.cat([e.tensor.flatten().long() for e in engine.view.exposures]).numpy()
    assert values.min() >= 0 and values.max() < SLALOM_MODULUS
    counts = np.bincount((values * 64) // SLALOM_MODULUS, minlength=64)
    assert stats.chisquare(counts).pvalue > 1e-3
    assert values.size > 100_000


def test_slalom_wrap_bounds_are_sound_and_the_exact_count_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    d = 96
    spread = torch.randn(200, d, generator=g) * torch.logspace(-1, 3, 200)[:, None]  # rows from small to huge
    spread[:, 5] *= 30.0                                                              # one heavy channel, as in LLMs
    w_q = torch.randint(-40, 41, (50, d), generator=g).double()
    l1, l2 = w_q.abs().sum(-1).max().item(), torch.linalg.vector_norm(w_q, dim=-1).max().item()
    top = w_q.abs().sum(-1).argsort(descending=True)[:5]
    limit = SLALOM_MODULUS // 2
    for bits in (8, 3, 0, -2):
        # The rounding's worst case: every entry just past half a step, with the signs of a heavy weight row.
        worst = 0.55 * torch.sign(w_q[top]).float() * 2.0**-bits
        x = torch.cat([spread, worst])
        inf, norm2 = input_norms(x)
        x_q = torch.round(x.double() * 2.0**bits)
        product = x_q @ w_q.T
        peak = product.abs().amax(-1)
        assert (row_bounds(inf, norm2, bits, d, l1, math.inf) >= peak).all(), bits    # Hölder alone
        assert (row_bounds(inf, norm2, bits, d, math.inf, l2) >= peak).all(), bits    # Cauchy–Schwarz alone
        assert exact_wraps(x_q.to(torch.int32), [w_q], l1, SLALOM_MODULUS) == int((product.abs() > limit).sum())
    assert int((torch.round(spread.double() * 256) @ w_q.T).abs().gt(limit).sum()) > 1000  # there are wraps to count
    inf, norm2 = input_norms(spread)
    shift = row_shifts(inf, norm2, 8, d, l1, l2, SLALOM_MODULUS)
    assert (row_bounds(inf, norm2, 8 - shift, d, l1, l2) <= limit).all()
    # The fewest bits: one bit more would leave the bound unsafe wherever a row was shifted at all.
    assert ((shift == 0) | (row_bounds(inf, norm2, 9 - shift, d, l1, l2) > limit)).all()
    assert (shift == 0).sum() > 20 and shift.max() >= 8


def test_slalom_norm_limits_call_a_row_safe_exactly_when_the_full_bounds_do():
    """quantise_input's shortcut (two norms against safe_norm_limits) against row_bounds on the widened norms: the
    limits are the largest float32 norms each bound alone keeps within (q−1)/2, and on rows at, just over
    and far from them the two decisions agree row by row."""
    g = torch.Generator().manual_seed(4)
    d = 96
    w_q = torch.randint(-40, 41, (50, d), generator=g).double()
    l1, l2 = w_q.abs().sum(-1).max().item(), torch.linalg.vector_norm(w_q, dim=-1).max().item()
    limit = SLALOM_MODULUS // 2
    for bits in (8, 3):
        by_inf, by_l2 = safe_norm_limits(bits, d, l1, l2, SLALOM_MODULUS, torch.float32)
        up = lambda v: torch.nextafter(torch.tensor(v), torch.tensor(math.inf)).item()  # noqa: E731
        one = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
        grow = 1.0 + d * torch.finfo(torch.float32).eps
        assert row_bounds(one(by_inf), one(math.inf), bits, d, l1, math.inf).item() <= limit
        assert row_bounds(one(up(by_inf)), one(math.inf), bits, d, l1, math.inf).item() > limit
        assert row_bounds(one(math.inf), one(by_l2) * grow, bits, d, math.inf, l2).item() <= limit
        assert row_bounds(one(math.inf), one(up(by_l2)) * grow, bits, d, math.inf, l2).item() > limit
        # Rows whose largest entry sits at, just above, or well around the ∞-norm limit, with the rest
        # spread so that the 2-norm crosses its own limit too.
        rows = torch.randn(400, d, generator=g) * torch.logspace(-3, 1, 400)[:, None] * by_inf
        rows[:, 0] = torch.tensor([by_inf, up(by_inf)] * 200)
        rows[:, 1:] = rows[:, 1:].clamp(-by_inf, by_inf)
        inf, norm2 = input_norms(rows)
        full = row_bounds(inf, norm2, bits, d, l1, l2) <= limit
        short = ((torch.linalg.vector_norm(rows, math.inf, dim=-1) <= by_inf)
                 | (torch.linalg.vector_norm(rows, dim=-1) <= by_l2))
        assert torch.equal(full, short), bits
        assert 0 < int(full.sum()) < len(rows)
        assert norms_past_limits(rows[full], by_inf, by_l2) is None      # the call-level shortcut
        assert norms_past_limits(rows, by_inf, by_l2) is not None


def test_slalom_per_token_rescales_only_rows_that_could_wrap_and_recovers_them_exactly():
    m = model("tiny-llama")
    engine = SplitEngine(m.model, EngineSettings("slalom"))  # slalom_scaling=per_token, the default
    engine._prepare_banks(64, 64)
    op = next(o for o in engine.ops if o.name == "gate_up")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, op.tee_weights[0].shape[1], generator=g) * 3
    x[0, :8] *= 2000.0                                       # rows whose products cannot fit Z_q at 8 input bits
    _, bits = op.mechanism.quantise_input(op, x.reshape(32, -1))
    bits = bits.flatten()
    assert (bits[8:] == 8).all() and (bits[:8] < 8).all()
    outputs = op.mechanism.run(op, x)
    x_q = torch.round(x.reshape(32, -1).double() * torch.exp2(bits.double())[:, None]).long()
    for out, wq in zip(outputs, op.tee_quantised):
        exact = x_q @ wq.long().T                            # the integer product at each row's own scale
        assert exact.abs().max() <= SLALOM_MODULUS // 2      # no wrap-around
        got = out.reshape(32, -1).double() * torch.exp2(bits.double() + 8)[:, None]
        assert torch.equal(torch.round(got).long(), exact)
    assert op.slalom.wraps == 0 and op.slalom.rows_rescaled == 2 * 8


def _scaled_tiny_llama(gain: float):
    """A private tiny Llama whose RMSNorm gains are uneven (so a bound from the wrong norm shows) and `gain`
    times larger: past a few hundred, Slalom's 8+8 fractional bits no longer fit its products in Z_q."""
    m = load_model(OmegaConf.load(CONF / "tiny-llama.yaml"))
    g = torch.Generator().manual_seed(5)
    norms = [n for layer in m.model.model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    with torch.no_grad():
        for i, norm in enumerate([*norms, m.model.model.norm]):
            norm.weight.copy_(gain * (0.25 + (1 + i) * torch.rand(norm.weight.shape, generator=g) ** 3))
    return m


def _slalom_against_float(m, scaling: str, ps, new_tokens: int):
    """Slalom in batches of 2 (runners.common.generate_batches, which sums the engine's counts per batch) and,
    per op call, from the op's TEE-side input: the largest error against the float product W·x + b relative
    to that product's largest entry, the largest |W_q·x| (real x), and the wrap-arounds of Slalom's fixed 8+8
    bits counted here from the exact integer product at the real (unpadded) positions."""
    from runners.common import generate_batches

    engine = SplitEngine(m.model, EngineSettings("slalom", slalom_scaling=scaling))
    seen = {"error": 0.0, "wraps_8_8": 0, "peak": {}}
    lengths = {max(map(len, ps[i:i + 2])): [len(p) for p in ps[i:i + 2]] for i in range(0, len(ps), 2)}

    def hook(op, x, outputs):
        real = torch.ones(x.shape[:-1], dtype=torch.bool)
        if x.shape[1] > 1:                      # a prefill: each batch row is left-padded to the longest prompt
            for row, n in enumerate(lengths[x.shape[1]]):
                real[row, :x.shape[1] - n] = False
        flat = x.reshape(-1, x.shape[-1]).double()
        x_q = torch.round(flat * 2**8).long()[real.flatten()]
        for out, (w, b), wq in zip(outputs, op.tee_params, op.tee_quantised):
            want = flat @ w.double().T + (0.0 if b is None else b.double())
            error = (out.reshape(want.shape).double() - want).abs().max() / want.abs().max()
            seen["error"] = max(seen["error"], error.item())
            seen["wraps_8_8"] += int(((x_q @ wq.long().T).abs() > SLALOM_MODULUS // 2).sum())
            seen["peak"][op.label] = max(seen["peak"].get(op.label, 0.0), (flat @ wq.T).abs().max().item())
        return outputs

    engine.set_output_hook(hook)
    res = generate_batches(engine, ps, batch_size=2, max_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None,
                           stop_at_eos=False, desc="slalom")
    return engine, res.slalom, seen


def test_slalom_counts_every_wrap_around_and_its_default_scaling_has_none():
    ps = prompts(4, 30, 5000)
    _, own, own_seen = _slalom_against_float(_scaled_tiny_llama(1.0), "fixed", ps, 4)
    assert own["wraps"] == own_seen["wraps_8_8"] == 0         # at the model's own scale the field suffices
    assert own_seen["error"] < 0.15    # Slalom's own quantisation error: 10% of the largest output (8-bit weights)
    m = _scaled_tiny_llama(1000.0)
    engine, fixed, fixed_seen = _slalom_against_float(m, "fixed", ps, 4)
    assert fixed["wraps"] == fixed_seen["wraps_8_8"] > 10_000  # every wrap-around counted, none invented
    assert set(fixed["ops"]) == {op.label for op in engine.ops}
    assert sum(e["wraps"] for e in fixed["ops"].values()) == sum(t["wraps"] for t in fixed["by_op_type"].values())
    assert fixed_seen["error"] > 0.5                           # wrapped outputs are off by multiples of q·2^−16
    _, per_token, token_seen = _slalom_against_float(m, "per_token", ps, 4)
    assert per_token["wraps"] == 0 and per_token["rows_rescaled"] > 0 and per_token["scaling"] == "per_token"
    assert token_seen["error"] < 1.25 * own_seen["error"]     # as close to W·x as Slalom at the model's own scale


def test_slalom_per_op_bits_come_from_a_worst_case_that_holds():
    engine, stats, seen = _slalom_against_float(_scaled_tiny_llama(1000.0), "per_op", prompts(4, 30, 5000), 4)
    assert stats["wraps"] == 0 and seen["error"] < 0.15
    limit = SLALOM_MODULUS // 2
    for op in engine.ops:
        worst, peak, bits = op.slalom.worst_case, seen["peak"][op.label], op.slalom.in_bits
        assert peak <= worst < 10 * peak, op.label            # a bound that holds on every input, and not vacuous
        assert stats["ops"][op.label]["in_bits"] == bits < 8
        l1 = max(w.abs().sum(-1).max().item() for w in op.tee_quantised)
        assert 2.0**bits * worst <= limit < 2.0 ** (bits + 1) * worst * 1.001 + l1 / 2, op.label  # the most bits that fit


def test_slalom_per_op_worst_case_is_reached_by_an_input_built_for_it():
    # One-token prompts whose embeddings point where the bound puts the worst case: the first at the heaviest
    # row of layer 0's QKV after its input norm, the second at the heaviest row of its O, whose weights here
    # read query head 1 only (KV head 0 under grouped-query attention) so that the bound's sum over heads is
    # reached. A token attends to itself alone, so O's input is its value vector (computed in the TEE here:
    # only O is offloaded). Each input reaches its bound, through the model's own norm and attention.
    m = _scaled_tiny_llama(1.0)
    layer = m.model.model.layers[0]
    alpha = layer.input_layernorm.weight.detach().double()
    d, head_dim = alpha.numel(), 16
    with torch.no_grad():
        layer.self_attn.o_proj.weight[:, :head_dim] = 0.0
        layer.self_attn.o_proj.weight[:, 2 * head_dim:] = 0.0
    engines = {op: SplitEngine(m.model, EngineSettings("slalom", slalom_scaling="per_op", offload=(op,)))
               for op in ("qkv", "o")}
    qkv_op, o_op = engines["qkv"].ops[0], engines["o"].ops[0]
    qkv, o = torch.cat(qkv_op.tee_quantised), o_op.tee_quantised[0]
    sup_qkv = worst_case_products(m.model, "qkv", 0, qkv_op.tee_quantised)
    sup_o = worst_case_products(m.model, "o", 0, [o])
    r_qkv, r_o = int(sup_qkv.argmax()), int(sup_o.argmax())
    w_v = layer.self_attn.v_proj.weight.detach().double()[:head_dim]                 # KV head 0
    directions = [qkv[r_qkv] * alpha, (o[r_o, head_dim:2 * head_dim] @ w_v) * alpha]
    with torch.no_grad():
        for token, u in zip((7, 8), directions):   # RMSNorm(√d·u/‖u‖) = α ⊙ √d·u/‖u‖
            m.model.model.embed_tokens.weight[token] = (math.sqrt(d) * u / u.norm()).float()
    seen = {}
    for engine in engines.values():
        engine.set_output_hook(lambda op, x, outputs: seen.setdefault(op.label, x.detach().clone()) is None or outputs)
        engine.generate([[7], [8]], 1, pad_token_id=0)
    reached_qkv = (seen["qkv[0]"][0, -1].double() @ qkv[r_qkv]).abs().item()
    reached_o = (seen["o[0]"][1, -1].double() @ o[r_o]).abs().item()
    assert reached_qkv == pytest.approx(sup_qkv[r_qkv].item(), rel=1e-5)
    assert reached_o == pytest.approx(sup_o[r_o].item(), rel=1e-5)
    assert (qkv_op.slalom.worst_case, o_op.slalom.worst_case) == (sup_qkv.max().item(), sup_o.max().item())


def test_slalom_scalings_are_the_ones_the_config_schema_accepts():
    from harness.splitee import config

    assert config.SLALOM_SCALINGS == SLALOM_SCALINGS


@pytest.mark.parametrize("bad, match", [
    (dict(configuration="nope"), "unknown configuration"),
    (dict(configuration="ep1", epsilon=1.0, offload=("qkv", "down")), "down"),
    (dict(configuration="t3", offload=("qkv", "mlp")), "unknown offloaded"),
    (dict(configuration="slalom", slalom_scaling="wide"), "slalom_scaling"),
    (dict(configuration="slalom", offload=("qkv", "down"), slalom_scaling="per_op"), "per_op has no input bound"),
])
def test_bad_settings_are_user_errors(bad, match):
    with pytest.raises(UserError, match=match):
        SplitEngine(model("tiny-llama").model, EngineSettings(**bad))


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan"), None])
def test_an_unchecked_epsilon_is_a_bug_before_any_mask(epsilon):
    """ε's positivity is checked once, where the config is validated (harness/schema.py, the user's one-line
    error); the engine relies on it, and the registry's assert stops a library caller's bad ε before a mask."""
    engine = SplitEngine(model("tiny-llama").model, EngineSettings("ep1", epsilon=epsilon))
    with pytest.raises(AssertionError, match="epsilon must be a positive number for ep1"):
        engine.generate([[1, 2]], 1, pad_token_id=0)


def test_bad_generation_requests_are_user_errors():
    m = model("tiny-llama")
    engine = SplitEngine(m.model, EngineSettings("t3"))
    with pytest.raises(UserError, match="max_new_tokens"):
        engine.generate([[1, 2]], 0, pad_token_id=0)
    too_long = [[5] * m.model.config.max_position_embeddings]
    with pytest.raises(UserError, match="context"):
        engine.generate(too_long, 4, pad_token_id=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_gpu_without_cuda_is_refused_unless_fallback_is_allowed():
    m = model("tiny-llama")
    with pytest.raises(UserError, match="CUDA"):
        SplitEngine(m.model, EngineSettings("gpu"))
    engine = SplitEngine(m.model, EngineSettings("gpu", allow_cpu_fallback=True))
    assert engine.describe()["accelerator_is_cpu_fallback"] is True
    assert "CPU" in engine.describe()["accelerator"]


def test_tee_kind_is_never_claimed_without_evidence(monkeypatch):
    from harness import devices

    monkeypatch.setattr(devices.Path, "exists", lambda self: False)
    monkeypatch.setattr(devices, "cpu_flags", devices.cpu_flags.__wrapped__)   # cpuinfo read at every call
    monkeypatch.setattr(devices.Path, "read_text", lambda self: "flags\t: fpu sse2 avx\n")
    assert devices.detect_tee_kind() == "emulated"
    monkeypatch.setattr(devices.Path, "read_text", lambda self: "flags\t: fpu tdx_guest sse2\n")
    assert devices.detect_tee_kind() == "tdx"


@pytest.mark.slow
def test_gemma3_split_configurations_run_and_t3_matches_cpu():
    """Gemma 3: gain stored as 1+w, GELU-gated MLP, QK-norm, sliding-window layers (first load ~90 s)."""
    m = model("gemma3-270m")
    ps = [m.tokenizer("The capital of France is").input_ids, m.tokenizer("Water boils at a temperature of").input_ids]
    _, cpu = run(m, "cpu", ps, 10)
    _, t3 = run(m, "t3", ps, 10)
    assert t3.output_ids == cpu.output_ids
    engine, ep1 = run(m, "ep1", ps, 10, epsilon=5.0)
    assert all(len(o) == 10 for o in ep1.output_ids)
    gains = {r["op"]: r["gain_l4"] for r in engine.sensitivity_table() if r["layer"] == 0}
    # Gemma stores the gain as 1 + w; the bound must use the effective gain (all ‖α‖₄ well above 0).
    assert min(gains.values()) > 1.0


def test_settings_defaults_live_in_the_yaml(hydra_conf):
    """Defaults are written in conf/ only. EngineSettings' are the composed `engine` section's and `seed` (read
    from conf/splitee/default.yaml and conf/config.yaml), so a capture or a test that names only what it changes runs the runners' engine;
    TrainSettings has none (attacks/splitee/suite.py passes attack.train, which names every field but the run's seed)."""
    import dataclasses

    from attacks.inversion import TrainSettings

    from ..conftest import compose_config

    cfg = compose_config([])
    engine = {k: v for k, v in OmegaConf.to_container(cfg.engine).items() if k != "_target_"}
    defaults = EngineSettings("t3")
    assert {k: getattr(defaults, k) for k in engine} == {k: tuple(v) if isinstance(v, list) else v
                                                         for k, v in engine.items()}
    assert defaults.seed == cfg.seed and defaults.epsilon is None
    assert {f.name for f in dataclasses.fields(EngineSettings)} == {*engine, "configuration", "epsilon", "seed"}
    for f in dataclasses.fields(TrainSettings):
        assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name
    assert {f.name for f in dataclasses.fields(TrainSettings)} == (set(cfg.attack.train) - {"threads"}) | {"seed"}


def test_the_engine_named_by_the_yaml_and_hashed_under_its_old_path(hydra_conf):
    """conf/splitee/default.yaml's `engine._target_` builds harness/splitee/engine.py's EngineSettings, and a
    run's config hash takes that value in as harness.split.engine.EngineSettings, the path every SpliTEE run
    finished before the engine moved (issue 30) hashed: such a run hashes as the same config with the old path
    written (harness/schema.py HASHED_AS). Any other value still moves the hash."""
    from hydra.utils import instantiate

    from harness.results import config_hash
    from runners.splitee import attack, fidelity, sequential_attack

    from ..conftest import compose_config

    for experiment, runner in (("smoke", fidelity), ("attack_smoke", attack),
                               ("sequential_attack_smoke", sequential_attack)):
        cfg = compose_config([f"experiment={experiment}"])
        assert cfg.engine._target_ == "harness.splitee.engine.EngineSettings"
        settings = instantiate(cfg.engine, configuration="ep1", epsilon=1.0, seed=0, _convert_="all")
        assert type(settings) is EngineSettings
        old = compose_config([f"experiment={experiment}", "engine._target_=harness.split.engine.EngineSettings"])
        assert runner.semantic_config(cfg)["engine"]["_target_"] == "harness.split.engine.EngineSettings"
        assert config_hash(runner.semantic_config(cfg)) == config_hash(runner.semantic_config(old))
        other = compose_config([f"experiment={experiment}", "engine._target_=harness.splitee.engine.Other"])
        assert config_hash(runner.semantic_config(other)) != config_hash(runner.semantic_config(cfg))

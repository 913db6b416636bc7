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
from harness.split.engine import EngineSettings, SplitEngine
from harness.split.mechanisms import SLALOM_MODULUS, centre, exact_matmul_mod, quantise

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"


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


def _noise_by_op(m, ps, new_tokens, configuration, **kw):
    """(masked − clean) per op type from two recorded views: the configuration's and T3's."""
    clean_engine, clean = run(m, "t3", ps, new_tokens, record_view=True)
    noisy_engine, noisy = run(m, configuration, ps, new_tokens, record_view=True, **kw)
    assert noisy.output_ids == clean.output_ids, "precondition: same tokens, so the clean inputs line up"
    deltas = {(r["op"], r["layer"]): r["delta"] for r in noisy_engine.sensitivity_table()}
    out: dict[str, list[torch.Tensor]] = {}
    for c, n in zip(clean_engine.view.exposures, noisy_engine.view.exposures):
        assert (c.op, c.layer, c.step, c.shape) == (n.op, n.layer, n.step, n.shape)
        out.setdefault(c.op, []).append(((n.tensor - c.tensor) / deltas[(c.op, c.layer)]).double())
    return out


def test_ep1_noise_has_the_promised_scale_per_op():
    m = model("tiny-llama")
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


def test_slalom_masked_inputs_are_uniform_on_zq():
    m = model("tiny-llama")
    engine, _ = run(m, "slalom", prompts(8, 60, 5000), 4, record_view=True)
    values = torch.cat([e.tensor.flatten().long() for e in engine.view.exposures]).numpy()
    assert values.min() >= 0 and values.max() < SLALOM_MODULUS
    counts = np.bincount((values * 64) // SLALOM_MODULUS, minlength=64)
    assert stats.chisquare(counts).pvalue > 1e-3
    assert values.size > 100_000


@pytest.mark.parametrize("bad, match", [
    (dict(configuration="nope"), "unknown configuration"),
    (dict(configuration="ep1", epsilon=0.0), "positive"),
    (dict(configuration="ep1", epsilon=-1.0), "positive"),
    (dict(configuration="ep1", epsilon=float("nan")), "positive"),
    (dict(configuration="ep1", epsilon=1.0, offload=("qkv", "down")), "down"),
    (dict(configuration="t3", offload=("qkv", "mlp")), "unknown offloaded"),
])
def test_bad_settings_are_user_errors(bad, match):
    with pytest.raises(UserError, match=match):
        SplitEngine(model("tiny-llama").model, EngineSettings(**bad))


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

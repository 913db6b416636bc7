"""The noise bank of bounded memory (harness/splitee/noise_bank.py): entries drawn piece by piece are bit for
bit those of one whole draw, every entry is served once, the memory held stays within the bound whatever
the generation length, and the engine's results do not depend on the bound."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from harness.errors import UserError
from harness.models import load_model
from harness.splitee.engine import EngineSettings, SplitEngine
from harness.splitee.mechanisms import SLALOM_MODULUS, ExactProduct, exact_matmul_mod
from harness.splitee.noise_bank import (
    PIECE_ROWS,
    NoiseBank,
    gaussian_chunk_maker,
    row_bytes,
    slalom_chunk_maker,
    stream_seed,
)

from ..conftest import run_cli_in_process

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"


@functools.lru_cache(maxsize=None)
def tiny():
    return load_model(OmegaConf.load(CONF / "tiny-llama.yaml"))


def _weights(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(72, 40, generator=g), torch.randn(24, 40, generator=g)]


def _joined(served) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A request's (masks, [corrections]) as single tensors, its pieces concatenated (the mechanisms work on
    the pieces where they lie; the tests compare whole requests)."""
    parts = served.parts
    return (torch.cat([m for _, m, _ in parts]),
            [torch.cat([cs[i] for _, _, cs in parts]) for i in range(len(parts[0][2]))])


def _serve_all(bank: NoiseBank, requests: list[int], top_up_between: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    masks, corrections = [], []
    for n in requests:
        m, cs = _joined(bank.take(n, refill_size=1))
        masks.append(m.clone())
        corrections.append([c.clone() for c in cs])
        if top_up_between:
            bank.top_up(low_water=0.5)
    return torch.cat(masks), [torch.cat([cs[i] for cs in corrections]) for i in range(len(corrections[0]))]


# Request sizes like a generation's: a big prefill, then small decode steps (and one odd size).
REQUESTS = [300, 7, 7, 7, 50, 1, 7, 7, 200, 7, 13]


@pytest.mark.parametrize("capacity", [16, 48, 100, None])
def test_gaussian_pieces_are_bit_identical_to_one_whole_draw(capacity):
    weights = _weights()
    total = sum(REQUESTS)
    bank = NoiseBank("qkv[0]", gaussian_chunk_maker(weights), seed=5, capacity_rows=capacity)
    bank.ensure(total)
    masks, corrections = _serve_all(bank, REQUESTS, top_up_between=True)
    # The old, unbounded bank: one draw of the whole segment from the segment's own stream.
    g = torch.Generator().manual_seed(stream_seed(5, "qkv[0]", 0))
    whole = torch.randn(total, 40, generator=g, dtype=torch.float32)
    assert torch.equal(masks, whole)
    for c, w in zip(corrections, weights):
        assert torch.equal(c, whole @ w.T)
    if capacity is not None:
        assert bank.stats.pieces > 1   # really drawn in pieces


def test_slalom_pieces_are_bit_identical_to_one_whole_draw():
    g = torch.Generator().manual_seed(1)
    quantised = [torch.randint(-300, 300, (24, 40), generator=g).double()]
    matmul = lambda x, w: exact_matmul_mod(x, w, SLALOM_MODULUS, 1 << 20)  # noqa: E731
    total = sum(REQUESTS)
    product = ExactProduct(quantised, SLALOM_MODULUS, torch.device("cpu"), int8=True)   # pieces of 32 rows: int8
    bank = NoiseBank("o[1]", slalom_chunk_maker(quantised, product), seed=2, capacity_rows=32)
    bank.ensure(total)
    masks, corrections = _serve_all(bank, REQUESTS, top_up_between=True)
    g = torch.Generator().manual_seed(stream_seed(2, "o[1]", 0))
    whole = torch.randint(0, SLALOM_MODULUS, (total, 40), generator=g, dtype=torch.int64)
    assert torch.equal(masks, whole.to(torch.int32))
    assert torch.equal(corrections[0], matmul(whole.double(), quantised[0]).to(torch.int32))


def test_every_entry_is_served_once_across_segments_and_refills():
    bank = NoiseBank("gate_up[0]", gaussian_chunk_maker(_weights()), seed=0, capacity_rows=32)
    bank.fill(100)   # a fixed supply (engine.bank_capacity): exhausted below, then refilled
    _serve_all(bank, REQUESTS, top_up_between=True)
    spans = bank.ledger
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap
    assert spans[-1][1] == sum(REQUESTS) == bank.stats.entries_used <= bank.stats.entries_made
    assert bank.stats.refills > 0


def test_exhaustion_is_an_error_when_asked():
    bank = NoiseBank("qkv[0]", gaussian_chunk_maker(_weights()), seed=0, on_exhaustion="error", capacity_rows=16)
    bank.fill(40)
    bank.take(30, refill_size=1)
    with pytest.raises(UserError, match="exhausted after 30 entries"):
        bank.take(11, refill_size=1)


def test_memory_held_ahead_stays_within_the_capacity():
    weights = _weights()
    per_row = row_bytes(weights)
    bank = NoiseBank("qkv[0]", gaussian_chunk_maker(weights), seed=0, capacity_rows=64)
    bank.ensure(8000)
    assert bank.stats.bytes == bank.ready * per_row   # row_bytes is what a piece really holds
    bank.take(3510, refill_size=1)   # a prefill request, far above the capacity: made for it, then let go
    assert bank.stats.bytes <= 2 * PIECE_ROWS * per_row
    for _ in range(600):   # decode-like: 7 rows a step, topped up between steps
        bank.take(7, refill_size=1)
        bank.top_up(low_water=0.5)
        # A piece is rounded up to PIECE_ROWS rows and may absorb a segment's short rest.
        assert bank.stats.bytes <= (64 + 2 * PIECE_ROWS) * per_row
    # At its highest: what was ready beside the piece made for the prefill request.
    assert bank.memory.peak <= (64 + 3510 + PIECE_ROWS) * per_row


def _view_digest(engine: SplitEngine) -> str:
    digest = hashlib.sha256()
    for e in engine.view.exposures:
        digest.update(f"{e.op}/{e.layer}/{e.step}".encode())
        digest.update(e.tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _generate(configuration: str, new_tokens: int, bank_bytes: int | None, **kw):
    m = tiny()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 5000, (n,), generator=g).tolist() for n in (30, 24, 17)]
    engine = SplitEngine(m.model, EngineSettings(configuration, bank_bytes=bank_bytes, record_view=True, seed=1, **kw))
    first = engine.generate(prompts, new_tokens, pad_token_id=m.tokenizer.pad_token_id)
    second = engine.generate(prompts[:2], new_tokens, pad_token_id=m.tokenizer.pad_token_id)  # leftovers carry over
    return engine, [first.output_ids, second.output_ids], second.bank


@pytest.mark.parametrize("configuration,kw", [("ep1", {"epsilon": 1.0}), ("slalom", {})])
def test_engine_results_do_not_depend_on_the_bound(configuration, kw):
    bounded, out_b, bank_b = _generate(configuration, 6, 200_000, **kw)
    unbounded, out_u, bank_u = _generate(configuration, 6, None, **kw)
    assert out_b == out_u
    assert _view_digest(bounded) == _view_digest(unbounded)   # every masked input, bit for bit
    assert bank_b["capacity_rows"] == PIECE_ROWS and bank_u["capacity_rows"] is None
    assert bank_b["pieces"] > bank_u["pieces"] and bank_b["peak_bytes"] < bank_u["peak_bytes"]
    assert bank_b["entries_used"] == bank_u["entries_used"]


def test_bounded_peak_does_not_grow_with_the_generation_length():
    engine, _, bank = _generate("ep1", 24, 200_000, epsilon=1.0)
    per_row = {op.label: row_bytes(op.tee_weights) for op in engine.ops}
    # Each bank ahead of use: its capacity (+ a piece's rounding); beside it, one op's prefill request
    # (3 prompts x 30 positions) made for that request alone.
    ahead = sum((bank["capacity_rows"] + 2 * PIECE_ROWS) * b for b in per_row.values())
    bound = ahead + 3 * 30 * max(b for label, b in per_row.items() if not label.startswith("lm_head"))
    assert bank["peak_bytes"] <= bound
    unbounded = {t: _generate("ep1", t, None, epsilon=1.0)[2]["peak_bytes"] for t in (4, 24)}
    assert unbounded[24] > 1.5 * unbounded[4] and unbounded[24] > bound   # it holds the whole generation


def test_bank_bytes_must_be_positive(tmp_path):
    with pytest.raises(UserError, match="bank_bytes"):
        EngineSettings("ep1", epsilon=1.0, bank_bytes=0).validate()
    res = run_cli_in_process(["experiment=smoke", "engine.bank_bytes=0"], tmp_path / "out", tmp_path / "cache")
    assert res.returncode == 2 and len(res.stderr_lines) == 1
    assert res.stderr_lines[0] == "splitbench: error: engine.bank_bytes must be >= 1 (bytes) or null, got 0"
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))


def test_a_request_spanning_pieces_is_served_as_views_of_them_not_a_copy():
    weights = _weights()
    bank = NoiseBank("gate_up[0]", gaussian_chunk_maker(weights), seed=3, capacity_rows=PIECE_ROWS)
    bank.ensure(100)
    bank.take(5, refill_size=1)
    served = bank.take(60, refill_size=1)      # 11 ready rows of the first piece, the rest made for it
    assert [lo for lo, _, _ in served.parts] == [0, 11]
    assert all(m._base is not None and all(c._base is not None for c in cs) for _, m, cs in served.parts)
    g = torch.Generator().manual_seed(stream_seed(3, "gate_up[0]", 0))
    whole = torch.randn(100, 40, generator=g, dtype=torch.float32)
    masks, corrections = _joined(served)
    assert torch.equal(masks, whole[5:65]) and torch.equal(corrections[1], whole[5:65] @ weights[1].T)

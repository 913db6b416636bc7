"""Masks and their corrections, precomputed inside the TEE and each consumed exactly once (paper §6.2).

Gaussian banks hold masks at unit scale (η ~ N(0, I)) and their corrections W·η; by linearity a mask
σ·η has correction σ·(W·η), so one bank serves EP1, EPN and every ε. Slalom banks hold uniform masks r in
Z_q and corrections W_q·r mod q. The bank keeps a ledger of the entry ranges it has served so that tests
can check that no entry is ever served twice.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import torch

from harness.errors import UserError

EXHAUSTION_POLICIES = ("refill", "error")


def stream_seed(*parts: object) -> int:
    """A stable 63-bit seed for one (seed, op, layer, chunk) stream, independent of Python's hash salt."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class BankStats:
    bytes: int = 0             # bytes currently held
    peak_bytes: int = 0
    precompute_s: float = 0.0  # all mask + correction generation, initial and refills
    refill_s: float = 0.0      # the part of it done during a generation (counted as TEE time)
    entries_made: int = 0
    entries_used: int = 0
    refills: int = 0


@dataclass
class NoiseBank:
    """The bank of one offloaded op (one layer's QKV, O, Gate/Up, or the LM head).

    `make_chunk(n, generator)` returns (masks [n, d], [corrections [n, out_m] per member]).
    """

    label: str
    make_chunk: object
    seed: int
    on_exhaustion: str = "refill"
    stats: BankStats = field(default_factory=BankStats)
    ledger: list[tuple[int, int]] = field(default_factory=list)
    _masks: torch.Tensor | None = None
    _corrections: list[torch.Tensor] = field(default_factory=list)
    _cursor: int = 0           # next unserved row in the current chunk
    _base: int = 0             # global serial number of the current chunk's row 0
    _chunks: int = 0

    def __post_init__(self) -> None:
        if self.on_exhaustion not in EXHAUSTION_POLICIES:
            raise UserError(f"engine.bank_on_exhaustion must be one of {EXHAUSTION_POLICIES}, got {self.on_exhaustion!r}")

    @property
    def remaining(self) -> int:
        return 0 if self._masks is None else self._masks.shape[0] - self._cursor

    def fill(self, n: int) -> float:
        """Precompute n fresh entries, keeping any unserved ones; returns the seconds it took."""
        start = time.perf_counter()
        generator = torch.Generator().manual_seed(stream_seed(self.seed, self.label, self._chunks))
        self._chunks += 1
        masks, corrections = self.make_chunk(n, generator)
        if self.remaining:
            keep = slice(self._cursor, None)
            masks = torch.cat([self._masks[keep], masks])
            corrections = [torch.cat([old[keep], new]) for old, new in zip(self._corrections, corrections)]
        self._base += self._cursor
        self._masks, self._corrections, self._cursor = masks, corrections, 0
        self.stats.entries_made += n
        self.stats.bytes = masks.nbytes + sum(c.nbytes for c in corrections)
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes)
        elapsed = time.perf_counter() - start
        self.stats.precompute_s += elapsed
        return elapsed

    def ensure(self, n: int) -> float:
        """Top the bank up before a generation so that n entries are ready (time not counted as inference)."""
        return self.fill(n - self.remaining) if self.remaining < n else 0.0

    def take(self, n: int, refill_size: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Serve the next n entries; on exhaustion refill (timed as TEE work) or stop, as configured."""
        if self.remaining < n:
            if self.on_exhaustion == "error":
                raise UserError(
                    f"noise bank {self.label} exhausted after {self.stats.entries_used} entries; raise "
                    "engine.bank_capacity or set engine.bank_on_exhaustion=refill"
                )
            self.stats.refill_s += self.fill(max(refill_size, n - self.remaining))
            self.stats.refills += 1
        lo, hi = self._cursor, self._cursor + n
        self._cursor = hi
        self.ledger.append((self._base + lo, self._base + hi))
        self.stats.entries_used += n
        return self._masks[lo:hi], [c[lo:hi] for c in self._corrections]


def gaussian_chunk_maker(weights: list[torch.Tensor]):
    """Unit-scale Gaussian masks and their float32 corrections W·η for the given member weights."""
    d = weights[0].shape[1]

    def make(n: int, generator: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
        masks = torch.randn(n, d, generator=generator, dtype=torch.float32)
        return masks, [masks @ w.T for w in weights]

    return make


def slalom_chunk_maker(quantised_weights: list[torch.Tensor], modulus: int, exact_matmul):
    """Uniform masks in Z_q and corrections W_q·r mod q, both exact integers (stored as int32)."""
    d = quantised_weights[0].shape[1]

    def make(n: int, generator: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
        masks = torch.randint(0, modulus, (n, d), generator=generator, dtype=torch.int64)
        corrections = [exact_matmul(masks.double(), w).to(torch.int32) for w in quantised_weights]
        return masks.to(torch.int32), corrections

    return make

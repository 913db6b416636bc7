"""Masks and their corrections, precomputed inside the TEE and each consumed exactly once (paper §6.2).

Gaussian banks hold masks at unit scale (η ~ N(0, I)) and their corrections W·η; by linearity a mask
σ·η has correction σ·(W·η), so one bank serves EP1, EPN and every ε. Slalom banks hold uniform masks r in
Z_q and corrections W_q·r mod q. The bank keeps a ledger of the entry ranges it has served so that tests
can check that no entry is ever served twice.

Bounded memory. A bank's *supply* (the entries it has promised: sized per generate() call, or
engine.bank_capacity) is planned as segments, one seeded random stream each, and *materialised* lazily in
pieces, so that at most `capacity_rows` computed entries wait in memory (the engine derives it from
engine.bank_bytes, docs/noise_bank.md). A segment drawn in pieces gives bit for bit the entries one draw
of the whole segment gave: every piece but a segment's last has a multiple of 16 rows (torch's CPU
`randn` transforms its uniforms in blocks of 16 values, so a stream cut at a multiple of 16 continues
where it stopped) and at least 16 rows (so `masks @ W.T` takes the same BLAS path as on the whole
segment; tests/splitee/test_noise_bank.py checks both against one full draw).
"""
from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from harness.errors import UserError

EXHAUSTION_POLICIES = ("refill", "error")
PIECE_ROWS = 16   # the granularity of a piece: see the module docstring


def stream_seed(*parts: object) -> int:
    """A stable 63-bit seed for one (seed, op, layer, chunk) stream, independent of Python's hash salt."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def row_bytes(weights: list[torch.Tensor]) -> int:
    """Bytes of one bank entry for an op with these member weights ([out_m, d] each): a d-wide mask and
    one out_m-wide correction per member, 4 bytes a value in both banks (float32 Gaussian, int32 Slalom)."""
    return 4 * (weights[0].shape[1] + sum(w.shape[0] for w in weights))


@dataclass
class BankMemory:
    """Bytes materialised and not yet served, over all banks of one engine (their sum at each moment, so
    `peak_bytes` is what the banks really held at once, not a sum of per-bank peaks)."""

    held: int = 0
    peak: int = 0

    def add(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)


@dataclass
class BankStats:
    bytes: int = 0             # bytes currently held (materialised, unserved)
    peak_bytes: int = 0
    precompute_s: float = 0.0  # all mask + correction generation, ahead of a generation and during it
    refill_s: float = 0.0      # the part of it done during a generation (counted as TEE time)
    entries_planned: int = 0   # the supply promised (what the unbounded bank made at once)
    entries_made: int = 0      # materialised so far
    entries_used: int = 0
    refills: int = 0           # supply exhausted and extended (engine.bank_on_exhaustion=refill)
    pieces: int = 0            # materialisations


@dataclass(frozen=True)
class Served:
    """The n entries of one request as views of the pieces they lie in: `parts` holds (first row of the
    request, masks, [corrections]) per piece. A request that spans pieces is not joined into one tensor:
    a prefill's request spans the bank's ready rows and the piece made for it, and that copy was ep1's
    whole 0.73 s "other" excess over t3 in SmolLM2's 10 s prefill (docs/benchmarks/README.md, one thread)."""

    parts: tuple[tuple[int, torch.Tensor, list[torch.Tensor]], ...]


@dataclass
class _Segment:
    """Planned entries of one seeded stream, drawn piece by piece from the same generator."""

    generator: torch.Generator
    rows_left: int


@dataclass
class NoiseBank:
    """The bank of one offloaded op (one layer's QKV, O, Gate/Up, or the LM head).

    `make_chunk(n, generator)` returns (masks [n, d], [corrections [n, out_m] per member]).
    `capacity_rows`: at most this many materialised entries are kept ahead of use (None: a whole planned
    segment at once, the unbounded bank); a single request larger than that is materialised for it alone.
    """

    label: str
    make_chunk: object
    seed: int
    on_exhaustion: str = "refill"
    capacity_rows: int | None = None
    memory: BankMemory = field(default_factory=BankMemory)
    stats: BankStats = field(default_factory=BankStats)
    ledger: list[tuple[int, int]] = field(default_factory=list)
    _pending: deque = field(default_factory=deque)   # _Segment, oldest first
    _ready: deque = field(default_factory=deque)     # (masks, [corrections], bytes), oldest first
    _cursor: int = 0           # next unserved row of _ready[0]
    _ready_rows: int = 0       # unserved materialised rows
    _held_rows: int = 0        # rows of the pieces in _ready (served or not)
    _served: int = 0           # global serial number of the next entry served
    _chunks: int = 0           # segments planned (each its own stream)

    def __post_init__(self) -> None:
        if self.on_exhaustion not in EXHAUSTION_POLICIES:
            raise UserError(f"engine.bank_on_exhaustion must be one of {EXHAUSTION_POLICIES}, got {self.on_exhaustion!r}")
        if self.capacity_rows is not None and self.capacity_rows < 1:
            raise ValueError(f"capacity_rows must be >= 1 or None, got {self.capacity_rows}")

    # ------------------------------------------------------------------ supply
    @property
    def remaining(self) -> int:
        """Entries promised and not yet served (materialised or not)."""
        return self._ready_rows + sum(s.rows_left for s in self._pending)

    @property
    def ready(self) -> int:
        """Entries materialised and not yet served."""
        return self._ready_rows

    def plan(self, n: int) -> None:
        """Promise n more entries: a new segment with its own stream (seed, label, segment number)."""
        generator = torch.Generator().manual_seed(stream_seed(self.seed, self.label, self._chunks))
        self._chunks += 1
        self._pending.append(_Segment(generator, n))
        self.stats.entries_planned += n

    def fill(self, n: int) -> float:
        """Promise n fresh entries and materialise ahead up to the capacity; returns the seconds it took."""
        self.plan(n)
        return self.top_up()

    def ensure(self, n: int) -> float:
        """Before a generation: promise enough that n entries can be served, materialise ahead up to the
        capacity (the caller reports this time as precompute, not as inference)."""
        if self.remaining < n:
            self.plan(n - self.remaining)
        return self.top_up()

    # ------------------------------------------------------------------ materialising
    def top_up(self, low_water: float = 1.0) -> float:
        """Materialise planned entries until the pieces held fill `capacity_rows` (all planned entries when
        unbounded), but only when fewer than `low_water` x capacity are ready; returns the seconds it took.
        The rows of a piece already served count until the whole piece is: its tensor is still alive."""
        cap = self.capacity_rows
        if not self._pending or (cap is not None and self._ready_rows >= low_water * cap):
            return 0.0
        start = time.perf_counter()
        while self._pending and (cap is None or self._held_rows < cap):
            self._materialise(self._pending[0].rows_left if cap is None else cap - self._held_rows)
        elapsed = time.perf_counter() - start
        self.stats.precompute_s += elapsed
        return elapsed

    def _materialise(self, want: int) -> None:
        """One piece of at least `want` rows from the oldest planned segment (see the module docstring for
        why a piece is a multiple of PIECE_ROWS rows, or a segment's whole rest)."""
        segment = self._pending[0]
        rows = -(-max(want, 1) // PIECE_ROWS) * PIECE_ROWS
        if segment.rows_left - rows < PIECE_ROWS:
            rows = segment.rows_left
        masks, corrections = self.make_chunk(rows, segment.generator)
        segment.rows_left -= rows
        if segment.rows_left == 0:
            self._pending.popleft()
        size = masks.nbytes + sum(c.nbytes for c in corrections)
        self._ready.append((masks, corrections, size))
        self._ready_rows += rows
        self._held_rows += rows
        self._hold(size)
        self.stats.entries_made += rows
        self.stats.pieces += 1

    def _hold(self, size: int) -> None:
        self.stats.bytes += size
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes)
        self.memory.add(size)

    # ------------------------------------------------------------------ serving
    def take(self, n: int, refill_size: int) -> Served:
        """Serve the next n entries; entries not yet materialised are made now (timed as TEE work); on
        exhaustion of the supply refill (a new segment) or stop, as configured."""
        if self._ready_rows < n:   # the decode's requests almost never get here: they lie in ready rows
            self._make_ready(n, refill_size)
        served = self._serve(n)
        self.ledger.append((self._served, self._served + n))
        self._served += n
        self.stats.entries_used += n
        return served

    def _make_ready(self, n: int, refill_size: int) -> None:
        """Materialise rows until n are ready, extending the supply first if it holds fewer than n."""
        if self.remaining < n:
            if self.on_exhaustion == "error":
                raise UserError(
                    f"noise bank {self.label} exhausted after {self.stats.entries_used} entries; raise "
                    "engine.bank_capacity or set engine.bank_on_exhaustion=refill"
                )
            self.plan(max(refill_size, n - self.remaining))
            self.stats.refills += 1
        start = time.perf_counter()
        while self._ready_rows < n:
            self._materialise(n - self._ready_rows)
        elapsed = time.perf_counter() - start
        self.stats.precompute_s += elapsed
        self.stats.refill_s += elapsed

    def _compact_head(self) -> None:
        """A piece made for one large request (the prefill's) is rounded up to PIECE_ROWS rows, so a few of
        its rows outlive the request and would pin the whole piece until served: copy that short rest
        (fewer than 2 x PIECE_ROWS rows, same values) and let the piece go."""
        masks, corrections, size = self._ready[0]
        rest = masks.shape[0] - self._cursor
        if rest >= 2 * PIECE_ROWS or masks.shape[0] < 4 * rest:
            return
        keep = slice(self._cursor, None)
        small = (masks[keep].clone(), [c[keep].clone() for c in corrections])
        small_size = small[0].nbytes + sum(c.nbytes for c in small[1])
        self._ready[0] = (*small, small_size)
        self._held_rows -= self._cursor
        self._cursor = 0
        self.stats.bytes -= size - small_size
        self.memory.held -= size - small_size

    def _serve(self, n: int) -> Served:
        """The next n ready rows, as views of the pieces they lie in; fully served pieces leave the bank
        (their memory goes once the caller drops the views)."""
        parts: list[tuple[int, torch.Tensor, list[torch.Tensor]]] = []
        need = n
        while need:
            masks, corrections, size = self._ready[0]
            lo = self._cursor
            hi = min(masks.shape[0], lo + need)
            parts.append((n - need, masks[lo:hi], [c[lo:hi] for c in corrections]))
            need -= hi - lo
            if hi == masks.shape[0]:
                self._ready.popleft()
                self._held_rows -= masks.shape[0]
                self._cursor = 0
                self.stats.bytes -= size
                self.memory.held -= size
            else:
                self._cursor = hi
                self._compact_head()
        self._ready_rows -= n
        return Served(tuple(parts))


def gaussian_chunk_maker(weights: list[torch.Tensor]):
    """Unit-scale Gaussian masks and their float32 corrections W·η for the given member weights."""
    d = weights[0].shape[1]

    def make(n: int, generator: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
        masks = torch.randn(n, d, generator=generator, dtype=torch.float32)
        return masks, [masks @ w.T for w in weights]

    return make


def slalom_chunk_maker(quantised_weights: list[torch.Tensor], product):
    """Uniform masks in Z_q and corrections W_q·r mod q, both exact integers (stored as int32).
    `product(masks)` returns (masks @ W_qᵀ) mod q per member as int32 (mechanisms.ExactProduct)."""
    d = quantised_weights[0].shape[1]

    def make(n: int, generator: torch.Generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
        masks = torch.randint(0, product.modulus, (n, d), generator=generator, dtype=torch.int64)
        return masks.to(torch.int32), product(masks)

    return make

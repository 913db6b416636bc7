"""Learned prompt inversion (paper §7.4.1, after Li et al. 2023, "GEIA"): a pretrained decoder LM reads the
exposed vectors through a trainable projection and is taught, by teacher forcing, to emit the prompt.

Layouts of one training sequence (exposures x_1..x_m of m consecutive prompt positions, tokens t_1..t_m):

    prefix  (GEIA):  [P(x_1), ..., P(x_m), SEP, E(t_1), ..., E(t_{m-1})]  → t_1..t_m at the last m positions
    aligned:         [SEP + P(x_1), E(t_1) + P(x_2), ..., E(t_{m-1}) + P(x_m)] → t_1..t_m at every position

P is the projection (standardise with training statistics → a linear map plus a residual MLP (Linear →
GELU → Linear) → scale of the decoder's embeddings), SEP a trained vector, E the decoder's own input
embeddings. For position-wise components the linear map starts at the least-squares (ridge) fit of the
decoder's embedding of each position's token from its exposure — the linear MMSE estimate, under masks
too — and the MLP at zero, so a pretrained decoder reads the prefix as (noisy) tokens from the first step. At evaluation the
decoder decodes greedily m tokens (the attacker knows m from the shapes): after reading [P(x_1..x_m), SEP]
(prefix), or reading P(x_j) added to its own previous output at step j (aligned). The prefix layout is
the paper's (a pretrained decoder copies from the prefix with its induction heads); the aligned layout
puts each exposure where its token is predicted, so nothing has to be located by attention, and it is half
as long (cheaper on a CPU); the decoder's language model still reads the tokens decoded so far.
Position-wise components (QKV, O, Gate/Up, composite) are attacked in windows of `window` positions,
the prompt tiled left to right and the windows' outputs concatenated, which keeps training sequences
short enough for a CPU (a 135M decoder at 2·32 positions). The LM-head component exposes one vector per
prompt at prefill (plus one per decode step): its example is the whole sequence of LM-head rows, the
target the prompt's first `max_target_tokens` tokens.

What is trained (`mode`): `projection` — P and SEP only, the decoder frozen (cheapest; gradients still
flow through the decoder to P); `body` — P, SEP and the decoder's layers and norms, its token embeddings
(and the tied LM head) frozen, so the embedding geometry stays the same for tokens the training set never
showed and what is learned transfers to them; `full` — every decoder weight as well. `body` and `full`
train a private copy of the decoder, with their own learning rate `decoder_lr`. Training stops at
`max_steps` or `max_minutes`, whichever comes first, and keeps the parameters with the lowest validation
loss.

The output head (`head`): `lm` — the decoder's own LM head alone, so every token must be read out of the
exposures by the decoder's attention and layers; `evidence` — position-wise components only: the decoder's
logits for token j plus s·cos(P(x_j), E[v]) for every vocabulary entry v, the cosine of the projected
exposure of position j with the decoder's (frozen) input embeddings, s a trained scale. The exposure of a
position is direct evidence for its token (at layer 0 it is the token's normalised embedding, plus noise);
`lm` must learn to route it through a frozen network and, in 30 CPU-minutes, reaches about 40% token F1
noise-free, while `evidence` gives that evidence a path of its own to the output and leaves the decoder
what it is good at, the prior over text (a product of experts: a learned nearest-embedding reader times
the language model).
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakTensorKeyDictionary

from harness.progress import progress as progress_bar

MODES = ("projection", "body", "full")
LAYOUTS = ("prefix", "aligned")
HEADS = ("lm", "evidence")


@dataclass
class TrainSettings:
    """How the inverter trains. No defaults: the SpliTEE attack's values are conf/splitee/default.yaml `attack.train`
    (attacks/splitee/suite.py passes them); the other systems' inverters (attacks/sanitize/decoder.py,
    attacks/splitft/inverter.py) state theirs."""

    mode: str                             # projection | body | full
    layout: str                           # prefix | aligned
    head: str                             # lm | evidence (position-wise components; see the module doc)
    evidence_scale: float                 # evidence head: the starting scale s of the cosine logits
    window: int
    batch_size: int
    lr: float
    decoder_lr: float                     # body / full: learning rate of the decoder's own weights
    max_steps: int
    max_minutes: float
    eval_every: int
    val_windows: int
    warmup_steps: int
    projection_hidden: int | None         # None: 2 × the decoder's hidden size
    max_target_tokens: int
    gen_batch_size: int
    seed: int

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if not self.evidence_scale > 0:
            raise ValueError(f"evidence_scale must be > 0, got {self.evidence_scale}")
        for name in ("window", "batch_size", "max_steps", "eval_every", "val_windows", "max_target_tokens",
                     "gen_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and self.decoder_lr > 0 and self.max_minutes > 0):
            raise ValueError("lr, decoder_lr and max_minutes must be > 0")


@dataclass
class Example:
    """Exposure rows of one window (or one prompt's LM-head rows), the tokens to emit, and how many."""

    features: torch.Tensor
    target: list[int]
    prompt: int = -1       # index of the prompt it came from
    start: int = 0         # first position of the window in that prompt

    @property
    def length(self) -> int:
        return len(self.target)


def make_examples(features: Sequence[torch.Tensor], tokens: Sequence[Sequence[int]], per_position: bool,
                  window: int, max_target_tokens: int, phases: Sequence[int] = (0,),
                  dtype: torch.dtype | None = None) -> list[Example]:
    """Windows [s, s+window) for s = phase, phase+window, ... of each prompt (per-position components), or
    one example per prompt (LM head). Phase 0 tiles a prompt exactly, as evaluation does; more phases
    give training more (overlapping) windows."""
    out = []
    for r, (f, ids) in enumerate(zip(features, tokens)):
        ids = list(map(int, ids))
        f = f if dtype is None else f.to(dtype)
        if not per_position:
            out.append(Example(f, ids[:max_target_tokens], r, 0))
            continue
        if f.shape[0] != len(ids):
            raise ValueError(f"prompt {r}: {f.shape[0]} exposure rows for {len(ids)} tokens")
        for phase in phases:
            for s in range(phase % window if phase else 0, len(ids), window):
                out.append(Example(f[s:s + window], ids[s:s + window], r, s))
    return out


def shuffle_pairs(examples: Sequence[Example], seed: int) -> list[Example]:
    """The negative control's training set: every example keeps its exposures but gets the tokens of
    another example of the same length (a derangement within each length group), so exposures carry no
    information about the tokens."""
    gen = torch.Generator().manual_seed(seed)
    groups: dict[int, list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault(ex.length, []).append(i)
    out = list(examples)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        shift = int(torch.randint(1, len(idx), (1,), generator=gen))
        perm = torch.randperm(len(idx), generator=gen).tolist()
        order = [idx[p] for p in perm]
        for a, b in zip(order, order[shift:] + order[:shift]):   # a cyclic shift of a random order: no fixed point
            out[a] = Example(examples[a].features, examples[b].target, examples[a].prompt, examples[a].start)
    return out


# The evidence head's unit rows of each decoder embedding table (about 113 MB for SmolLM2's): a run builds up
# to three inverters on one decoder, and they share one copy. Keyed weakly by the table itself (a copy goes
# with its decoder) and checked against the table's version counter, so a table changed in place since is
# normalised afresh.
_UNIT_EMBEDDINGS = WeakTensorKeyDictionary()


def unit_embeddings(weight: torch.Tensor) -> torch.Tensor:
    """The rows of embedding table `weight` scaled to unit norm (float32), computed once per table and
    shared: read it, never write it."""
    version = None if weight.is_inference() else weight._version   # inference tensors have no counter
    hit = _UNIT_EMBEDDINGS.get(weight)
    if hit is not None and version is not None and hit[0] == version:
        return hit[1]
    unit = F.normalize(weight.detach().float(), dim=-1)
    _UNIT_EMBEDDINGS[weight] = (version, unit)
    return unit


class Inverter(nn.Module):
    """Projection + SEP + decoder. `decoder` is a Hugging Face causal LM (shared with the caller in
    projection mode, where it is frozen; pass a private copy for body and full modes). `units`: the
    evidence head's unit embedding rows (`unit_embeddings`) when they come from another copy of the same
    table (build passes its caller's); None: those of `decoder`'s table."""

    def __init__(self, decoder: nn.Module, d_in: int, mode: str, hidden: int | None, layout: str, head: str,
                 evidence_scale: float, units: torch.Tensor | None) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        self.mode, self.layout, self.head = mode, layout, head
        self.decoder = decoder
        d_model = decoder.config.hidden_size
        emb = decoder.get_input_embeddings().weight.detach()
        rms = float(emb.float().pow(2).mean().sqrt())
        hidden = hidden or 2 * d_model
        self.register_buffer("mean", torch.zeros(d_in))
        self.register_buffer("std", torch.ones(d_in))
        self.register_buffer("out_scale", torch.tensor(rms))
        self.linear = nn.Linear(d_in, d_model)
        self.proj = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_model))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.sep = nn.Parameter(torch.randn(d_model))
        self.log_evidence_scale = nn.Parameter(torch.tensor(math.log(evidence_scale)))
        if head == "evidence":
            # Unit rows of the embedding table as it was given (full mode trains the decoder's own copy).
            # Not persistent: never in a state_dict or checkpoint, rebuilt from the decoder on load.
            units = unit_embeddings(emb) if units is None else units
            if units.shape != emb.shape:
                raise ValueError(f"units of shape {tuple(units.shape)} for an embedding table of {tuple(emb.shape)}")
            self.register_buffer("unit_embeddings", units, persistent=False)
        decoder.requires_grad_(mode != "projection")
        if mode == "body":
            # Frozen token embeddings; with tied weights this also freezes the LM head (same tensor).
            decoder.get_input_embeddings().weight.requires_grad_(False)
            out = decoder.get_output_embeddings()
            if out is not None:
                out.weight.requires_grad_(False)
        decoder.eval()   # no dropout: teacher forcing and generation see the same network

    # ---------------------------------------------------------------- pieces
    def param_groups(self, lr: float, decoder_lr: float) -> list[dict]:
        own_head = [self.log_evidence_scale] if self.head == "evidence" else []
        groups = [{"params": list(self.linear.parameters()) + list(self.proj.parameters()) + [self.sep] + own_head,
                   "lr": lr}]
        own = [p for p in self.decoder.parameters() if p.requires_grad]
        return groups + ([{"params": own, "lr": decoder_lr}] if own else [])

    def trainable(self) -> list[nn.Parameter]:
        return [p for g in self.param_groups(1.0, 1.0) for p in g["params"]]

    def fit_scaler(self, examples: Sequence[Example]) -> None:
        """Per-dimension mean and standard deviation of the training exposures (float64 running sums)."""
        total = torch.zeros(self.mean.shape[0], dtype=torch.float64)
        squares = torch.zeros_like(total)
        count = 0
        for ex in examples:
            f = ex.features.double()
            total += f.sum(0)
            squares += (f * f).sum(0)
            count += f.shape[0]
        mean = total / count
        var = (squares / count - mean * mean).clamp_min(0.0) * count / max(1, count - 1)
        self.mean.copy_(mean.float())
        self.std.copy_(var.sqrt().float().clamp_min(1e-6))

    @torch.no_grad()
    def init_least_squares(self, examples: Sequence[Example], max_values: int = 20_000_000, ridge: float = 1e-3) -> float:
        """Set the linear path to the ridge regression of E[t]/scale on the standardised exposure of t (one
        row per position), and the MLP's output layer to zero. Returns the fit's R² on those rows. At most
        max_values / D rows (a seeded sample) enter the fit, which bounds its memory."""
        rows = torch.cat([ex.features for ex in examples])
        ids = torch.as_tensor([t for ex in examples for t in ex.target], dtype=torch.long)
        if rows.shape[0] != ids.shape[0]:
            raise ValueError("least-squares init needs one token per exposure row (a position-wise component)")
        max_rows = max(4 * rows.shape[1], max_values // rows.shape[1])
        if rows.shape[0] > max_rows:
            pick = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(0))[:max_rows]
            rows, ids = rows[pick], ids[pick]
        x = ((rows.float() - self.mean) / self.std).double()
        y = (self.embed(ids).double() / float(self.out_scale))
        xm, ym = x.mean(0), y.mean(0)
        xc, yc = x - xm, y - ym
        gram = xc.T @ xc
        gram += ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
        w = torch.linalg.solve(gram, xc.T @ yc)                     # [D, d]
        self.linear.weight.copy_(w.T.float())
        self.linear.bias.copy_((ym - xm @ w).float())
        self.proj[-1].weight.zero_()
        self.proj[-1].bias.zero_()
        resid = yc - xc @ w
        return float(1.0 - resid.pow(2).sum() / yc.pow(2).sum().clamp_min(1e-12))

    def prefix(self, features: torch.Tensor) -> torch.Tensor:
        z = (features.float() - self.mean) / self.std
        return (self.linear(z) + self.proj(z)) * self.out_scale

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.get_input_embeddings()(ids)

    def evidence(self, hints: torch.Tensor) -> torch.Tensor:
        """The evidence head's logits [..., V] for projected exposures `hints` [..., d] (zero rows: padding)."""
        return self.log_evidence_scale.exp() * (F.normalize(hints.float(), dim=-1) @ self.unit_embeddings.T)

    def _check_evidence(self, batch: Sequence[Example]) -> None:
        if self.head == "evidence" and any(ex.features.shape[0] < ex.length for ex in batch):
            raise ValueError("the evidence head needs one exposure row per target token (a position-wise component)")

    def _inputs(self, batch: Sequence[Example], teacher: bool):
        """Left-padded input embeddings, attention mask and positions. Without `teacher`: what generation
        starts from (prefix: the prefix and SEP; aligned: the first step)."""
        sep = self.sep * self.out_scale
        seqs = []
        for ex in batch:
            if self.layout == "prefix":
                parts = [self.prefix(ex.features), sep[None]]
                if teacher and ex.length > 1:
                    parts.append(self.embed(torch.as_tensor(ex.target[:-1], dtype=torch.long)))
                seqs.append(torch.cat(parts))
            elif teacher:
                prev = [sep[None]]
                if ex.length > 1:
                    prev.append(self.embed(torch.as_tensor(ex.target[:-1], dtype=torch.long)))
                seqs.append(torch.cat(prev) + self.prefix(ex.features[: ex.length]))
            else:
                seqs.append(sep[None] + self.prefix(ex.features[:1]))
        width = max(s.shape[0] for s in seqs)
        x = torch.stack([F.pad(s, (0, 0, width - s.shape[0], 0)) for s in seqs])
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            mask[r, width - s.shape[0]:] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return x, mask, positions

    # ---------------------------------------------------------------- training objective
    def loss(self, batch: Sequence[Example]) -> torch.Tensor:
        """Mean cross-entropy of the teacher-forced prompt tokens."""
        self._check_evidence(batch)
        x, mask, positions = self._inputs(batch, teacher=True)
        keep = max(ex.length for ex in batch)
        logits = self.decoder(inputs_embeds=x, attention_mask=mask, position_ids=positions,
                              logits_to_keep=keep).logits
        if self.head == "evidence":
            hints = torch.stack([F.pad(self.prefix(ex.features[: ex.length]), (0, 0, keep - ex.length, 0))
                                 for ex in batch])
            logits = logits.float() + self.evidence(hints)
        labels = torch.full((len(batch), keep), -100, dtype=torch.long)
        for r, ex in enumerate(batch):
            labels[r, keep - ex.length:] = torch.as_tensor(ex.target, dtype=torch.long)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100)

    @torch.no_grad()
    def mean_loss(self, examples: Sequence[Example], batch_size: int) -> float:
        total, count = 0.0, 0
        for s in range(0, len(examples), batch_size):
            batch = examples[s:s + batch_size]
            n = sum(ex.length for ex in batch)
            total += float(self.loss(batch)) * n
            count += n
        return total / max(1, count)

    # ---------------------------------------------------------------- inference
    @torch.no_grad()
    def generate(self, examples: Sequence[Example], batch_size: int = 32) -> list[list[int]]:
        """Greedy decoding of `example.length` tokens for every example (target contents unused)."""
        return [ranked[:, 0].tolist() for ranked in self.generate_ranked(examples, batch_size, 1)]

    @torch.no_grad()
    def generate_ranked(self, examples: Sequence[Example], batch_size: int = 32, k: int = 1) -> list[torch.Tensor]:
        """Greedy decoding as `generate`, keeping at each step the k highest-scoring tokens: per example a
        (length, k) tensor whose first column is the greedy token (the one decoding continues from)."""
        from transformers import DynamicCache

        out: list[torch.Tensor | None] = [None] * len(examples)
        order = sorted(range(len(examples)), key=lambda i: -examples[i].length)
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            batch = [examples[i] for i in idx]
            self._check_evidence(batch)
            x, mask, positions = self._inputs(batch, teacher=False)
            cache = DynamicCache(config=self.decoder.config)
            logits = self.decoder(inputs_embeds=x, attention_mask=mask, position_ids=positions, cache=cache,
                                  use_cache=True, logits_to_keep=1).logits
            hints = None
            if self.layout == "aligned" or self.head == "evidence":
                width = max(ex.length for ex in batch)
                hints = torch.stack([F.pad(self.prefix(ex.features[: ex.length]), (0, 0, 0, width - ex.length))
                                     for ex in batch])
            if self.head == "evidence":
                logits = logits[:, -1:].float() + self.evidence(hints[:, :1])
            nxt = logits[:, -1].argmax(-1)
            steps = [_ranked(logits[:, -1], nxt, k)]
            for j in range(1, max(ex.length for ex in batch)):
                mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=mask.dtype)], dim=1)
                positions = positions[:, -1:] + 1
                step_in = self.embed(nxt[:, None])
                if self.layout == "aligned":
                    step_in = step_in + hints[:, j:j + 1]
                logits = self.decoder(inputs_embeds=step_in, attention_mask=mask,
                                      position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1).logits
                if self.head == "evidence":
                    logits = logits[:, -1:].float() + self.evidence(hints[:, j:j + 1])
                nxt = logits[:, -1].argmax(-1)
                steps.append(_ranked(logits[:, -1], nxt, k))
            ids = torch.stack(steps, dim=1)                                    # (batch, steps, k)
            for row, i in enumerate(idx):
                out[i] = ids[row, :examples[i].length]
        return out  # type: ignore[return-value]

    def reconstruct(self, examples: Sequence[Example], n_prompts: int, batch_size: int = 32) -> list[list[int]]:
        """Per-prompt reconstructions: the windows' generations joined in position order."""
        pieces = self.generate(examples, batch_size)
        joined: list[list[tuple[int, list[int]]]] = [[] for _ in range(n_prompts)]
        for ex, ids in zip(examples, pieces):
            joined[ex.prompt].append((ex.start, ids))
        return [[t for _, ids in sorted(parts, key=lambda p: p[0]) for t in ids] for parts in joined]

    # ---------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        state = {"linear": self.linear.state_dict(), "proj": self.proj.state_dict(), "sep": self.sep.detach().clone(), "mean": self.mean.clone(),
                 "std": self.std.clone(), "out_scale": self.out_scale.clone(), "mode": self.mode,
                 "layout": self.layout, "head": self.head,
                 "log_evidence_scale": self.log_evidence_scale.detach().clone()}
        if self.mode != "projection":
            # Only what training changes (body mode leaves the embeddings as they were).
            state["decoder"] = {k: v.detach().clone() for k, v in self.decoder.named_parameters() if v.requires_grad}
        return state

    def load_state(self, state: dict) -> None:
        theirs = (state["mode"], state.get("layout", "prefix"), state.get("head", "lm"))
        if theirs != (self.mode, self.layout, self.head):
            raise ValueError(f"checkpoint is for {'/'.join(theirs)}, this inverter is "
                             f"{self.mode}/{self.layout}/{self.head}")
        self.linear.load_state_dict(state["linear"])
        self.proj.load_state_dict(state["proj"])
        with torch.no_grad():
            self.sep.copy_(state["sep"])
            self.mean.copy_(state["mean"])
            self.std.copy_(state["std"])
            self.out_scale.copy_(state["out_scale"])
            if "log_evidence_scale" in state:
                self.log_evidence_scale.copy_(state["log_evidence_scale"])
        if self.mode != "projection":
            result = self.decoder.load_state_dict(state["decoder"], strict=False)
            if result.unexpected_keys:
                raise ValueError(f"checkpoint holds decoder weights this decoder lacks: {result.unexpected_keys[:3]}")


def _ranked(logits: torch.Tensor, greedy: torch.Tensor, k: int) -> torch.Tensor:
    """(batch, k): the greedy token, then the next best k − 1 (a tie with it may repeat it)."""
    if k == 1:
        return greedy[:, None]
    top = logits.float().topk(k, dim=-1).indices
    top[:, 0] = greedy
    return top


def build(decoder: nn.Module, d_in: int, settings: TrainSettings) -> Inverter:
    """An Inverter for `settings.mode`; body and full modes train a private deep copy of `decoder`. The
    evidence head's unit embeddings are those of `decoder` (the copy's are equal at this point), so every
    inverter built on one decoder shares them."""
    units = unit_embeddings(decoder.get_input_embeddings().weight) if settings.head == "evidence" else None
    if settings.mode != "projection":
        decoder = copy.deepcopy(decoder)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        return Inverter(decoder, d_in, settings.mode, settings.projection_hidden, settings.layout, settings.head,
                        settings.evidence_scale, units)


@dataclass
class TrainLog:
    steps: int
    seconds: float
    stopped_by: str                   # "max_steps" | "max_minutes"
    train_loss: float                 # mean of the last (up to) 20 steps
    best_val_loss: float
    best_step: int
    val_history: list[tuple[int, float]] = field(default_factory=list)
    n_train_examples: int = 0
    n_val_examples: int = 0
    init_r2: float | None = None      # R² of the least-squares start of the projection (position-wise only)
    # The training loss (mean of the last up to 20 steps) at each validation step: the W&B step history's
    # curve beside val_history, kept out of record() (results.json carries the run's summary, not its curves).
    train_history: list[tuple[int, float]] = field(default_factory=list)

    def record(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "train_history"}


def train(inv: Inverter, train_examples: Sequence[Example], val_examples: Sequence[Example],
          settings: TrainSettings, progress=None) -> TrainLog:
    """Adam with a linear warm-up; validation loss every `eval_every` steps and at the end; the parameters
    with the best validation loss are restored. `progress(step, train_loss, val_loss)` is called after each
    validation."""
    settings.validate()
    if not train_examples or not val_examples:
        raise ValueError("training needs at least one training and one validation example")
    inv.fit_scaler(train_examples)
    r2 = None
    if all(ex.features.shape[0] == ex.length for ex in train_examples[:64]):
        r2 = inv.init_least_squares(train_examples)
    params = inv.trainable()
    opt = torch.optim.AdamW(inv.param_groups(settings.lr, settings.decoder_lr), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / settings.warmup_steps))
    gen = torch.Generator().manual_seed(settings.seed)
    val = list(val_examples[: settings.val_windows])
    best = (math.inf, 0, None)
    history: list[tuple[int, float]] = []
    train_history: list[tuple[int, float]] = []
    recent: list[float] = []
    start = time.perf_counter()
    budget = settings.max_minutes * 60.0
    stopped_by, step = "max_steps", 0
    bar = progress_bar(desc=f"train inverter ({inv.mode})", total=settings.max_steps, unit="step")
    for step in range(1, settings.max_steps + 1):
        inv.train(False)
        idx = torch.randint(len(train_examples), (settings.batch_size,), generator=gen).tolist()
        loss = inv.loss([train_examples[i] for i in idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        recent = (recent + [float(loss.detach())])[-20:]
        bar.update(1)
        out_of_time = time.perf_counter() - start >= budget
        if step % settings.eval_every == 0 or step == settings.max_steps or out_of_time:
            v = inv.mean_loss(val, settings.batch_size)
            history.append((step, v))
            tl = sum(recent) / len(recent)
            train_history.append((step, tl))
            if v < best[0]:
                best = (v, step, inv.state())
            bar.set_postfix(train_loss=f"{tl:.3f}", val_loss=f"{v:.3f}", refresh=False)
            if progress is not None:
                progress(step, tl, v)
        if out_of_time:
            stopped_by = "max_minutes"
            break
    bar.close()
    if best[2] is not None:
        inv.load_state(best[2])
    return TrainLog(steps=step, seconds=time.perf_counter() - start, stopped_by=stopped_by,
                    train_loss=sum(recent) / max(1, len(recent)), best_val_loss=best[0], best_step=best[1],
                    val_history=history, n_train_examples=len(train_examples), n_val_examples=len(val_examples),
                    init_r2=r2, train_history=train_history)

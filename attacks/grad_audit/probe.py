"""The frequent-token probe on the real rows (paper 004): does what the cloud sees name the tokens?

Rows: every position of every real row but the last (the last has no next token), in frames split by
parity: the probe trains on the even frames and is scored on the odd ones, which never share a block of
text (harness/grad_audit/data.py). Features, by arm: `forward` the payload vector the cloud received at that
position (D), `gradient` the returned gradient there (d), `joint` both. The label is the token at the
position (`current`) or the one after it (`next`, what the loss predicts there).

The probe is a multinomial logistic regression (L2 `l2`, L-BFGS, standardised features) over the top_k
most frequent tokens of its training rows plus one class for every other token; it predicts the most
likely of the top_k tokens. Its reference is the constant guess of the most frequent training token. On
the scored rows, per row: c_probe, c_const ∈ {0, 1} (right or not); the paired effect is mean(c_probe −
c_const) in pp with variance var(c_probe − c_const)/n. The privacy gate's statistic is the
Bonferroni–Wilson upper bound of the probe's accuracy (level 1 − α/m over m scored cells) minus the
constant guess's accuracy, in pp.

Controls: the negative control trains on shuffled labels (a seeded permutation of the training rows'
tokens) and is scored on the true ones: its paired effect's 95% upper bound must stay within the margin of
0. The positive control injects a leak at a known dose: a share `dose` of the rows (train and test) gets
a fixed random code of its token (for top_k tokens) added to its standardised features; the probe must
find it (paired effect lower bound ≥ positive_margin_pp; `expected_pp` is what a perfect reader gains).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.adversary_view import AdversaryView
from harness.grad_audit.trainer import FORWARD_PAYLOAD, RETURNED_GRADIENT, FrameTruth
from metrics.equivalence import earned_half_width
from metrics.proportions import wilson

Z95 = 1.959963984540054


def arm_tensors(view: AdversaryView, arm: str) -> list[torch.Tensor]:
    """Per frame, the (rows, T, f) features of one arm, read from the view only."""
    fwd = [e.tensor for e in view.select(channel=FORWARD_PAYLOAD)]
    grad = [e.tensor for e in view.select(channel=RETURNED_GRADIENT)]
    if arm == "forward":
        return fwd
    if arm == "gradient":
        return grad
    return [torch.cat([f, g], dim=-1) for f, g in zip(fwd, grad, strict=True)]


def probe_rows(features: list[torch.Tensor], truth: FrameTruth, parity: int, target: str
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(X, y) of the real rows of the frames of one parity: positions 0..T-2 (module docstring)."""
    xs, ys = [], []
    for x, real, tokens, p in zip(features, truth.is_real, truth.tokens, truth.parity, strict=True):
        if p != parity:
            continue
        xs.append(x[real][:, :-1].reshape(-1, x.shape[-1]))
        t = tokens[real]
        ys.append((t[:, :-1] if target == "current" else t[:, 1:]).reshape(-1))
    return torch.cat(xs).double(), torch.cat(ys)


@dataclass
class CellScore:
    """One probe scored on one seed's test rows."""

    n: int
    probe_correct: int
    const_correct: int
    effect_pp: float
    variance_pp2: float       # sampling variance of effect_pp
    discordant: int = 0       # rows where the probe and the constant guess disagree (one right, one wrong)

    @property
    def ci_pp(self) -> tuple[float, float]:
        half = Z95 * math.sqrt(self.variance_pp2)
        return self.effect_pp - half, self.effect_pp + half

    @property
    def earned_ci_pp(self) -> tuple[float, float]:
        """The interval the rows earned (metrics/equivalence.py, issue 51), what an at_chance reads: a probe that
        predicts the constant guess on every row has ci_pp [0, 0], but n rows bound the effect by ±100·CP_U(0, n)
        only. Each row's difference lies in {−100, 0, 100} pp."""
        return earned_pp(self.n, self.discordant, self.effect_pp, self.variance_pp2, *self.ci_pp)

    def upper_bound_pp(self, alpha: float, m: int) -> float:
        """Bonferroni–Wilson upper bound of the probe's accuracy minus the constant guess's, in pp."""
        return 100 * (wilson(self.probe_correct, self.n, alpha, m)[1] - self.const_correct / self.n)

    def lower_bound_pp(self, alpha: float, m: int) -> float:
        return 100 * (wilson(self.probe_correct, self.n, alpha, m)[0] - self.const_correct / self.n)


def score(probe_right: torch.Tensor, const_right: torch.Tensor) -> CellScore:
    d = probe_right.double() - const_right.double()
    n = int(d.numel())
    var = float(d.var(unbiased=True)) / n if n > 1 else 0.0
    return CellScore(n, int(probe_right.sum()), int(const_right.sum()), 100 * float(d.mean()), 1e4 * var,
                     int(d.count_nonzero()))


def earned_pp(n: int, discordant: int, effect_pp: float, variance_pp2: float, lo: float, hi: float,
              per_item_bound_pp: float = 100.0) -> tuple[float, float]:
    """[lo, hi] widened to effect ± the earned half-width of n rows of which `discordant` differ by ±100 pp and
    whose mean has sampling variance `variance_pp2` (metrics.equivalence.earned_half_width, Wald), at
    per-row bound B = `per_item_bound_pp` (grad_audit.gates; 100 pp, the most a row's hit can differ)."""
    sd = math.sqrt(variance_pp2 * n)
    b = per_item_bound_pp
    half = earned_half_width(n, discordant, effect_pp, sd, 1e4 * discordant, b, critical=Z95)
    return max(-b, min(lo, effect_pp - half)), min(b, max(hi, effect_pp + half))


class FrequentTokenProbe:
    def __init__(self, top_k: int, l2: float, max_iter: int) -> None:
        self.top_k, self.l2, self.max_iter = top_k, float(l2), max_iter

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> FrequentTokenProbe:
        values, counts = torch.unique(y, return_counts=True)
        order = torch.argsort(counts, descending=True, stable=True)
        self.classes = values[order][:self.top_k]
        self.mean, self.std = x.mean(0), x.std(0).clamp_min(1e-30)
        # Features that never vary (e.g. a gradient that is zero there) carry nothing: keep them at 0.
        self.std[x.std(0) == 0] = 1.0
        xs = self._standard(x)
        target = self._class_of(y)
        k = len(self.classes) + 1
        self.w = torch.zeros(xs.shape[1], k, dtype=torch.float64, requires_grad=True)
        self.b = torch.zeros(k, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([self.w, self.b], max_iter=self.max_iter, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(xs @ self.w + self.b, target) + self.l2 * (self.w ** 2).sum()
            loss.backward()
            return loss

        opt.step(closure)
        return self

    def _standard(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def _class_of(self, y: torch.Tensor) -> torch.Tensor:
        target = torch.full_like(y, len(self.classes))
        for i, c in enumerate(self.classes.tolist()):
            target[y == c] = i
        return target

    @torch.no_grad()
    def true_class_log_prob(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per row, log P(the class of its token y | x) under the probe (every other token: the last class)."""
        logp = torch.log_softmax(self._standard(x) @ self.w + self.b, dim=1)
        return logp.gather(1, self._class_of(y)[:, None])[:, 0]

    @torch.no_grad()
    def predict(self, x: torch.Tensor, standardised: bool = False) -> torch.Tensor:
        xs = x if standardised else self._standard(x)
        logits = (xs @ self.w + self.b)[:, :len(self.classes)]
        return self.classes[logits.argmax(dim=1)]


def _subsample(x: torch.Tensor, y: torch.Tensor, max_rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[0] <= max_rows:
        return x, y
    idx = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:max_rows]
    return x[idx], y[idx]


def fit_probe(train: tuple[torch.Tensor, torch.Tensor], *, top_k: int, l2: float, max_iter: int, max_rows: int,
              seed: int, shuffle_labels: bool = False) -> FrequentTokenProbe:
    """The probe fitted on `train` (labels shuffled for the negative control)."""
    x, y = _subsample(*train, max_rows, seed)
    if shuffle_labels:
        y = y[torch.randperm(y.numel(), generator=torch.Generator().manual_seed(seed + 1))]
    return FrequentTokenProbe(top_k, l2, max_iter).fit(x, y)


def score_probe(probe: FrequentTokenProbe, test: tuple[torch.Tensor, torch.Tensor]) -> CellScore:
    """A fitted probe on `test` against the constant guess of its most frequent training token."""
    return score(probe.predict(test[0]) == test[1], test[1] == probe.classes[0])


def run_probe(train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor], *, top_k: int,
              l2: float, max_iter: int, max_rows: int, seed: int, shuffle_labels: bool = False) -> CellScore:
    """Fit on `train` (labels shuffled for the negative control), score on `test` against the constant guess."""
    return score_probe(fit_probe(train, top_k=top_k, l2=l2, max_iter=max_iter, max_rows=max_rows, seed=seed,
                                 shuffle_labels=shuffle_labels), test)


def row_scores(probe: FrequentTokenProbe, test: tuple[torch.Tensor, torch.Tensor], seed: int
               ) -> tuple[list[float], list[float]]:
    """The probe as a membership-style test (metrics/roc.py): per scored row, the log-probability it gives the
    row's own token from the row's own features (positives), and from another row's features, the rows permuted
    against their labels as `floor_arm` does (negatives: features that carry nothing about that label)."""
    null = floor_arm(test, seed)
    return probe.true_class_log_prob(*test).tolist(), probe.true_class_log_prob(*null).tolist()


def inject(x: torch.Tensor, y: torch.Tensor, classes: torch.Tensor, dose: float, *, code_seed: int, pick_seed: int,
           strength: float = 3.0) -> torch.Tensor:
    """The positive control's features: a share `dose` of rows (drawn with `pick_seed`) whose token is one
    of `classes` gets that token's fixed random code (drawn with `code_seed`: N(0, strength²) per feature,
    in units of the feature's spread) added."""
    std = x.std(0)
    std[std == 0] = 1.0
    codes = strength * torch.randn(len(classes), x.shape[1], generator=torch.Generator().manual_seed(code_seed),
                                   dtype=torch.float64)
    picked = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(pick_seed)) < dose
    out = x.clone()
    for i, c in enumerate(classes.tolist()):
        rows = picked & (y == c)
        out[rows] += codes[i] * std
    return out


def positive_control(train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor], *,
                     top_k: int, l2: float, max_iter: int, max_rows: int, seed: int, dose: float
                     ) -> tuple[CellScore, float]:
    """The probe on features carrying an injected leak at `dose`; also the gain (pp) a perfect reader of the
    injected code would make over the constant guess on the test rows."""
    values, counts = torch.unique(train[1], return_counts=True)
    classes = values[torch.argsort(counts, descending=True, stable=True)][:top_k]
    xtr = inject(train[0], train[1], classes, dose, code_seed=seed, pick_seed=seed + 1)
    xte = inject(test[0], test[1], classes, dose, code_seed=seed, pick_seed=seed + 2)
    cell = run_probe((xtr, train[1]), (xte, test[1]), top_k=top_k, l2=l2, max_iter=max_iter, max_rows=max_rows,
                     seed=seed)
    in_top = torch.isin(test[1], classes).double().mean()
    top1 = (test[1] == classes[0]).double().mean()
    return cell, float(100 * dose * (in_top - top1))


def floor_arm(split: tuple[torch.Tensor, torch.Tensor], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An arm at the floor: the feature rows permuted against their labels (each row's features belong to
    another row), so the features carry nothing about the label and the probe reads its own bias."""
    x, y = split
    return x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))], y


def dosed_control(train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor], *,
                  top_k: int, l2: float, max_iter: int, max_rows: int, seed: int, dose_pp: float,
                  strength: float = 3.0) -> tuple[CellScore, float]:
    """The positive control at a known dose (issue 31): an arm at the floor (`floor_arm`) with the token code
    of `inject` added to the share of rows that gives a perfect reader of the code `dose_pp` points over the
    constant guess on the test rows (share = dose / (P(label in top_k) − P(label = top-1)), at most 1), the
    code `strength` feature spreads long.
    Returns the probe's cell and the dose a perfect reader would get (below `dose_pp` where the share caps)."""
    tr, te = floor_arm(train, seed + 3), floor_arm(test, seed + 4)
    values, counts = torch.unique(tr[1], return_counts=True)
    classes = values[torch.argsort(counts, descending=True, stable=True)][:top_k]
    gain = float(torch.isin(te[1], classes).double().mean() - (te[1] == classes[0]).double().mean())
    share = min(1.0, dose_pp / (100 * gain)) if gain > 0 else 1.0
    xtr = inject(tr[0], tr[1], classes, share, code_seed=seed, pick_seed=seed + 1, strength=strength)
    xte = inject(te[0], te[1], classes, share, code_seed=seed, pick_seed=seed + 2, strength=strength)
    cell = run_probe((xtr, tr[1]), (xte, te[1]), top_k=top_k, l2=l2, max_iter=max_iter, max_rows=max_rows, seed=seed)
    return cell, 100 * share * gain

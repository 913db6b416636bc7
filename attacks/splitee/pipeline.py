"""The attack pipeline with its cache: captures, trained inverters, reconstructions, Bayes evaluations.

Every expensive artefact is stored under `<paths.cache_dir>/attacks/<kind>/<key>` and reused, keyed by
everything that changes it (harness.results.cache_key): the victim model (name, source, config), the
decoder, the prompts' token ids, the capture settings (configuration, ε, seed, component, layer, offload,
σ scale, sensitivity rule), the corpus and its split, the training settings, whether the pairs were
shuffled, and the code version (a digest of harness/, metrics/ and attacks/). A sweep over settings and
ε therefore trains each attacker once: the noise-free attacker serves the noise-free rows, the
noise-oblivious rows and every positive control; the shuffled attacker every negative control. Builds are
serialised by a lock per key, so parallel jobs of a sweep wait for one another instead of training twice.

Mask streams. The engine's noise bank is seeded by (seed, op, layer), so two captures with one seed would
reuse the same masks. Each role gets its own seed: evaluation `seed`, training corpus `seed + 1000003`,
validation `seed + 2000006`, repeated submissions `seed + 3000009`. A mask replicate (`mask_seed`, the
runner's `mask_seeds`) moves only the evaluation and repeated-submission streams: the victim's prompts are
masked afresh while the attackers, trained on the corpus, stay the same (and are trained once).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from attacks.inversion import Inverter, TrainSettings, build, make_examples, shuffle_pairs, train
from attacks.splitee import bayes
from attacks.splitee.capture import Capture, CaptureSpec, capture, sigma_qkv0
from harness import configurations
from harness.results import atomic_torch_save, atomic_write_json, cache_key, read_json

SEED_OFFSETS = {"eval": 0, "train": 1_000_003, "val": 2_000_006, "repeat": 3_000_009}


def digest_ids(prompts: Sequence[Sequence[int]]) -> str:
    return hashlib.sha256(json.dumps([list(map(int, p)) for p in prompts]).encode()).hexdigest()


class Store:
    """Files under root/<kind>/<key>.<ext>, built at most once per key (flock while building)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser() / "attacks"

    def path(self, kind: str, key: str, ext: str) -> Path:
        return self.root / kind / f"{key}.{ext}"

    @contextmanager
    def building(self, kind: str, key: str):
        lock = self.root / kind / f"{key}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _fits_half(features: Sequence[torch.Tensor]) -> bool:
    """Whether every exposure value is finite in float16 (|x| ≤ 65,504)."""
    limit = torch.finfo(torch.float16).max
    return all(float(f.abs().max()) <= limit for f in features if f.numel())


@dataclass
class Pipeline:
    """What one attack run shares: models, prompts, corpus, settings, and the cache."""

    victim: Any                        # harness.models.LoadedModel
    decoder: Any                       # the decoder LM (LoadedModel); the victim's by default
    eval_prompts: list[list[int]]
    corpus: Any                        # attacks.corpus.Corpus
    corpus_record: dict
    store: Store
    seed: int
    train_settings: TrainSettings
    offload: tuple[str, ...]
    sigma_scale: float
    sensitivity_rule: str
    slalom_frac_bits: int                # Slalom's fixed point and scaling (engine.slalom_*): they change its residues
    slalom_scaling: str
    capture_batch_size: int
    capture_max_new_tokens: int
    code: str
    log: Callable[[str], None]
    victim_config: dict | None           # the conf/model entries, part of every cache key
    decoder_config: dict | None
    workload: str | None                 # the evaluation prompts' workload, named in the captures' meta
    # Each evaluation prompt's n for EPN's ε = 1/√n (runners/common.py Inputs.epsilon_lengths); None = its
    # length. Corpus passages carry no chat template, so their length is their text.
    eval_epsilon_lengths: list[int] | None
    # The evaluation and repeated-submission masks' seed (a mask replicate); None = `seed`.
    mask_seed: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    cache_events: list[dict] = field(default_factory=list)
    # Each attacker's training curves by its key (`curve`): the W&B step history, not results.json.
    curves: dict[str, dict] = field(default_factory=dict)

    # ---------------------------------------------------------------- identities
    @property
    def pad(self) -> int:
        tok = self.victim.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return int(pad if pad is not None else 0)

    def _model_id(self, loaded: Any, config: dict | None) -> dict:
        return {"name": loaded.name, "source": loaded.source, "config": config}

    def spec(self, configuration: str, epsilon: float | None, component: str, layer: int, role: str) -> CaptureSpec:
        base = self.mask_seed if self.mask_seed is not None and role in ("eval", "repeat") else self.seed
        return CaptureSpec(configuration=configuration,
                           epsilon=configurations.effective_epsilon(configuration, epsilon),
                           seed=base + SEED_OFFSETS[role], component=component, layer=layer,
                           offload=tuple(self.offload), sigma_scale=self.sigma_scale,
                           sensitivity_rule=self.sensitivity_rule, slalom_frac_bits=self.slalom_frac_bits,
                           slalom_scaling=self.slalom_scaling, max_new_tokens=self.capture_max_new_tokens,
                           batch_size=self.capture_batch_size)

    def _key(self, kind: str, **parts: Any) -> str:
        return cache_key({"kind": kind, "victim": self._model_id(self.victim, self.victim_config), "code": self.code,
                          **parts})

    def _timed(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds

    def _meta(self, spec: CaptureSpec, role: str) -> dict:
        """The captured views' meta: the victim, the prompts (the workload, or the corpus split) and the code."""
        prompts = self.workload if role in ("eval", "repeat") else f"{self.corpus_record.get('name', 'corpus')}/{role}"
        return spec.meta(model=self.victim.name, workload=prompts, code_digest=self.code)

    def _captured(self, prompts: list[list[int]], spec: CaptureSpec, role: str) -> Capture:
        start = time.perf_counter()
        cap = capture(self.victim.model, prompts, spec, pad_token_id=self.pad, meta=self._meta(spec, role),
                      epsilon_lengths=self.eval_epsilon_lengths if role == "eval" else None)[0]
        self._timed("capture_s", time.perf_counter() - start)
        return cap

    @staticmethod
    def _save(cap: Capture, path: Path) -> None:
        atomic_torch_save({"features": cap.features, "epsilons": cap.epsilons, "dims": cap.dims, "meta": cap.meta},
                          path)

    @staticmethod
    def _load(spec: CaptureSpec, path: Path) -> Capture:
        data = torch.load(path, weights_only=False)
        return Capture(spec, data["features"], data["epsilons"], data["dims"], data["meta"])

    # ---------------------------------------------------------------- captures
    def eval_capture(self, configuration: str, epsilon: float | None, component: str, layer: int) -> Capture:
        """The evaluation prompts as the device sees them under `configuration` (cached)."""
        spec = self.spec(configuration, epsilon, component, layer, "eval")
        key = self.eval_capture_key(configuration, epsilon, component, layer)
        path = self.store.path("captures", key, "pt")
        with self.store.building("captures", key):
            if path.exists():
                self.cache_events.append({"what": f"eval capture {configuration} {component}", "hit": True})
                return self._load(spec, path)
            cap = self._captured(self.eval_prompts, spec, "eval")
            self._save(cap, path)
            self.cache_events.append({"what": f"eval capture {configuration} {component}", "hit": False})
            return cap

    def _corpus_capture(self, configuration: str, epsilon: float | None, component: str, layer: int,
                        role: str) -> Capture:
        """The corpus as the device sees it. LM-head captures (one row per prompt, but a full forward pass
        each) are cached, so the attacker and its shuffled control capture once; position-wise captures are
        large and cheap (a truncated model), so they are recomputed."""
        prompts = self.corpus.train if role == "train" else self.corpus.val
        spec = self.spec(configuration, epsilon, component, layer, role)
        if component != "lm_head":
            return self._captured(prompts, spec, role)
        key = self._key("corpus_capture", spec=spec.record(), corpus=self.corpus_record, role=role,
                        prompts=digest_ids(prompts))
        path = self.store.path("captures", key, "pt")
        with self.store.building("captures", key):
            if path.exists():
                return self._load(spec, path)
            cap = self._captured(prompts, spec, role)
            self._save(cap, path)
            return cap

    # ---------------------------------------------------------------- learned attacker
    def settings_for(self, component: str) -> TrainSettings:
        """The LM head exposes one row per prompt: it is always read as a prefix, by the LM head alone."""
        if component == "lm_head":
            return replace(self.train_settings, layout="prefix", head="lm")
        return self.train_settings

    def inverter_key(self, configuration: str, epsilon: float | None, component: str, layer: int,
                     shuffled: bool = False) -> str:
        """The cache key of an inverter: the victim, the decoder, the training captures' spec, the corpus,
        every training setting but the generation batch size (which changes no output), whether the pairs
        were shuffled, and the code."""
        settings = self.settings_for(component)
        train_spec = self.spec(configuration, epsilon, component, layer, "train")
        return self._key("inverter", decoder=self._model_id(self.decoder, self.decoder_config),
                         train_spec=train_spec.record(), corpus=self.corpus_record,
                         settings={k: v for k, v in asdict(settings).items() if k != "gen_batch_size"},
                         shuffled=shuffled)

    def eval_capture_key(self, configuration: str, epsilon: float | None, component: str, layer: int) -> str:
        spec = self.spec(configuration, epsilon, component, layer, "eval")
        return self._key("capture", spec=spec.record(), prompts=digest_ids(self.eval_prompts),
                         epsilon_lengths=self.eval_epsilon_lengths)

    def attacker(self, configuration: str, epsilon: float | None, component: str, layer: int,
                 shuffled: bool = False) -> tuple[Inverter, dict]:
        """An inverter trained on corpus captures under `configuration` (t3 for noise-free), loaded from the
        cache when it exists. Returns it and a record (key, cache hit, training log)."""
        settings = self.settings_for(component)
        key = self.inverter_key(configuration, epsilon, component, layer, shuffled)
        path = self.store.path("inverters", key, "pt")
        label = f"{'shuffled ' if shuffled else ''}{component} attacker trained under {configuration}" + (
            f" ε={epsilon:g}" if configurations.get(configuration).uses_epsilon else "")
        with self.store.building("inverters", key):
            if path.exists():
                data = torch.load(path, weights_only=False)
                inv = build(self.decoder.model, int(data["meta"]["d_in"]), settings)
                inv.load_state(data["state"])
                self.cache_events.append({"what": label, "hit": True})
                self.log(f"{label}: loaded from the cache")
                self._curve(key, label, True, data["meta"]["training"], data.get("train_history"))
                return inv, {"key": key, "cache_hit": True, "path": str(path), **data["meta"]}
            per_position = component != "lm_head"
            tr = self._corpus_capture(configuration, epsilon, component, layer, "train")
            va = self._corpus_capture(configuration, epsilon, component, layer, "val")
            half = max(1, settings.window // 2)
            # Training features in float16 where they fit (halves memory; the projection standardises them in
            # float32); Slalom's residues mod q reach 10^7, past float16's 65,504, and stay float32.
            dtype = torch.float16 if _fits_half(tr.features + va.features) else torch.float32
            train_ex = make_examples(tr.features, self.corpus.train, per_position, settings.window,
                                     settings.max_target_tokens, phases=(0, half), dtype=dtype)
            val_ex = make_examples(va.features, self.corpus.val, per_position, settings.window,
                                   settings.max_target_tokens, dtype=dtype)
            d_in = int(tr.features[0].shape[1])
            del tr, va      # the examples are all training needs
            if shuffled:
                train_ex = shuffle_pairs(train_ex, self.seed)
                val_ex = shuffle_pairs(val_ex, self.seed + 1)
            inv = build(self.decoder.model, d_in, settings)
            self.log(f"{label}: training ({len(train_ex)} examples, mode {settings.mode}, layout {settings.layout}, "
                     f"≤{settings.max_steps} steps / ≤{settings.max_minutes:g} min)")
            log = train(inv, train_ex, val_ex, settings,
                        progress=lambda s, tl, vl: self.log(f"  step {s}: train loss {tl:.3f}, val loss {vl:.3f}"))
            self._timed("train_s", log.seconds)
            meta = {"d_in": d_in, "training": log.record(), "label": label}
            # The training curve beside the meta (not in it: the meta is the run's results.json record), so a
            # cache hit mirrors the curve the attacker was trained along.
            atomic_torch_save({"state": inv.state(), "meta": meta, "train_history": log.train_history}, path)
            self.cache_events.append({"what": label, "hit": False})
            self._curve(key, label, False, meta["training"], log.train_history)
            return inv, {"key": key, "cache_hit": False, "path": str(path), **meta}

    def _curve(self, key: str, label: str, hit: bool, training: dict, train_history: list | None) -> None:
        """Record attacker `key`'s training curves: (step, loss) pairs of its training and validation loss at
        each validation step. The first record of a key stands: a later call is a cache hit of the same
        training."""
        self.curves.setdefault(key, {"label": label, "cache_hit": hit,
                                     "train_history": [tuple(p) for p in train_history or ()],
                                     "val_history": [tuple(p) for p in training.get("val_history") or ()]})

    def reconstruct(self, inv: Inverter, attacker_key: str, cap: Capture, component: str) -> list[list[int]]:
        """Reconstructions of the evaluation prompts from `cap` (cached per attacker and capture)."""
        settings = self.settings_for(component)
        key = self._key("reconstruction", attacker=attacker_key, capture=cap.spec.record(),
                        prompts=digest_ids(self.eval_prompts), gen_batch_size=settings.gen_batch_size)
        path = self.store.path("reconstructions", key, "json")
        with self.store.building("reconstructions", key):
            if path.exists():
                return read_json(path)["reconstructions"]
            start = time.perf_counter()
            examples = make_examples(cap.features, self.eval_prompts, component != "lm_head", settings.window,
                                     settings.max_target_tokens)
            if component == "lm_head":
                # The attacker knows n (every prefill exposure shape reveals it): emit min(n, cap) tokens.
                for ex, p in zip(examples, self.eval_prompts):
                    ex.target = list(p)[: settings.max_target_tokens]
            recon = inv.reconstruct(examples, len(self.eval_prompts), settings.gen_batch_size)
            self._timed("reconstruct_s", time.perf_counter() - start)
            atomic_write_json(path, {"reconstructions": recon})
            return recon

    # ---------------------------------------------------------------- Bayes attacker
    def bayes(self, configuration: str, epsilon: float | None, ks: Sequence[int], top_k: int, prior: str,
              rows_per_chunk: int, vocab_per_chunk: int) -> dict:
        """ML (or MAP) token recovery from the layer-0 QKV exposures; for noisy configurations also the
        repeated-submission curve: the prompts submitted max(ks) times through one engine (fresh masks),
        the running mean of the first k exposures attacked at every k in `ks`, beside the recovery
        predicted for σ/√k by simulation from the public codebook. Cached."""
        noisy = configurations.get(configuration).gaussian
        ks = sorted(set(int(k) for k in ks)) if noisy else [1]
        # Only QKV offloaded: the layer-0 QKV input is computed before any other op and its masks come from
        # its own bank stream, so the exposures are the same as with every op offloaded, at a third of the cost.
        spec = replace(self.spec(configuration, epsilon, "qkv", 0, "repeat"), offload=("qkv",))
        key = self._key("bayes", spec=spec.record(), prompts=digest_ids(self.eval_prompts),
                        epsilon_lengths=self.eval_epsilon_lengths, ks=ks, top_k=top_k,
                        prior=prior, corpus=self.corpus_record if prior == "corpus" else None)
        path = self.store.path("bayes", key, "json")
        with self.store.building("bayes", key):
            if path.exists():
                self.cache_events.append({"what": f"bayes {configuration}", "hit": True})
                return read_json(path)
            start = time.perf_counter()
            out = self._bayes(configuration, epsilon, ks, top_k, prior, rows_per_chunk, vocab_per_chunk, spec)
            self._timed("bayes_s", time.perf_counter() - start)
            atomic_write_json(path, out)
            self.cache_events.append({"what": f"bayes {configuration}", "hit": False})
            return out

    def _bayes(self, configuration, epsilon, ks, top_k, prior, rows_per_chunk, vocab_per_chunk, spec) -> dict:
        model = self.victim.model
        noisy = configurations.get(configuration).gaussian
        book = bayes.codebook(model)
        lengths = [len(p) for p in self.eval_prompts]
        sigmas = [sigma_qkv0(model, configuration, epsilon, n, self.sigma_scale)
                  for n in (self.eval_epsilon_lengths or lengths)]
        row_sigma = torch.as_tensor([s for s, n in zip(sigmas, lengths) for _ in range(n)], dtype=torch.float32)
        log_prior = None
        if prior == "corpus":
            log_prior = bayes.unigram_log_prior(self.corpus.train, book.shape[0])
        elif prior != "uniform":
            raise ValueError(f"unknown prior {prior!r}")
        kw = dict(rows_per_chunk=rows_per_chunk, vocab_per_chunk=vocab_per_chunk, log_prior=log_prior)
        sums: list[torch.Tensor] | None = None
        curve: list[dict] = []
        first: dict | None = None

        def evaluate(features: list[torch.Tensor], k: int, sigma_rows: torch.Tensor) -> bayes.Recovery:
            return bayes.attack(features, self.eval_prompts, book, top_k, sigma=sigma_rows, **kw)

        def on_repeat(index: int, cap: Capture) -> None:
            nonlocal sums, first
            sums = [f.double().clone() for f in cap.features] if sums is None else [
                s.add_(f.double()) for s, f in zip(sums, cap.features)]
            k = index + 1
            if k == 1:
                # The single-exposure result (top1, topk, guesses) is the attack itself, whether or not
                # k = 1 is also a point of the requested curve.
                first = {"recovery": evaluate(sums, 1, row_sigma), "sigma_mean": float(sum(sigmas) / len(sigmas))}
            if k not in ks:
                return
            mean = [(s / k).float() for s in sums]
            rec = first["recovery"] if k == 1 else evaluate(mean, k, row_sigma / math.sqrt(k))
            t1, tk = rec.estimates()
            point = {"k": k, "top1": t1.mean, "top1_ci_lo": t1.lo, "top1_ci_hi": t1.hi, "topk": tk.mean,
                     "topk_ci_lo": tk.lo, "topk_ci_hi": tk.hi, "top1_pooled": rec.pooled_top1,
                     "n_positions": rec.n_positions}
            if noisy:
                sim = bayes.simulate_exposures(self.eval_prompts, book, [s / math.sqrt(k) for s in sigmas],
                                               seed=spec.seed + 7919 * k)
                pred = evaluate(sim, k, row_sigma / math.sqrt(k))
                p1, _ = pred.estimates()
                point.update({"top1_predicted": p1.mean, "top1_predicted_ci_lo": p1.lo, "top1_predicted_ci_hi": p1.hi,
                              "top1_predicted_pooled": pred.pooled_top1})
            curve.append(point)

        capture(model, self.eval_prompts, spec, pad_token_id=self.pad, repeats=max(ks), on_repeat=on_repeat,
                meta=self._meta(spec, "repeat"), epsilon_lengths=self.eval_epsilon_lengths)
        rec: bayes.Recovery = first["recovery"]
        return {"k_curve": curve, "top1": rec.top1, "topk": rec.topk, "guesses": rec.guesses, "top_k": top_k,
                "sigma_mean": first["sigma_mean"], "prior": prior,
                "chance_top1": bayes.chance_top1(rec.guesses, self.eval_prompts)}

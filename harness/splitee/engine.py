"""The split-inference engine: one Hugging Face causal LM, seven SpliTEE configurations (paper §4–§7.2).

cpu / gpu / tdx run the whole model on one side. t3 / ep1 / epn / slalom keep the model on the TEE (the
CPU) and offload the chosen linear ops through the Boundary to the accelerator, masked by the
configuration's mechanism. Greedy decoding with a KV cache and left-padded batches is written out here,
rather than left to `generate()`, so that prefill and each decode step are timed and labelled.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from harness import configurations
from harness.adversary_view import AdversaryView
from harness.architectures import OFFLOADABLE, architecture_of
from harness.devices import cpu_description, detect_tee_kind, resolve_accelerator, set_tee_threads
from harness.errors import UserError
from harness.progress import progress
from harness.splitee.boundary import Boundary, Stopwatch
from harness.splitee.mechanisms import SLALOM_SCALINGS, make_mechanism, slalom_stats
from harness.splitee.noise_bank import PIECE_ROWS, BankMemory, NoiseBank, row_bytes
from harness.splitee.offload import (
    CATEGORY,
    Installed,
    MemberLinear,
    OffloadedOp,
    TimedLinear,
    all_op_instances,
    op_linears,
)
from harness.splitee.sensitivity import as_dicts, sensitivity_table

CONF_PRIMARY = Path(__file__).resolve().parents[2] / "conf" / "config.yaml"
CONF_SPLITEE = CONF_PRIMARY.parent / "splitee" / "default.yaml"   # SpliTEE's keys, `engine` among them
TIMING_COMPONENTS = ("attention_proj", "ffn_proj", "down_proj", "lm_head", "masking", "crossing", "bank_refill")


def _conf_defaults() -> dict:
    """conf/config.yaml and conf/splitee/default.yaml as written (before any experiment): the one place the
    engine's defaults are written (`seed` in the first, `engine` in the second, both at the top level).
    EngineSettings' defaults are read from them, so the runners (which pass the composed `engine` section
    whole) and the library's other callers (captures, tests, benchmarks: they name only what they change)
    run the same engine."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(OmegaConf.merge(OmegaConf.load(CONF_PRIMARY), OmegaConf.load(CONF_SPLITEE)))
    assert isinstance(node, dict)
    return node


_CONF = _conf_defaults()
_ENGINE = _CONF["engine"]


@dataclass
class EngineSettings:
    """What the engine runs. Every default is conf/'s (splitee/default.yaml's `engine`, config.yaml's `seed`; what each
    key means is written there); `epsilon` None = no ε given (configurations that ignore it)."""

    configuration: str                    # a name in harness/configurations.py
    epsilon: float | None = None          # configurations that use ε (ep1); the registry derives the rest
    offload: tuple[str, ...] = tuple(_ENGINE["offload"])
    allow_cpu_fallback: bool = _ENGINE["allow_cpu_fallback"]   # 'gpu' without CUDA: error unless True
    tee_threads: int | None = _ENGINE["tee_threads"]
    seed: int = _CONF["seed"]
    bank_on_exhaustion: str = _ENGINE["bank_on_exhaustion"]    # refill | error
    bank_capacity: int | None = _ENGINE["bank_capacity"]       # entries per op; None = sized per generate() call
    bank_bytes: int | None = _ENGINE["bank_bytes"]             # materialised entries held, all banks; None = unbounded
    record_view: bool = _ENGINE["record_view"]
    slalom_frac_bits: int = _ENGINE["slalom_frac_bits"]
    slalom_scaling: str = _ENGINE["slalom_scaling"]            # per_token | per_op | fixed (mechanisms.py: wrap-around)
    sigma_scale: float = _ENGINE["sigma_scale"]                # multiplies every σ (0: EP1 computes T3's numbers)
    sensitivity_rule: str = _ENGINE["sensitivity_rule"]        # paper | per_head (harness.splitee.sensitivity)

    def validate(self) -> None:
        # ε needs no check here: the config's validation refuses a bad one (harness/schema.py) and the registry
        # asserts it where the masks' ε is derived (configurations.mask_epsilons)
        configurations.get(self.configuration)  # UserError for an unknown name
        unknown = set(self.offload) - set(OFFLOADABLE)
        if unknown:
            raise UserError(f"unknown offloaded op(s) {sorted(unknown)}; choose from {', '.join(OFFLOADABLE)}")
        if self.bank_capacity is not None and self.bank_capacity < 1:
            raise UserError(f"engine.bank_capacity must be >= 1 or null, got {self.bank_capacity}")
        if self.bank_bytes is not None and (isinstance(self.bank_bytes, bool) or not isinstance(self.bank_bytes, int)
                                            or self.bank_bytes < 1):
            raise UserError(f"engine.bank_bytes must be a positive number of bytes or null, got {self.bank_bytes!r}")
        if self.slalom_scaling not in SLALOM_SCALINGS:
            raise UserError(f"slalom_scaling must be one of {', '.join(SLALOM_SCALINGS)}, got {self.slalom_scaling!r}")
        if self.sigma_scale < 0:
            raise UserError(f"sigma_scale must be >= 0, got {self.sigma_scale}")


@dataclass
class GenerationResult:
    output_ids: list[list[int]]
    timings: dict[str, float]
    n_generated_tokens: int
    tokens_per_second: float
    boundary: dict = field(default_factory=dict)
    bank: dict = field(default_factory=dict)
    epsilons: list[float | None] = field(default_factory=list)   # the per-token ε each prompt ran under
    slalom: dict | None = None    # slalom: wrap-arounds of this generation per op (SplitEngine.slalom_stats)
    prefill_timings: dict = field(default_factory=dict)   # timings' components during the prefill alone
    at_checkpoints: dict = field(default_factory=dict)    # limit -> its timings, boundary and slalom (generate)

    def at(self, limit: int) -> "GenerationResult":
        """This generation as the `limit`-token generation it began with (a checkpoint of generate())."""
        if limit not in self.at_checkpoints:
            raise KeyError(f"no checkpoint at {limit} tokens (checkpoints: {sorted(self.at_checkpoints)})")
        mark = self.at_checkpoints[limit]
        outputs = [row[:limit] for row in self.output_ids]
        n_tokens = sum(len(o) for o in outputs)
        total = mark["timings"]["total"]
        return GenerationResult(outputs, mark["timings"], n_tokens, n_tokens / total if total > 0 else float("nan"),
                                boundary=mark["boundary"], bank=self.bank, epsilons=self.epsilons,
                                slalom=mark["slalom"], prefill_timings=self.prefill_timings)


@dataclass
class _Batch:
    """One call's left-padded batch on the run device (left_padded), each row's ε length n, and how to undo
    the setup (SplitEngine._setup)."""

    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    lengths: list[int]
    bank_precompute: float            # seconds the banks' supply took (_prepare_banks)
    restore: Callable[[], None]       # takes the offloaded ops out, the model back to the CPU


class _Context:
    """State the offloaded ops read during one forward pass."""

    def __init__(self, boundary: Boundary, clock: Stopwatch) -> None:
        self.boundary, self.clock = boundary, clock
        self._sigma_factor = torch.ones(1)
        self.sigma_version = 0   # bumped with every new factor, so ops can cache their σ per generation
        self.refill_size = 1
        # Optional hook(op, x, outputs) -> outputs, called with every offloaded op's TEE-side input and
        # its unmasked outputs (one per member); None (the default) leaves every configuration as is.
        # The controlled-error study (harness/splitee/numerics/) uses it to set each call's error; the engine knows
        # nothing of the studies built on it.
        self.inject = None
        # Real (non-padding) positions of the current forward, [batch, seq] bool; None = all real.
        self.valid: torch.Tensor | None = None

    @property
    def sigma_factor(self) -> torch.Tensor:
        return self._sigma_factor

    @sigma_factor.setter
    def sigma_factor(self, value: torch.Tensor) -> None:
        self._sigma_factor = value
        self.sigma_version += 1


class SplitEngine:
    def __init__(self, model: nn.Module, settings: EngineSettings) -> None:
        settings.validate()
        dtypes = {p.dtype for p in model.parameters()}
        if dtypes != {torch.float32}:
            # The masks' σ, the Slalom fixed point and the floating-point bound (docs/fp_bound.md) are derived for
            # float32 weights; a bfloat16/float16 model would void them, so the engine refuses rather than guess.
            raise ValueError(f"SplitEngine needs a float32 model (its masking and error bound are float32/float64), "
                             f"got parameters in {sorted(str(d) for d in dtypes)}")
        self.model, self.settings = model, settings
        self.arch = architecture_of(model)
        self.conf = conf = configurations.get(settings.configuration)
        self.split = conf.split
        on_accelerator = conf.runs_on == configurations.ACCELERATOR
        self.tee_kind = detect_tee_kind() if conf.in_tee else "none"
        if conf.runs_on == configurations.HOST_CPU:
            self.accelerator = None
        else:
            self.accelerator = resolve_accelerator(settings.allow_cpu_fallback, strict=on_accelerator)
        if conf.in_tee:
            self.threads = set_tee_threads(settings.tee_threads)
        else:
            self.threads = torch.get_num_threads()
        self.run_device = self.accelerator.device if on_accelerator else torch.device("cpu")
        if on_accelerator and self.accelerator.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False  # fidelity: the paper compares fp32 outputs
        devices = (self.accelerator.device,) if self.accelerator else ()
        self.clock = Stopwatch(devices + (self.run_device,))
        self.boundary = Boundary(self.accelerator.device if self.accelerator else torch.device("cpu"), self.clock,
                                 record=settings.record_view and self.split)
        self.ctx = _Context(self.boundary, self.clock)
        self.offload = tuple(op for op in OFFLOADABLE if op in settings.offload) if self.split else ()
        # The Δ table is written with every run; noise-free configurations get it for the default op set.
        table_ops = tuple(settings.offload) if conf.gaussian else tuple(o for o in settings.offload if o != "down")
        self.table = sensitivity_table(model, table_ops, settings.sensitivity_rule)
        self.ops: list[OffloadedOp] = []
        self.bank_memory = BankMemory()
        self.bank_rows: int | None = None   # capacity_rows of every bank (None: unbounded)
        self.mechanism = make_mechanism(conf.mechanism, settings.slalom_frac_bits, settings.slalom_scaling) if self.split else None
        if self.split:
            self._build_ops()

    # ---------------------------------------------------------------- setup
    def _check_noise_scale(self, factors: Sequence[float]) -> None:
        """Refuse (UserError) a σ = Δ·factor that float32, the masks' and the device products' dtype, cannot
        hold. ε = 1e-300 gives σ ≈ Δ·1e300, inf in float32: every masked input, device product and correction
        turns to inf or NaN, and the run would end as a finished one with garbage answers (exact match 0)."""
        deltas = [op.delta for op in self.ops if op.delta]
        if not deltas or not factors:
            return
        sigma = max(deltas) * max(factors)          # Python floats: float64, so the product itself is exact enough
        limit = float(torch.finfo(torch.float32).max)
        if not sigma <= limit:
            eps, scale = self.settings.epsilon, self.settings.sigma_scale
            knobs = (f"epsilon={eps:g}" if self.conf.uses_epsilon else f"configuration={self.conf.name}") + (
                f" with engine.sigma_scale={scale:g}" if scale != 1 else "")
            hint = (f"; choose epsilon >= {max(deltas) * scale / limit:.3g}" if self.conf.uses_epsilon else "")
            raise UserError(f"{knobs} makes the masks' noise scale sigma = {sigma:.3g}, past float32's largest "
                            f"number ({limit:.3g}): no float32 computation can carry it{hint}")

    def _check_finite(self, finite: bool) -> None:
        """Refuse logits that are not finite. Under Gaussian masks that is float32 overflow: ε = 1e-30 passes
        _check_noise_scale (σ ≈ 1e31), but what the TEE's subtraction leaves of it (σ·2⁻²⁴ ≈ 1e24) overflows
        the next RMSNorm's squares, and the run would end as a finished one with answers of argmax(NaN). A
        smaller σ leaves large but finite rounding errors: the scheme's real floating-point cost, recorded as
        measured (docs/fp_bound.md). Without masks, non-finite logits are a bug and keep their traceback."""
        if finite:
            return
        if self.conf.gaussian and self.settings.sigma_scale > 0:
            knobs = f"epsilon={self.settings.epsilon:g}" if self.conf.uses_epsilon else f"configuration={self.conf.name}"
            raise UserError(f"{knobs}: the masked computation overflowed float32 (its logits are not finite): a noise "
                            "scale this large leaves rounding errors past float32's range; choose a larger epsilon")
        raise FloatingPointError(f"configuration {self.conf.name}: the model's logits are not finite")

    def _build_ops(self) -> None:
        deltas = {(row.op, row.layer): row.delta for row in self.table}
        mechanism = self.mechanism
        for name, layer in all_op_instances(self.model, self.offload):
            linears = [module for _, module in op_linears(self.model, name, layer)]
            op = OffloadedOp(name, layer, linears, deltas.get((name, layer)), self.ctx, mechanism, self.accelerator.device)
            if mechanism.needs_bank():
                op.bank = NoiseBank(op.label, mechanism.chunk_maker(op), self.settings.seed, self.settings.bank_on_exhaustion,
                                    memory=self.bank_memory)
            mechanism.prepare(op, self.model)  # Slalom: op.slalom, its input bits and wrap-around counters
            self.ops.append(op)
        self._size_banks()

    def _size_banks(self) -> None:
        """Share engine.bank_bytes out as the same number of entries per bank: every bank serves the same
        rows per decode step (the batch), so equal rows is the share by use (docs/noise_bank.md)."""
        banked = [op for op in self.ops if op.bank is not None]
        if not banked or self.settings.bank_bytes is None:
            return
        per_row = sum(row_bytes(op.tee_weights) for op in banked)
        self.bank_rows = max(PIECE_ROWS, self.settings.bank_bytes // per_row)
        for op in banked:
            op.bank.capacity_rows = self.bank_rows

    def _install(self) -> Installed:
        installed = Installed(self.model)
        offloaded: set[str] = set()
        for op in self.ops:
            for member, (path, module) in enumerate(op_linears(self.model, op.name, op.layer)):
                installed.swap(path, MemberLinear(op, member, module))
                offloaded.add(path)
        # Everything not offloaded is timed where it runs, so every configuration has the same breakdown.
        for name, layer in all_op_instances(self.model, ("qkv", "o", "gate_up", "down", "lm_head")):
            for path, module in op_linears(self.model, name, layer):
                if path not in offloaded:
                    installed.swap(path, TimedLinear(module, CATEGORY[name], self.clock))
        return installed

    def set_output_hook(self, hook) -> None:
        """Install hook(op, x, outputs) -> outputs on every offloaded op call (None removes it)."""
        self.ctx.inject = hook

    def sensitivity_table(self) -> list[dict]:
        return as_dicts(self.table)

    @property
    def view(self) -> AdversaryView:
        """What the accelerator received (with record_view); its meta is the caller's to fill
        (harness.adversary_view.view_meta): the engine knows neither the model's name nor the workload."""
        return self.boundary.view

    def describe(self) -> dict:
        s = self.settings
        return {
            "configuration": s.configuration,
            "architecture": self.arch.model_type,
            "tee_kind": self.tee_kind,
            "tee_device": cpu_description(),
            "tee_threads": self.threads,
            "accelerator": self.accelerator.description if self.accelerator else None,
            "accelerator_is_cpu_fallback": bool(self.accelerator and self.accelerator.is_fallback),
            "run_device": str(self.run_device),
            "offloaded_ops": list(self.offload),
            "mechanism": self.mechanism.name if self.mechanism else None,
            "sigma_scale": s.sigma_scale,
            "sensitivity_rule": s.sensitivity_rule,
            "slalom_frac_bits": s.slalom_frac_bits if s.configuration == "slalom" else None,
            "slalom_scaling": s.slalom_scaling if s.configuration == "slalom" else None,
            "torch": torch.__version__,
            "settings": asdict(s),
        }

    # ---------------------------------------------------------------- privacy parameters
    def epsilons_for(self, prompt_lengths: list[int]) -> list[float | None]:
        """Per-token ε per prompt (harness/configurations.py mask_epsilons), None where nothing is masked with noise."""
        return configurations.mask_epsilons(self.settings.configuration, self.settings.epsilon, prompt_lengths)

    # ---------------------------------------------------------------- generation
    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, *, pad_token_id: int,
                 eos_token_id: int | None = None, stop_at_eos: bool = False,
                 epsilon_lengths: list[int] | None = None, checkpoints: tuple[int, ...] = (),
                 timer: Callable[[], float] = time.perf_counter) -> GenerationResult:
        """Greedy generation of `max_new_tokens` per prompt. `epsilon_lengths`: each prompt's n for
        configurations whose ε follows the prompt's length (EPN's 1/√n); None = len(prompt), every token
        the model sees (the caller chooses the reading: runners/common.py Inputs.epsilon_lengths).
        `checkpoints`: shorter limits whose timings, bytes and Slalom counts are read as the generation
        passes them (GenerationResult.at): the first k steps are the k-token generation, so one long
        generation times every limit (runners/splitee/timing.py, timing.mode=prefix). `timer`: the clock of the prefill,
        checkpoint and total seconds (wall clock; benchmarks/overhead.py --clock cpu passes time.process_time,
        which a shared machine's other processes do not advance); the components keep the wall clock."""
        if max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if any(not 1 <= int(k) <= max_new_tokens for k in checkpoints):
            raise UserError(f"checkpoints must lie in 1..max_new_tokens={max_new_tokens}, got {list(checkpoints)}")
        marks = {int(k) for k in checkpoints}
        if not prompts or any(len(p) == 0 for p in prompts):
            raise UserError("every prompt must have at least one token")
        limit = getattr(self.model.config, "max_position_embeddings", None)
        longest = max(len(p) for p in prompts)
        if limit is not None and longest + max_new_tokens > limit:
            raise UserError(
                f"prompt of {longest} tokens + {max_new_tokens} new tokens exceeds the model's context of {limit}"
            )
        batch = len(prompts)
        from transformers import DynamicCache

        inputs = self._setup(prompts, pad_token_id, epsilon_lengths,
                             (batch * longest + batch * (max_new_tokens - 1), batch * max_new_tokens))
        ids, mask, positions = inputs.ids, inputs.mask, inputs.positions
        epsilons, bank_precompute = self.epsilons_for(inputs.lengths), inputs.bank_precompute
        device = self.run_device
        self.clock.reset()
        counters_before = self.boundary.counters()
        # Tokens generated over the whole batch, with tqdm's tokens/s and ETA; silent unless stderr is a tty.
        bar = progress(desc=f"{self.settings.configuration}: generate", total=batch * max_new_tokens, unit="token")
        try:
            cache = DynamicCache(config=self.model.config)
            finished = torch.zeros(batch, dtype=torch.bool, device=device)
            generated: list[torch.Tensor] = []
            sync = (lambda: torch.cuda.synchronize()) if device.type == "cuda" else (lambda: None)
            start = timer()
            self.boundary.step = 0
            self.ctx.valid = mask.bool()
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                                use_cache=True, logits_to_keep=1).logits
            next_ids = logits[:, -1].argmax(-1)
            sync()
            prefill_s = timer() - start
            self._check_finite(bool(torch.isfinite(logits[:, -1]).all()))
            finite = torch.ones((), dtype=torch.bool, device=device)   # every decode step's, read once at the end
            prefill_parts = {name: self.clock.totals.get(name, 0.0) for name in TIMING_COMPONENTS}
            passed: dict[int, tuple] = {}
            for step in range(1, max_new_tokens + 1):
                if stop_at_eos and eos_token_id is not None:
                    next_ids = torch.where(finished, torch.full_like(next_ids, pad_token_id), next_ids)
                    finished |= next_ids == eos_token_id
                generated.append(next_ids)
                bar.update(batch)
                if step in marks:
                    sync()
                    passed[step] = (timer() - start, dict(self.clock.totals), self.boundary.counters(),
                                    self.slalom_stats())
                if step == max_new_tokens or (stop_at_eos and bool(finished.all())):
                    break
                self._top_up_banks()
                self.boundary.step = step
                self.ctx.valid = None
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], dim=1)
                positions = positions[:, -1:] + 1
                logits = self.model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=positions,
                                    cache=cache, use_cache=True, logits_to_keep=1).logits
                next_ids = logits[:, -1].argmax(-1)
                finite &= torch.isfinite(logits[:, -1]).all()
            sync()
            total_s = timer() - start
            self._check_finite(bool(finite))
        finally:
            bar.close()
            inputs.restore()

        tokens = torch.stack(generated, dim=1).cpu().tolist()
        outputs = [_trim(row, eos_token_id if stop_at_eos else None) for row in tokens]
        timings = _timings(self.clock.totals, total_s, prefill_s, bank_precompute)
        # The same breakdown for the prefill alone (decode = timings − prefill_timings), with its own `other`.
        prefill_parts["total"] = prefill_s
        prefill_parts["other"] = max(0.0, prefill_s - sum(prefill_parts[c] for c in TIMING_COMPONENTS))
        n_tokens = sum(len(o) for o in outputs)
        counters = self.boundary.counters()
        final = (total_s, dict(self.clock.totals), counters, self.slalom_stats())
        # The last step's checkpoint is the end itself, and so is one the generation never reached (every
        # prompt stopped at EOS before it).
        at_checkpoints = {k: {"timings": _timings(totals, seconds, prefill_s, bank_precompute),
                              "boundary": {c: reached[c] - counters_before[c] for c in reached}, "slalom": slalom}
                          for k, (seconds, totals, reached, slalom)
                          in ((k, final if k == max_new_tokens else passed.get(k, final)) for k in sorted(marks))}
        return GenerationResult(
            output_ids=outputs,
            timings=timings,
            n_generated_tokens=n_tokens,
            tokens_per_second=n_tokens / total_s if total_s > 0 else float("nan"),
            boundary={k: counters[k] - counters_before[k] for k in counters},
            bank=self.bank_stats(),
            epsilons=epsilons,
            slalom=self.slalom_stats(),
            prefill_timings=prefill_parts,
            at_checkpoints=at_checkpoints,
        )

    @torch.inference_mode()
    def log_probs(self, sequences: list[list[int]], *, pad_token_id: int,
                  epsilon_lengths: list[int] | None = None) -> list[torch.Tensor]:
        """Next-token log-probabilities at every position of each sequence, from one forward pass run as the
        prefill of `generate` runs it (the same masks, Slalom arithmetic and boundary): row i's tensor is
        [len_i, vocab] float32 on the CPU, position t scoring token t+1. What a likelihood-scored task reads
        (harness/lm_eval_lm.py, the splitbench lm-eval model); `epsilon_lengths` as in `generate`."""
        if not sequences or any(len(s) == 0 for s in sequences):
            raise UserError("every sequence must have at least one token")
        limit = getattr(self.model.config, "max_position_embeddings", None)
        longest = max(len(s) for s in sequences)
        if limit is not None and longest > limit:
            raise UserError(f"a sequence of {longest} tokens exceeds the model's context of {limit}")
        batch = len(sequences)
        # every position reaches the LM head here
        inputs = self._setup(sequences, pad_token_id, epsilon_lengths, (batch * longest, batch * longest))
        ids, mask, positions = inputs.ids, inputs.mask, inputs.positions
        try:
            self.boundary.step = 0
            self.ctx.valid = mask.bool()
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        finally:
            inputs.restore()
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        rows = [logp[row, longest - len(s):] for row, s in enumerate(sequences)]
        self._check_finite(all(bool(torch.isfinite(r).all()) for r in rows))   # padding's positions aside
        return rows

    def _setup(self, sequences: list[list[int]], pad_token_id: int, epsilon_lengths: list[int] | None,
               bank_rows: tuple[int, int]) -> _Batch:
        """What generate() and log_probs() both do before their first forward pass: set each row's σ factor
        from its ε length n (len(sequence) unless `epsilon_lengths` gives it), promise and make the banks'
        supply (`bank_rows`: rows per layer op, rows of the LM head; _prepare_banks), reset Slalom's counters,
        put the left-padded batch (and the model, off the CPU) on the run device and install the offloaded ops.
        The caller runs its passes and then calls the result's restore(), in a `finally`."""
        batch, longest = len(sequences), max(len(s) for s in sequences)
        lengths = [len(s) for s in sequences] if epsilon_lengths is None else [int(n) for n in epsilon_lengths]
        if len(lengths) != batch or min(lengths) < 1:
            raise ValueError(f"epsilon_lengths must give one n >= 1 per prompt, got {epsilon_lengths}")
        # σ = Δ·factor per prompt row (harness/configurations.py noise_factors).
        factors = configurations.noise_factors(self.settings.configuration, self.settings.epsilon, lengths,
                                               self.settings.sigma_scale)
        self._check_noise_scale(factors)
        self.ctx.sigma_factor = torch.tensor(factors, dtype=torch.float32)
        bank_precompute = self._prepare_banks(*bank_rows)
        self._reset_slalom()
        device = self.run_device
        ids, mask, positions = left_padded(sequences, longest, pad_token_id, device)
        moved = device.type != "cpu"
        if moved:
            self.model.to(device)
        installed = self._install()

        def restore() -> None:
            self.ctx.valid = None
            installed.restore()
            if moved:
                self.model.to("cpu")

        return _Batch(ids, mask, positions, lengths, bank_precompute, restore)

    def _prepare_banks(self, rows_per_layer_op: int, rows_lm_head: int) -> float:
        """Before generation: promise each bank's supply (sized for this call, or once the configured
        capacity) and materialise it ahead, up to the byte bound. Not inference time (the paper's offline
        precompute); what the bound leaves for later is made between steps and counted (_top_up_banks)."""
        seconds = 0.0
        capacity = self.settings.bank_capacity
        self.ctx.refill_size = capacity or 1
        for op in self.ops:
            if op.bank is None:
                continue
            if capacity is None:
                seconds += op.bank.ensure(rows_lm_head if op.name == "lm_head" else rows_per_layer_op)
            elif op.bank.stats.entries_planned == 0:
                seconds += op.bank.fill(capacity)
            else:
                seconds += op.bank.top_up()
        return seconds

    def _top_up_banks(self) -> None:
        """Between two forward passes, refill every bank that is below half its capacity back to it (TEE
        work, timed as bank_refill: on this machine nothing runs beside the TEE to hide it behind)."""
        if self.bank_rows is None:
            return
        with self.clock.time("bank_refill"):
            for op in self.ops:
                if op.bank is not None:
                    op.bank.stats.refill_s += op.bank.top_up(low_water=0.5)

    def slalom_stats(self) -> dict | None:
        """Slalom's wrap-arounds since the current or last generate() began, per op instance, per op type
        and in total, with each op's input bits (harness/splitee/mechanisms.py); None for other mechanisms."""
        if self.mechanism is None or self.mechanism.name != "slalom":
            return None
        m = self.mechanism
        return slalom_stats(self.ops, m.scaling, m.frac_bits, m.modulus)

    def _reset_slalom(self) -> None:
        for op in self.ops:
            if getattr(op, "slalom", None) is not None:
                op.slalom.reset()

    def bank_stats(self) -> dict:
        banks = [op.bank for op in self.ops if op.bank is not None]
        return {
            "capacity_bytes": self.settings.bank_bytes,
            "capacity_rows": self.bank_rows,
            "bytes": sum(b.stats.bytes for b in banks),
            "peak_bytes": self.bank_memory.peak,   # all banks at once, not the sum of their peaks
            "precompute_s": sum(b.stats.precompute_s for b in banks),
            "refill_s": sum(b.stats.refill_s for b in banks),
            "entries_planned": sum(b.stats.entries_planned for b in banks),
            "entries_made": sum(b.stats.entries_made for b in banks),
            "entries_used": sum(b.stats.entries_used for b in banks),
            "refills": sum(b.stats.refills for b in banks),
            "pieces": sum(b.stats.pieces for b in banks),
        }


def left_padded(sequences: list[list[int]], longest: int, pad_token_id: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, attention mask and position ids of a left-padded batch: row r holds sequence r in its last
    len_r positions (the layout attacks/splitee/capture.py reads back), positions counted from each row's first token."""
    ids = torch.full((len(sequences), longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, longest - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[row, longest - len(seq):] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _timings(totals: dict, total_s: float, prefill_s: float, bank_precompute: float) -> dict[str, float]:
    """GenerationResult.timings from the clock's totals and the wall time since the prefill began."""
    timings = {name: totals.get(name, 0.0) for name in TIMING_COMPONENTS}
    timings["prefill"] = prefill_s
    timings["decode"] = total_s - prefill_s
    timings["total"] = total_s
    timings["other"] = max(0.0, total_s - sum(timings[c] for c in TIMING_COMPONENTS))
    timings["bank_precompute"] = bank_precompute
    return timings


def _trim(row: list[int], eos: int | None) -> list[int]:
    if eos is not None and eos in row:
        return row[: row.index(eos) + 1]
    return row

"""The floating-point study: the bound holds, the reference is exact, kernels are what we say, the
controlled-error hook keeps its promises, and both experiments run end to end (docs/fp_bound.md)."""
from __future__ import annotations

import functools
import json
import math
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from harness.models import load_model, model_entry
from harness.splitee.engine import EngineSettings, SplitEngine
from harness.splitee.numerics import bound, kernels, precisions, reference, study, summary
from harness.splitee.numerics.controlled_error import ErrorRescaler, rescale_to_mae
from harness.splitee.numerics.study import member_names
from harness.splitee.sensitivity import down_sensitivity

from ..conftest import compose_config, run_cli_in_process

NARROW = ("fp32", "bf16", "fp16")


@functools.lru_cache(maxsize=None)
def model(name: str):
    return load_model(model_entry(name))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _exact(a: torch.Tensor, b: torch.Tensor) -> Fraction:
    return sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a.double().tolist(), b.double().tolist())),
               Fraction(0))


# ---------------------------------------------------------------------------------------------------
# The exact reference
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(precisions.PRECISIONS))
def test_exact_dot_is_exact_to_its_stated_tolerance_against_fractions(name):
    """Wide exponent ranges and heavy cancellation: |ref − exact| within reference_error_bound; without
    heavy cancellation (odd rows) within one rounding of the exact value ('as if in twice fp64')."""
    prec = precisions.PRECISIONS[name]
    g = _gen(1)
    d = 61
    spread = 1.5 if name == "fp16" else 4.0     # fp16 overflows at 65504
    a = torch.randn(40, d, generator=g, dtype=torch.float64) * torch.exp(spread * torch.randn(40, d, generator=g, dtype=torch.float64))
    b = torch.randn(40, d, generator=g, dtype=torch.float64)
    # Make half of the rows cancel almost completely: the last term undoes the sum of the others.
    a[::2, -1] = -(a[::2, :-1] * b[::2, :-1]).sum(-1) / b[::2, -1]
    a, b = a.to(prec.dtype), b.to(prec.dtype)
    ref = reference.exact_dot(a, b)
    s_abs = (a.double().abs() * b.double().abs()).sum(-1)
    tol = reference.reference_error_bound(ref, s_abs, d)
    for i in range(a.shape[0]):
        exact = _exact(a[i], b[i])
        err = abs(Fraction(ref[i].item()) - exact)
        assert err <= Fraction(tol[i].item()), (i, float(err), tol[i].item())
        if i % 2:
            assert err <= abs(exact) * Fraction(2) ** -52, (i, float(err), float(exact))
        else:
            assert abs(exact) < Fraction(s_abs[i].item()) * Fraction(2) ** -(prec.p - 4)   # precondition: it cancels


@pytest.mark.parametrize("name", NARROW)
def test_reference_of_narrow_operands_agrees_with_fsum(name):
    """fp32/bf16/fp16 products are exact in fp64, so math.fsum of them is the exactly rounded dot product;
    the harness's grid reference (an fp64 GEMM) stays within its tolerance of it, exact_dot within 1 ulp."""
    dt = precisions.PRECISIONS[name].dtype
    g = _gen(2)
    x = (torch.randn(12, 300, generator=g, dtype=torch.float64) * 3).to(dt)
    w = (torch.randn(9, 300, generator=g, dtype=torch.float64) * 0.05).to(dt)
    grid, method = reference.reference_dot_grid(x, w)
    assert method == "fp64"
    s_abs = x.double().abs() @ w.double().abs().T
    tol = reference.reference_error_bound(grid, s_abs, 300, method)
    exact_grid = reference.exact_dot(x[:, None, :], w[None, :, :])
    for i in range(12):
        for j in range(9):
            products = [p * q for p, q in zip(x[i].double().tolist(), w[j].double().tolist())]
            assert all(Fraction(p) == Fraction(float(a)) * Fraction(float(b))
                       for p, a, b in zip(products, x[i].double().tolist(), w[j].double().tolist()))
            f = math.fsum(products)
            assert abs(grid[i, j].item() - f) <= tol[i, j].item()
            assert abs(exact_grid[i, j].item() - f) <= math.ulp(f)


# ---------------------------------------------------------------------------------------------------
# The kernels
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(precisions.PRECISIONS))
def test_sequential_dot_is_recursive_summation_rounded_at_every_step(name):
    """Bit for bit the scalar loop s ← fl(s + fl(wᵢxᵢ)), each step a 0-d tensor operation in the dtype."""
    dt = precisions.PRECISIONS[name].dtype
    g = _gen(3)
    a = torch.randn(6, 200, generator=g).to(dt)
    b = (torch.randn(6, 200, generator=g) * 7).to(dt)
    fast = kernels.sequential_dot(a, b, name)
    for i in range(6):
        acc = a[i, 0] * b[i, 0]
        for k in range(1, 200):
            acc = acc + a[i, k] * b[i, k]
        assert acc.dtype == dt and acc.item() == fast[i].item(), (i, acc.item(), fast[i].item())


def test_bf16_and_fp16_rounding_of_one_step_is_correct_rounding():
    """The double rounding fp32 → bf16/fp16 torch performs is innocuous (24 ≥ 2p + 2): every sum and
    product of random pairs equals the exact value rounded once."""
    g = _gen(4)
    for dt in (torch.bfloat16, torch.float16):
        a = (torch.randn(20000, generator=g, dtype=torch.float64) * torch.exp(2 * torch.randn(20000, generator=g, dtype=torch.float64))).to(dt)
        b = (torch.randn(20000, generator=g, dtype=torch.float64) * torch.exp(2 * torch.randn(20000, generator=g, dtype=torch.float64))).to(dt)
        for op in (torch.add, torch.mul):
            got = op(a, b)
            once = op(a.double(), b.double()).to(dt)   # the fp64 result is exact for these operands
            assert torch.equal(got.view(torch.int16), once.view(torch.int16)), (dt, op)


# ---------------------------------------------------------------------------------------------------
# The bound
# ---------------------------------------------------------------------------------------------------


def test_bound_coefficients():
    for name, prec in precisions.PRECISIONS.items():
        d = 200 if name != "bf16" else 100
        c1, c2 = bound.bound_coefficients(d, name)
        assert c2 == precisions.gamma(d, prec.u)
        assert precisions.gamma(d, prec.u) < c1 <= precisions.gamma(d + 1, prec.u)      # Lemma 2: one factor more
    assert bound.bound_coefficients(256, "bf16") == (math.inf, math.inf)   # d·u = 1: no bound
    assert math.isfinite(bound.bound_coefficients(4096, "bf16", "fp32")[0])
    c1, c2 = bound.bound_coefficients(4096, "bf16", "fp32")
    u = 2.0 ** -8
    assert 2 * u < c1 < 2 * u + 4096 * 2.0 ** -23 and u < c2 < u + 4096 * 2.0 ** -23
    with pytest.raises(ValueError):
        bound.bound_coefficients(10, "fp32", "bf16")


# (precision, d): d·u < 1 in every case, so the bound exists.
BOUND_CASES = [("fp64", 3072), ("fp32", 3072), ("fp32", 8192), ("fp16", 1536), ("bf16", 128)]


@pytest.mark.parametrize("name, d", BOUND_CASES)
@pytest.mark.parametrize("sigma", [0.0, 0.3, 30.0])
def test_bound_holds_for_every_element_of_recursive_summation(name, d, sigma):
    """Theorem 1 on sampled dot products in the bound's own arithmetic: not one violation, from no noise
    (σ = 0) to noise 30× the input (the cancellation regime)."""
    g = _gen(5)
    weight = torch.randn(64, d, generator=g) * 0.05
    inputs = torch.randn(32, d, generator=g) * torch.rand(32, 1, generator=g) * 2
    inst = study.OpInstance("q", 0, weight, inputs, torch.full((32,), sigma, dtype=torch.float64))
    stats = study.run_study([inst], precisions=[name], kernels=["sequential"], trials=600, rows_per_vector=20, seed=1)
    (s,) = stats
    assert s.n == 600 and s.n_overflow == 0
    assert math.isfinite(s.sum_bound)
    assert s.violations == 0, (name, d, sigma, s.max_error_over_bound)
    assert 0 < s.max_error_over_bound <= 1
    assert s.max_reference_slack_over_bound < 1e-3   # the reference's tolerance cannot hide a violation


@pytest.mark.parametrize("name", ["fp64", "fp32", "fp16", "bf16"])
def test_forward_error_bound_elementwise_on_independent_dot_products(name):
    """The public, vectorised bound (w, x, η broadcast, any leading shape) against sequential results."""
    d = {"fp64": 2000, "fp32": 2000, "fp16": 700, "bf16": 100}[name]
    g = _gen(6)
    w = torch.randn(3, 500, d, generator=g) * 0.1
    x = torch.randn(3, 500, d, generator=g)
    eta = torch.randn(3, 500, d, generator=g) * 50
    dt = precisions.PRECISIONS[name].dtype
    w, x, eta = w.to(dt), x.to(dt), eta.to(dt)
    r = (kernels.sequential_dot(w, (x + eta), name) - kernels.sequential_dot(w, eta, name)).double()
    err = (r - reference.exact_dot(w, x)).abs()
    limit = bound.forward_error_bound(w, x, eta, name)
    assert limit.shape == (3, 500)
    assert bool((err <= limit).all()), (err / limit).max().item()


@pytest.mark.parametrize("name", ["fp64", "fp32", "bf16", "fp16"])
def test_library_kernel_violation_rate_is_measured_under_the_model_the_probe_found(name):
    """torch's own F.linear: fp32/fp64 sum in blocks within the working precision (Theorem 1 holds for any
    order); bf16/fp16 accumulate in fp32 and round once on CPU (Corollary 2). The violation rate is
    measured and must be 0 under the model the probe reports; if torch changes, this fails loudly."""
    probe = kernels.probe_accumulation(name)
    if name in ("bf16", "fp16"):
        assert probe["kind"] == "wide-accumulator", probe
        assert kernels.library_accumulation(name, probe) == "fp32"
    d = 1536
    g = _gen(7)
    inst = study.OpInstance("gate", 3, torch.randn(300, d, generator=g) * 0.05, torch.randn(40, d, generator=g),
                         torch.full((40,), 20.0, dtype=torch.float64))
    (s,) = study.run_study([inst], precisions=[name], kernels=["library"], trials=1000, rows_per_vector=25, seed=2,
                        probes={name: probe})
    assert s.n == 1000 and math.isfinite(s.sum_bound)
    assert s.violations == 0, (name, s.max_error_over_bound)


def test_a_kernel_outside_the_model_shows_up_as_violations(monkeypatch):
    """A TF32-like kernel (inputs silently rounded to 11 significant bits) breaks Theorem 1's fp32 model;
    the study must report that as violations, not filter it."""
    def tf32_like(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        def round11(t: torch.Tensor) -> torch.Tensor:
            m, e = torch.frexp(t.double())
            return torch.ldexp(torch.round(m * 2**11) / 2**11, e).to(t.dtype)
        return F.linear(round11(x), round11(w))

    monkeypatch.setattr(kernels, "library_grid", tf32_like)
    g = _gen(8)
    # A short dot product: the proven bound scales with d·2^−24, TF32's input rounding with √d·2^−11.
    inst = study.OpInstance("o", 0, torch.randn(100, 32, generator=g) * 0.05, torch.randn(20, 32, generator=g),
                         torch.full((20,), 10.0, dtype=torch.float64))
    (s,) = study.run_study([inst], precisions=["fp32"], kernels=["library"], trials=400, rows_per_vector=20, seed=3)
    assert s.violations / s.n > 0.5
    row = summary.summarise([s], "fp32", "library", "offloaded")
    assert row.bound_violation_rate == s.violations / s.n and row.max_error_over_bound > 1


def test_bf16_recursive_summation_past_d_u_1_has_no_bound_and_no_violation_count():
    g = _gen(9)
    inst = study.OpInstance("up", 1, torch.randn(50, 576, generator=g) * 0.05, torch.randn(10, 576, generator=g),
                         torch.full((10,), 5.0, dtype=torch.float64))
    (s,) = study.run_study([inst], precisions=["bf16"], kernels=["sequential"], trials=100, rows_per_vector=10, seed=0)
    assert math.isinf(s.sum_bound) and s.violations == 0
    assert summary.summarise([s], "bf16", "sequential", "up").bound_finite is False


def test_error_grows_with_sigma_like_the_bound():
    """The paper's trend: both the error and the bound fall as ε grows (σ = Δ/ε)."""
    g = _gen(10)
    weight, inputs = torch.randn(200, 1024, generator=g) * 0.05, torch.randn(30, 1024, generator=g)
    means = []
    for sigma in (1.0, 10.0, 100.0):
        inst = study.OpInstance("q", 0, weight, inputs, torch.full((30,), sigma, dtype=torch.float64))
        (s,) = study.run_study([inst], precisions=["fp32"], kernels=["library"], trials=1000, rows_per_vector=25, seed=4)
        means.append((s.mean_error, s.mean_bound))
    assert means[0][0] < means[1][0] < means[2][0]
    assert means[0][1] < means[1][1] < means[2][1]
    assert 5 < means[2][0] / means[1][0] < 20      # roughly proportional to σ once σ ≫ |x|


# ---------------------------------------------------------------------------------------------------
# The Down sensitivity (docs/fp_bound.md §6)
# ---------------------------------------------------------------------------------------------------


def test_down_sensitivity_bounds_sampled_and_adversarial_inputs():
    m = model("tiny-llama").model
    rows = down_sensitivity(m)
    assert len(rows) == len(m.model.layers)
    g = _gen(11)
    for row, layer in zip(rows, m.model.layers):
        mlp, norm = layer.mlp, layer.post_attention_layernorm
        assert row.delta <= row.delta_spectral
        hidden = torch.randn(400, m.config.hidden_size, generator=g) * torch.exp(3 * torch.randn(400, 1, generator=g))
        # Adversarial directions: inputs whose normalised form aligns with the gate's and up's top rows.
        for w in (mlp.gate_proj.weight, mlp.up_proj.weight):
            top = w.detach().norm(dim=1).argmax()
            hidden = torch.cat([hidden, w.detach()[top][None] / norm.weight.detach().clamp(min=1e-3)])
        with torch.no_grad():
            z = mlp.act_fn(mlp.gate_proj(norm(hidden))) * mlp.up_proj(norm(hidden))
        norms = z.double().norm(dim=-1)
        assert norms.max().item() <= row.delta / 2
        assert torch.cdist(z.double(), z.double()).max().item() <= row.delta


# ---------------------------------------------------------------------------------------------------
# The controlled-error hook
# ---------------------------------------------------------------------------------------------------


def test_rescale_to_mae_hits_the_target_on_real_rows_and_keeps_the_pattern():
    g = _gen(12)
    e = torch.randn(3, 7, 40, generator=g, dtype=torch.float64) * torch.rand(3, 7, 1, generator=g, dtype=torch.float64)
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[0, :3] = False   # left padding
    for target in (1e-4, 2.06e-4, 1.4e-2, 3e-2):
        out = rescale_to_mae(e, target, valid)
        assert abs(out.abs()[valid].mean().item() / target - 1) < 1e-12
        ratio = out / e
        assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio))   # one scale: the pattern is kept
    assert torch.equal(rescale_to_mae(torch.zeros(2, 5), 1e-3), torch.zeros(2, 5))


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = _gen(seed)
    return [torch.randint(3, 5000, (length - 7 * i,), generator=g).tolist() for i in range(n)]


@pytest.mark.parametrize("target", [1e-4, 1e-3, 1.4e-2, 3e-2])
def test_rescaled_engine_error_hits_the_target_mae_within_one_percent(target):
    """In the engine (left-padded batch, prefill and decode, every op call): the error actually realised
    against T3's output for the same input is the target, overall and per call, within 1%."""
    m = model("tiny-qwen3")
    engine = SplitEngine(m.model, EngineSettings("ep1", epsilon=1.0))
    hook = ErrorRescaler(target)
    engine.set_output_hook(hook)
    engine.generate(_prompts(3, 40), 5, pad_token_id=0)
    measured = hook.summary()
    forwards, layers = 5, len(m.model.model.layers)                  # prefill + 4 decode steps
    assert measured["calls"] == forwards * (6 * layers + 1)          # q, k, v, o, gate, up per layer; LM head
    assert measured["zero_calls"] == 0
    assert abs(measured["realised_mae"] / target - 1) < 0.01
    assert measured["max_per_call_relative_deviation"] < 0.01
    assert set(measured["by_op"]) == {"q", "k", "v", "o", "gate", "up", "lm_head"}


def test_output_hook_is_off_by_default_and_a_measuring_hook_changes_nothing():
    m = model("tiny-llama")
    ps = _prompts(3, 30, seed=1)
    plain = SplitEngine(m.model, EngineSettings("ep1", epsilon=0.5, seed=3))
    assert plain.ctx.inject is None
    base = plain.generate(ps, 8, pad_token_id=0).output_ids
    measured = SplitEngine(m.model, EngineSettings("ep1", epsilon=0.5, seed=3))
    hook = ErrorRescaler(None)
    measured.set_output_hook(hook)
    assert measured.generate(ps, 8, pad_token_id=0).output_ids == base
    assert hook.summary()["natural_mae"] > 0 and hook.summary()["realised_mae"] == hook.summary()["natural_mae"]


def test_a_hook_returning_the_clean_output_turns_ep1_into_t3_token_for_token():
    m = model("tiny-llama")
    ps = _prompts(4, 30, seed=2)
    t3 = SplitEngine(m.model, EngineSettings("t3")).generate(ps, 10, pad_token_id=0).output_ids
    ep1 = SplitEngine(m.model, EngineSettings("ep1", epsilon=1e-4))
    noisy = ep1.generate(ps, 10, pad_token_id=0).output_ids
    assert noisy != t3, "precondition: at ε = 1e-4 the natural error changes the tokens"
    ep1.set_output_hook(lambda op, x, outs: [F.linear(x, w, b) for (w, b) in op.tee_params])
    assert ep1.generate(ps, 10, pad_token_id=0).output_ids == t3


def test_member_names():
    assert member_names("qkv") == ("q", "k", "v") and member_names("gate_up") == ("gate", "up")
    assert member_names("o") == ("o",) and member_names("lm_head") == ("lm_head",)


# ---------------------------------------------------------------------------------------------------
# Config and the command line
# ---------------------------------------------------------------------------------------------------


def test_experiments_compose_and_other_runners_hashes_ignore_the_new_sections(hydra_conf):
    from harness.results import config_hash
    from runners.splitee import fidelity, fp_error, timing

    fp = compose_config(["experiment=fp_error"])
    assert fp.runner == "fp_error" and fp.fp_error.trials == 1000 and fp.workload.n_prompts == 50
    assert list(fp.fp_error.precisions)[0] == "fp32" and list(fp.fp_error.kernels)[0] == "library"
    smoke = compose_config(["experiment=fp_error_smoke"])
    assert smoke.model.name == "tiny-llama" and list(smoke.tags) == ["smoke"] and smoke.configuration.name == "ep1"
    ce = compose_config(["experiment=controlled_error"])
    assert ce.runner == "controlled_error" and ce.configuration.name == "ep1"
    assert list(ce.controlled_error.levels) == [1e-4, 1e-3, 1e-2, 1.4e-2, 1.6e-2, 2e-2, 3e-2]
    assert compose_config(["experiment=controlled_error_smoke"]).tags == ["smoke"]

    def digest(module, overrides):
        return config_hash(module.semantic_config(compose_config(overrides)))

    for module, base in ((fidelity, []), (timing, ["experiment=timing"])):
        assert digest(module, base + ["fp_error.trials=7", "controlled_error.levels=[0.5]"]) == digest(module, base)
    fp_base = ["experiment=fp_error"]
    assert digest(fp_error, fp_base + ["fp_error.trials=7"]) != digest(fp_error, fp_base)
    assert digest(fp_error, fp_base + ["generation.max_new_tokens=3", "semantic_model=x"]) == digest(fp_error, fp_base)
    assert digest(fp_error, fp_base + ["configuration=epn", "epsilon=3"]) == digest(fp_error, fp_base + ["configuration=epn"])


CONTRACT = ("experiment", "configuration", "epsilon", "model", "workload", "n_prompts", "status", "metrics",
            "provenance")


def test_fp_error_smoke_end_to_end_and_report(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    res = run_cli_in_process(["experiment=fp_error_smoke"], out, cache)
    assert res.returncode == 0, res.stderr
    run_dir = out / "fp_error_smoke/tiny-llama/ep1/eps=1/default"
    results = json.loads((run_dir / "results.json").read_text())
    assert all(k in results for k in CONTRACT)
    m = results["metrics"]
    for key in ("mean_true_error", "mean_bound", "bound_violation_rate"):
        assert isinstance(m[key], float), key
    assert 0 < m["mean_true_error"] < m["mean_bound"]
    assert results["n_instances"] == {"offloaded": 2 * 6 + 1, "down": 2}
    for prec in ("fp64", "fp32", "fp16", "bf16"):
        assert m[f"bound_violation_rate_{prec}_sequential"] == 0.0          # the bound's own arithmetic
        assert m[f"down_bound_violation_rate_{prec}_sequential"] == 0.0
    assert m["mean_true_error_fp64_library"] < 1e-6 * m["mean_true_error_fp32_library"]
    assert {f"mean_true_error_{op}" for op in ("q", "k", "v", "o", "gate", "up", "lm_head")} <= set(m)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(len(s["output_ids"]) == 3 for s in samples)
    instances = json.loads((run_dir / "fp_instances.json").read_text())
    assert len(instances) == 13 * 4 * 2 + 2 * 4 * 2

    # The capture is cached: a rerun at another ε captures nothing new and reuses it.
    again = run_cli_in_process(["experiment=fp_error_smoke", "epsilon=10"], out, cache)
    assert again.returncode == 0, again.stderr
    other = json.loads((out / "fp_error_smoke/tiny-llama/ep1/eps=10/default/results.json").read_text())
    assert other["capture"]["cache"]["hit"] is True
    assert other["metrics"]["mean_true_error"] < m["mean_true_error"]     # less noise, less error

    from runners import report

    assert report.main([str(out), "--include-tagged", "smoke"]) == 0
    md = (out / "report.md").read_text()
    assert "## Floating-point error of unmasking (paper Table 4)" in md
    assert "| ep1 (ε=1) | 13 | 1300 |" in md and "| ep1 (ε=10) | 13 | 1300 |" in md
    assert "Down projection (paper §6.3)" in md and "wide-accumulator" in md
    pngs = list(out.glob("report_fp_error_*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes().startswith(b"\x89PNG")


def test_fp_error_refuses_a_configuration_without_masks(tmp_path):
    res = run_cli_in_process(["experiment=fp_error_smoke", "configuration=slalom"], tmp_path / "out",
                             tmp_path / "cache")
    assert res.returncode == 2
    assert res.stderr_lines == ["splitbench: error: experiment fp_error studies the masks of ep1, epn, t3; "
                                "configuration=slalom has none"]


def test_controlled_error_smoke_end_to_end_and_report(tmp_path, monkeypatch):
    import wandb

    from ..test_wandb_mirror_offline import _Run

    mirrored = _Run()      # logger=wandb with a fake init: the W&B step history, nothing leaves the machine
    monkeypatch.setattr(wandb, "init", lambda **kw: mirrored)
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "out"
    res = run_cli_in_process(["experiment=controlled_error_smoke", "semantic_model=null", "logger=wandb"], out,
                             tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    run_dir = next(out.rglob("results.json")).parent
    results = json.loads((run_dir / "results.json").read_text())
    assert all(k in results for k in CONTRACT)
    rows = {r["slug"]: r for r in results["table"]}
    assert list(rows) == ["t3", "natural", "ce_0p0001", "ce_0p01"]
    assert rows["t3"]["realised_mae"] == 0 and rows["t3"]["exact_match"] == 100.0
    assert 0 < rows["natural"]["realised_mae"] < 1e-4
    for slug, target in (("ce_0p0001", 1e-4), ("ce_0p01", 1e-2)):
        assert abs(rows[slug]["realised_mae"] / target - 1) < 0.01
    assert results["metrics"]["max_rescale_deviation"] < 0.01
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and set(samples[0]["levels"]) == set(rows)
    # W&B step history: one step per batch (2 prompts, batch_size 2: one), every level's tokens per second
    history = [(step, data) for step, data in mirrored.logged if step is not None]
    assert [step for step, _ in history] == [0]
    assert set(history[0][1]) == {f"batch_tokens_per_second/{slug}" for slug in rows}
    assert all(rate > 0 for rate in history[0][1].values())

    from runners import report

    assert report.main([str(out), "--include-tagged", "smoke"]) == 0
    md = (out / "report.md").read_text()
    assert "## Controlled numerical error (paper Table 5)" in md
    assert "| T3 | 0 |" in md and "| EP1 (natural) |" in md and "| CE 0.01 | 0.01 |" in md
    assert len(list(out.glob("report_controlled_error_*.png"))) == 1

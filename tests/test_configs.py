"""Config composition (compose API, no model loading), the schema, run-directory naming, results files."""
from __future__ import annotations

import importlib
import itertools
import json
import os

import pytest
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import MISSING, OmegaConf

from harness import configurations, run_identity, schema
from harness.checks import MISSING_FILE
from harness.errors import UserError
from harness.results import GenerationCache, RunDir, atomic_write_json, config_hash, is_complete, remove_if_empty
from harness.splitee import config as splitee_config
from runners.registry import RUNNERS, runner_systems
from runners.run import render_error
from runners.splitee import attack, controlled_error, fidelity, fp_error, timing

from .conftest import CONF, compose_config, group_options

MODELS = group_options("model")
CONFIGURATIONS = group_options("configuration")
WORKLOADS = group_options("workload")
EXPERIMENTS = [None, *group_options("experiment")]


def _overrides(model, configuration, workload, experiment) -> list[str]:
    out = [f"model={model}", f"configuration={configuration}", f"workload={workload}"]
    return out + ([f"experiment={experiment}"] if experiment else []) + _fusion_mode(configuration)


def _fusion_mode(configuration) -> list[str]:
    """A collab defence of one fusion mode only is composed in that mode (collab.fusion defaults to cloud;
    the edge-side baselines refuse it, one line, as test_collab checks)."""
    from harness.collab.config import MODES_OF

    modes = MODES_OF.get(configuration)
    return [f"collab.fusion={modes[0]}"] if modes and "cloud" not in modes else []


# The data files an experiment (by experiment_name) reads by default from ../shared/data/..., which a user's
# clone does not have; in the order validate checks them.
SHARED_DATA = {"splitft": ["splitft.data.path"], "grad_audit_2core": ["grad_audit.corpus.path"]}


def _validate_with_local_data(cfg) -> None:
    """validate; where one of the experiment's SHARED_DATA files is missing (a clone), it must be refused for
    that, in the documented line, and the config pass with a file in its place. Any other refusal fails."""
    for key in SHARED_DATA.get(cfg.experiment_name, []):
        path = OmegaConf.select(cfg, key)
        assert "shared/data" in path, f"{key}={path}: SHARED_DATA is out of date"
        if not os.path.exists(path):
            with pytest.raises(UserError) as refused:
                schema.validate(cfg, runner_systems())
            assert str(refused.value).startswith(f"{key}={path} {MISSING_FILE}"), str(refused.value)
            OmegaConf.update(cfg, key, str(CONF / "config.yaml"))   # any existing file
    schema.validate(cfg, runner_systems())


def _check_composed(cfg) -> None:
    """A composed config is valid: schema-typed, every value resolves, the range checks pass."""
    assert OmegaConf.get_type(cfg) is schema.SplitbenchConfig
    if configurations.get(cfg.configuration.name).system not in runner_systems()[cfg.runner]:
        return  # a pairing validate refuses by design (another system's runner); test_bad_input covers it
    _validate_with_local_data(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert resolved["configuration"]["name"] in configurations.NAMES
    # Model and workload are typed too: the model by its kind's schema.
    assert OmegaConf.get_type(cfg.workload) is schema.WorkloadConfig
    assert OmegaConf.get_type(cfg.model) is schema.MODEL_SCHEMAS[cfg.model.kind]
    semantic = RUNNERS_MODULES[cfg.runner].semantic_config(cfg)
    assert len(config_hash(semantic)) == 64


@pytest.mark.parametrize("experiment, key", [(e, k) for e, keys in SHARED_DATA.items() for k in keys])
def test_a_missing_shared_data_file_is_refused_then_replaced(hydra_conf, experiment, key):
    """The clone's path of _validate_with_local_data, also where ../shared/data exists (these worktrees): the
    default file missing is refused in the documented line, then validates with a file in its place."""
    cfg = compose_config([f"experiment={experiment}", f"{key}=../shared/data/absent/file.raw"])
    _validate_with_local_data(cfg)
    assert OmegaConf.select(cfg, key) == str(CONF / "config.yaml")


RUNNERS_MODULES = {"fidelity": fidelity, "timing": timing, "fp_error": fp_error,
                   "controlled_error": controlled_error, "attack": attack}
RUNNERS_MODULES["collab"] = importlib.import_module("runners.collab")
RUNNERS_MODULES["restore"] = importlib.import_module("runners.splitee.restore")
RUNNERS_MODULES["grad_audit"] = importlib.import_module("runners.grad_audit")
RUNNERS_MODULES["splitft"] = importlib.import_module("runners.splitft")
RUNNERS_MODULES["sanitize"] = importlib.import_module("runners.sanitize")
RUNNERS_MODULES["sequential_attack"] = importlib.import_module("runners.splitee.sequential_attack")
RUNNERS_MODULES["calibration"] = importlib.import_module("runners.calibration")
RUNNERS_MODULES["privacy_audit"] = importlib.import_module("runners.splitee.privacy_audit")


def test_group_options_exist():
    assert set(CONFIGURATIONS) == set(configurations.NAMES)
    assert {"smoke", "timing", "fidelity", "timing_smoke"} <= set(EXPERIMENTS)
    assert {"tiny-llama", "smollm2-135m"} <= set(MODELS)
    assert set(RUNNERS) == set(RUNNERS_MODULES)


def test_every_option_with_every_experiment(hydra_conf):
    """A covering subset of the full product (test_full_product composes all of it under -m slow): every
    experiment with its defaults; every configuration of the systems a runner runs with one experiment of
    that runner; every model and workload with the smoke experiment."""
    first_of_runner: dict[str, str] = {}
    for experiment in EXPERIMENTS:
        cfg = compose_config([f"experiment={experiment}"] if experiment else [])
        _check_composed(cfg)
        first_of_runner.setdefault(cfg.runner, experiment)
    systems = runner_systems()
    for runner, experiment in first_of_runner.items():
        for configuration in CONFIGURATIONS:
            if configurations.get(configuration).system in systems[runner]:
                _check_composed(compose_config(_overrides("tiny-llama", configuration, "builtin", experiment)))
    for model in MODELS:
        _check_composed(compose_config(_overrides(model, "ep1", "builtin", "smoke")))
    _check_composed(compose_config(_overrides("gemma3-270m", "ep1", "builtin", "attack_smoke")))
    for workload in WORKLOADS:
        _check_composed(compose_config(_overrides("tiny-qwen3", "epn", workload, "smoke")))


@pytest.mark.slow
def test_full_product(hydra_conf):
    for combo in itertools.product(MODELS, CONFIGURATIONS, WORKLOADS, EXPERIMENTS):
        _check_composed(compose_config(_overrides(*combo)))


def test_defaults_and_experiments(hydra_conf):
    cfg = compose_config([])
    assert (cfg.runner, cfg.experiment_name, cfg.configuration.name, cfg.model.name) == ("fidelity", "fidelity", "ep1", "smollm2-135m")
    assert cfg.logger.name == "none" and cfg.tags == [] and cfg.generation.max_new_tokens == 64
    assert cfg.engine.allow_cpu_fallback is False and cfg.workload.n_prompts == 15

    smoke = compose_config(["experiment=smoke"])
    assert smoke.model.name == "tiny-llama" and smoke.workload.n_prompts == 3
    assert smoke.generation.max_new_tokens == 8 and list(smoke.tags) == ["smoke"]
    assert smoke.logger.name == "none" and smoke.semantic_model == "all-MiniLM-L6-v2"
    # The command line still wins over what an experiment sets.
    assert compose_config(["experiment=smoke", "model=tiny-qwen3"]).model.name == "tiny-qwen3"

    tim = compose_config(["experiment=timing"])
    assert tim.runner == "timing" and tim.workload.n_prompts == 45 and tim.generation.batch_size == 15
    assert tim.engine.allow_cpu_fallback is True  # Table 1 times gpu too, on the CPU where there is no CUDA
    assert list(tim.timing.configurations) == list(configurations.names())  # SpliTEE's: the other systems are not timed
    assert list(tim.timing.max_new_tokens) == [100, 200, 400, 800]
    ts = compose_config(["experiment=timing_smoke"])
    assert ts.runner == "timing" and ts.model.name == "tiny-llama" and list(ts.tags) == ["smoke"]

    fid = compose_config(["experiment=fidelity"])
    assert fid.generation.max_new_tokens == 200 and fid.workload.n_prompts == 30
    assert fid.semantic_model == "all-mpnet-base-v2"

    # A configuration's YAML holds its name and description; what it does is its registry entry.
    for name in CONFIGURATIONS:
        composed = compose_config([f"configuration={name}"]).configuration
        assert set(composed) == {"name", "description"} and composed.name == name
        entry = configurations.get(name)
        assert entry.uses_epsilon is (name == "ep1" or entry.epsilon_rule == configurations.OWN_PARAMETER)


@pytest.mark.parametrize("override, error", [
    ("epsilon=abc", ConfigCompositionException),
    ("generation.max_new_tokens=abc", ConfigCompositionException),
    ("configuration=nope", MissingConfigException),
    ("no_such_key=1", ConfigCompositionException),
    ("workload.no_such_key=1", ConfigCompositionException),
    ("model.hub_id=x", ConfigCompositionException),  # smollm2-135m is a gguf_package model
])
def test_schema_rejects_at_composition(hydra_conf, override, error):
    with pytest.raises(error) as info:
        compose_config([override])
    line = render_error(info.value)
    assert "\n" not in line
    assert override.split("=")[0].split(".")[-1] in line or "nope" in line


@pytest.mark.parametrize("override, message", [
    ("epsilon=-1", "epsilon must be a finite number > 0"),
    ("epsilon=0", "epsilon must be a finite number > 0"),
    ("generation.max_new_tokens=0", "generation.max_new_tokens must be >= 1"),
    ("generation.batch_size=0", "generation.batch_size must be >= 1"),
    ("baseline=tpu", "baseline='tpu' is not one of auto, cpu, gpu"),
    ("runner=defend", "runner='defend' is not one of"),
    ("timing.configurations=[cpu,nope]", "timing.configurations must be"),
    ("timing.max_new_tokens=[0]", "timing.max_new_tokens must be"),
    ("engine.offload=[qkv,down_up]", "engine.offload: unknown op"),
    ("engine.bank_on_exhaustion=wait", "engine.bank_on_exhaustion='wait'"),
    ("engine.slalom_scaling=wide", "engine.slalom_scaling='wide' is not one of per_token, per_op, fixed"),
    ("epn_n=words", "epn_n='words' is not one of text, input_ids"),
    ("mask_seeds=[]", "mask_seeds must be null or a non-empty list"),
    ("mask_seeds=[1,1]", "mask_seeds must be null or a non-empty list of distinct integers"),
    ("mask_seeds=[-1]", "mask_seeds must be null or a non-empty list"),
    ("dp_delta=0", "dp_delta must lie in"),
    ("logger=wandb", None),
    ("logger.mode=sometimes", "logger.mode='sometimes'"),
    ("configuration.name=nope", "configuration.name='nope' is not one of cpu, gpu, tdx, t3, ep1, epn, slalom"),
    ("model.kind=onnx", "model smollm2-135m: unknown kind 'onnx'"),
    ("model.kind=hub", "model.kind='hub' but model smollm2-135m is typed by the gguf_package schema"),
    ("generation.batch_size=???", "no value given for generation.batch_size"),
])
def test_validate(hydra_conf, override, message):
    cfg = compose_config([override])
    if message is None:
        schema.validate(cfg, runner_systems())
        return
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")):
        schema.validate(cfg, runner_systems())


def _run_dir(overrides: list[str]) -> str:
    cfg = compose_config(overrides, hydra_node=True)
    HydraConfig.instance().set_config(cfg)
    return str(cfg.hydra.run.dir)


def test_schema_holds_no_values():
    """Defaults live in conf/ only: every schema field is MISSING until a YAML file or an override sets it (the
    shared schema's and every system's: SpliTEE's harness/splitee/config.py, each section's module)."""
    import dataclasses

    modules = [schema, *schema.TOP_LEVEL.values(), *schema.SYSTEM_SECTIONS.values()]
    nodes = [obj for module in modules for obj in vars(module).values()
             if isinstance(obj, type) and dataclasses.is_dataclass(obj)]
    assert {schema.SplitbenchConfig, splitee_config.AttackCorpusConfig, schema.WorkloadConfig, schema.HubModelConfig} <= set(nodes)
    for node in nodes:
        for f in dataclasses.fields(node):
            assert f.default == MISSING and f.default_factory is dataclasses.MISSING, f"{node.__name__}.{f.name}"


def test_model_entries_are_typed_by_their_kind(hydra_conf):
    for model in MODELS:
        cfg = compose_config([f"model={model}"])
        assert OmegaConf.get_type(cfg.model) is schema.MODEL_SCHEMAS[cfg.model.kind]
    assert compose_config(["model=tiny-llama"]).model.revision is None
    assert compose_config(["experiment=attack_smoke"]).attack.decoder is None
    cfg = compose_config(["experiment=attack_smoke", "+model@attack.decoder=tiny-qwen3"])
    assert OmegaConf.get_type(cfg.attack.decoder) is schema.RandomModelConfig
    assert (cfg.attack.decoder.name, cfg.model.name) == ("tiny-qwen3", "tiny-llama-tied")
    schema.validate(cfg, runner_systems())


def test_run_dir_layout(hydra_conf):
    base = ["paths.output_dir=out"]
    assert _run_dir(base) == "out/fidelity/smollm2-135m/ep1/eps=1/default"
    assert _run_dir(base + ["epsilon=0.5", "configuration=ep1"]) == "out/fidelity/smollm2-135m/ep1/eps=0.5/default"
    # epsilon=1 and epsilon=1.0 are one run.
    assert _run_dir(base + ["epsilon=1.0"]) == _run_dir(base + ["epsilon=1"])
    # Configurations that ignore ε share one directory whatever ε says.
    epn = {_run_dir(base + ["configuration=epn", f"epsilon={e}"]) for e in (0.5, 1, 5, 10, 15)}
    assert epn == {"out/fidelity/smollm2-135m/epn/eps=na/default"}
    # Other semantic overrides name the last component; labels (tags, logger, rerun) do not.
    assert _run_dir(base + ["generation.max_new_tokens=5", "seed=3"]) == \
        "out/fidelity/smollm2-135m/ep1/eps=1/generation.max_new_tokens=5,seed=3"
    assert _run_dir(base + ["tags=[a,b]", "logger=wandb", "rerun=true"]) == _run_dir(base)
    # Path-like values never nest or escape the run directory.
    odd = _run_dir(base + ["workload.path=/data/../x y.jsonl"]).split("/")
    assert len(odd) == 6 and odd[-1].startswith("workload.path=_data_.._x_y.jsonl-")
    assert _run_dir(base + ["experiment=smoke"]) == "out/smoke/tiny-llama/ep1/eps=1/default"
    assert _run_dir(base + ["experiment=timing", "configuration=epn"]) == "out/timing/smollm2-135m/all/eps=1/default"
    assert compose_config(base, hydra_node=True).hydra.sweep.dir == "out/fidelity"


def test_run_dir_leaves_out_what_the_runner_does_not_read(hydra_conf):
    """The last component names overrides of the keys the run reads only (harness/run_identity.py READS): another
    system's parameter, or a section of the run's runner that its configuration does not use, moves nothing."""
    base = ["paths.output_dir=out"]
    assert _run_dir(base + ["collab.alpha=0.5", "grad_audit.latent_dim=3"]) == _run_dir(base)
    assert _run_dir(base + ["collab.alpha=0.5", "seed=3"]) == _run_dir(base + ["seed=3"])
    # fidelity reads `sanitize` for a sanitiser only.
    assert _run_dir(base + ["sanitize.window=3"]) == _run_dir(base)
    assert _run_dir(base + ["configuration=stencil", "sanitize.window=3"]) == \
        "out/fidelity/smollm2-135m/stencil/eps=na/sanitize.window=3"
    assert _run_dir(base + ["experiment=timing", "collab.alpha=1", "timing.mode=separate"]) == \
        "out/timing/smollm2-135m/all/eps=1/timing.mode=separate"
    # collab reads no workload; restore no generation settings (the source attack run fixed them).
    assert _run_dir(base + ["experiment=collab_smoke", "workload=dolly", "collab.alpha=0.5"]).endswith("/collab.alpha=0.5")
    assert _run_dir(base + ["experiment=restore_smoke", "generation.batch_size=2", "restore.batch_size=3"]).endswith(
        "/from_attack/eps=na/restore.batch_size=3")
    labels = compose_config([], hydra_node=True).hydra.job.config.override_dirname.exclude_keys
    assert run_identity.unread_overrides(["experiment=smoke", "collab.alpha=0.5", "seed=1", "tags=[a]"], labels,
                                     "fidelity", "ep1") == ["collab.alpha=0.5"]


def test_identity_is_an_allow_list(hydra_conf):
    """A run's config hash takes in only the keys its runner reads: a section added later (a new system) and
    the sections of the systems it does not run leave every existing run's hash as it was."""
    assert set(run_identity.READS) == set(RUNNERS)
    for experiment in EXPERIMENTS[1:]:
        for extra in ([], ["configuration=stencil"]):
            cfg = compose_config([f"experiment={experiment}", *extra])
            if extra and cfg.runner != "fidelity":
                continue
            module = RUNNERS_MODULES[cfg.runner]
            before = config_hash(module.semantic_config(cfg))
            grown = OmegaConf.create(OmegaConf.to_container(cfg))  # untyped: it takes a key the schema lacks
            grown.new_system = {"alpha": 0.5, "seeds": [1, 2]}
            grown.new_knob = 3
            read = {key.split(".")[0] for key in run_identity.keys(cfg)}
            for section in schema.SYSTEM_SECTIONS:
                if section not in read:
                    grown[section] = {"changed": True}
            assert config_hash(module.semantic_config(grown)) == before, (experiment, extra)


# Each probe changes a value that some runner reads and another does not.
_PROBES = ("attack.sequential.mode=free_running", "attack.layer=1", "attack.controls.gate_margin_pp=2",
           "attack.sequential.min_pruning_recall=0.5", "engine.bank_bytes=1", "engine.sigma_scale=2",
           "grad_audit.mitigation.noise_multiplier=0.5", "grad_audit.latent_dim=4")


@pytest.mark.parametrize(("experiment", "extra"), [
    ("attack_smoke", []), ("sequential_attack_smoke", []), ("fp_error_smoke", []), ("calibration_smoke", []),
    ("grad_audit_smoke", []), ("grad_audit_smoke", ["configuration=decoy_mitigated"]), ("privacy_audit_smoke", [])])
def test_directory_and_hash_take_the_same_keys(hydra_conf, experiment, extra):
    """A run's directory is named by an override exactly when its config hash moves with it: both come from
    the keys its runner declares it reads (harness/systems.py Runner: reads, ignores, reads_only_for)."""
    base = [f"experiment={experiment}", "paths.output_dir=out", *extra]

    def digest(overrides):
        cfg = compose_config(overrides)
        return config_hash(RUNNERS_MODULES[cfg.runner].semantic_config(cfg))

    plain_dir, plain_hash = _run_dir(base), digest(base)
    moved = {probe: (_run_dir([*base, probe]) != plain_dir, digest([*base, probe]) != plain_hash)
             for probe in _PROBES}
    assert all(named == hashed for named, hashed in moved.values()), moved
    assert any(named for named, _ in moved.values()) and not all(named for named, _ in moved.values()), moved


def test_declared_identities(hydra_conf):
    """The parts of a section that each runner reads: the attack runner none of the sequential attacker's
    `attack.sequential`, the sequential attacker only that and `attack.controls`; fp_error and calibration
    only the engine's σ settings; the grad audit the mitigation only where it runs."""
    def semantic(overrides):
        cfg = compose_config(overrides)
        return RUNNERS_MODULES[cfg.runner].semantic_config(cfg)

    assert "sequential" not in semantic(["experiment=attack_smoke"])["attack"]
    assert set(semantic(["experiment=sequential_attack_smoke"])["attack"]) == {"sequential", "controls"}
    assert set(semantic(["experiment=fp_error_smoke"])["engine"]) == {"offload", "sensitivity_rule", "sigma_scale"}
    calibration = semantic(["experiment=calibration_smoke"])
    assert set(calibration["engine"]) == {"sensitivity_rule", "sigma_scale"}
    assert set(calibration["system_margins"]) == {"collab", "sanitize", "splitft", "grad_audit", "attack"}
    assert not {"collab", "sanitize", "splitft", "grad_audit", "attack"} & set(calibration)
    assert "mitigation" not in semantic(["experiment=grad_audit_smoke"])["grad_audit"]
    assert "mitigation" in semantic(["experiment=grad_audit_smoke", "configuration=decoy_mitigated"])["grad_audit"]
    labels = compose_config([], hydra_node=True).hydra.job.config.override_dirname.exclude_keys
    assert run_identity.unread_overrides(["attack.sequential.mode=free_running", "attack.layer=1",
                                      "engine.bank_bytes=1"], labels, "sequential_attack", "ep1") == ["attack.layer=1"]
    assert run_identity.unread_overrides(["attack.sequential.mode=free_running", "attack.layer=1"], labels, "attack",
                                     "ep1") == ["attack.sequential.mode=free_running"]


def test_dp_delta_moves_only_the_runs_that_convert_with_it(hydra_conf):
    """dp_delta (conf/splitee/default.yaml, the δ of harness/splitee/accounting.py privacy_summary) is read by fidelity
    and attack only: at 1e-5, what every run converted with before the key existed, it stays out of their hash
    (harness/systems.py `unhashed`); another δ moves their hash and directory, and no other runner's."""
    for experiment in ("smoke", "attack_smoke", "sequential_attack_smoke", "fp_error_smoke"):
        base = [f"experiment={experiment}", "paths.output_dir=out"]
        cfg = compose_config(base)
        module = RUNNERS_MODULES[cfg.runner]
        plain = module.semantic_config(cfg)
        assert "dp_delta" not in plain
        other = module.semantic_config(compose_config([*base, "dp_delta=1e-3"]))
        reads = cfg.runner in ("fidelity", "attack")
        assert (config_hash(other) != config_hash(plain)) == reads, experiment
        assert (_run_dir([*base, "dp_delta=1e-3"]) != _run_dir(base)) == reads, experiment
        assert other.get("dp_delta") == (1e-3 if reads else None)


def test_semantic_hash(hydra_conf):
    def digest(overrides):
        cfg = compose_config(overrides)
        return config_hash(RUNNERS_MODULES[cfg.runner].semantic_config(cfg))

    assert digest(["configuration=epn", "epsilon=0.5"]) == digest(["configuration=epn", "epsilon=5"])
    assert digest(["configuration=ep1", "epsilon=0.5"]) != digest(["configuration=ep1", "epsilon=5"])
    assert digest(["tags=[x]", "logger=wandb", "experiment_name=other", "paths.output_dir=/x"]) == digest([])
    assert digest(["seed=1"]) != digest([])
    assert digest(["generation.batch_size=3"]) != digest([])
    # Timing ignores the configuration group; it uses ε only when ep1 is timed.
    assert digest(["experiment=timing", "configuration=epn"]) == digest(["experiment=timing"])
    assert digest(["experiment=timing", "epsilon=5"]) != digest(["experiment=timing"])
    assert digest(["experiment=timing", "timing.configurations=[cpu]", "epsilon=5"]) == \
        digest(["experiment=timing", "timing.configurations=[cpu]"])


def test_placement_moves_the_hash_only_where_it_is_read_and_not_cpu_float32(hydra_conf):
    """A CPU float32 placement is what every run computed before placements existed (finished runs keep their
    hash); another dtype or device changes the numbers; a runner that never reads a placement ignores it."""
    import importlib

    def semantic(overrides):
        cfg = compose_config(overrides)
        return importlib.import_module(RUNNERS[cfg.runner]).semantic_config(cfg)

    for experiment, key in (("collab_smoke", "collab.placement.cloud"), ("splitft_smoke", "splitft.placement"),
                            ("grad_audit_smoke", "grad_audit.placement"), ("sanitize_smoke", "sanitize.placement")):
        section = key.split(".")[0]
        plain = semantic([f"experiment={experiment}"])
        assert "placement" not in plain[section], experiment
        half = semantic([f"experiment={experiment}", f"{key}.dtype=bfloat16"])
        assert config_hash(half) != config_hash(plain), experiment
        assert "placement" in half[section]
    fidelity = ["configuration=stencil"]
    assert config_hash(semantic([*fidelity, "sanitize.placement.dtype=float16"])) == config_hash(semantic(fidelity))


def test_config_hash_is_order_free():
    assert config_hash({"a": 1, "b": {"c": [1, 2], "d": None}}) == config_hash({"b": {"d": None, "c": [1, 2]}, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 1.5})


# ---------------------------------------------------------------------------------------------------
# Run directories and files
# ---------------------------------------------------------------------------------------------------


def test_atomic_writes_and_done_marker(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.state("h") == "todo"
    run.write_failure({"status": "failed", "config_hash": "h"})
    assert run.state("h") == "todo" and not is_complete(run.path)
    run.write_results({"status": "ok", "config_hash": "h", "x": float("nan")}, [{"id": "a", "output_ids": [1, 2]}],
                      side_files={"sensitivity.json": [{"op": "qkv"}]})
    assert run.state("h") == "complete" and run.state("other") == "stale"
    names = sorted(p.name for p in run.path.iterdir())
    assert names == [".done", "results.json", "samples.jsonl", "sensitivity.json"]  # no temp files left
    results = json.loads(run.results_path.read_text())
    assert results["x"] is None  # NaN → null: strict JSON
    assert [json.loads(line) for line in run.samples_path.read_text().splitlines()] == [{"id": "a", "output_ids": [1, 2]}]
    # .done is written after results.json.
    assert (run.path / ".done").stat().st_mtime_ns >= run.results_path.stat().st_mtime_ns
    # A new failure clears the marker, so a rerun retries rather than trusting old files.
    run.write_failure({"status": "failed", "config_hash": "h"})
    assert run.state("h") == "todo"


def test_atomic_write_keeps_old_file_on_error(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_lock_is_exclusive_and_leaves_nothing(tmp_path):
    run = RunDir(tmp_path / "run")
    with run.lock() as first:
        assert first
        with run.lock() as second:  # a second open file description: flock conflicts even in-process
            assert not second
    with run.lock() as again:
        assert again
    assert list(run.path.iterdir()) == []
    # A lock file left by a killed process (no holder) does not block.
    (run.path / ".lock").write_text("")
    with run.lock() as stale:
        assert stale


def test_remove_if_empty(tmp_path):
    deep = tmp_path / "out" / "exp" / "m" / "c" / "eps=1" / "default"
    deep.mkdir(parents=True)
    (tmp_path / "out" / "exp" / "keep.txt").write_text("x")
    remove_if_empty(deep, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "exp").iterdir()) == ["keep.txt"]
    remove_if_empty(tmp_path / "elsewhere", tmp_path / "out")  # outside the root: untouched, no error


def test_generation_cache(tmp_path):
    cache = GenerationCache(tmp_path)
    assert cache.get("k") is None
    cache.put("k", {"output_ids": [[1, 2]]})
    assert cache.get("k")["output_ids"] == [[1, 2]]
    # An entry stored under another key is never served.
    os.replace(tmp_path / "generations" / "k.json", tmp_path / "generations" / "j.json")
    assert cache.get("j") is None


def test_eps_dirname_and_overrides_dirname():
    assert run_identity.eps_dirname("ep1", 0.5) == "eps=0.5"
    assert run_identity.eps_dirname("ep1", 15.0) == "eps=15" == run_identity.eps_label(15)
    for name in ("cpu", "gpu", "tdx", "t3", "epn", "slalom"):
        assert run_identity.eps_dirname(name, 0.5) == "eps=na"
    assert run_identity.eps_dirname("nope", 0.5) == "eps=na"  # validate rejects the name, in one line
    assert run_identity.overrides_dirname("") == "default"
    long = run_identity.overrides_dirname("a=" + "x" * 300)
    assert len(long) <= 120 and long != run_identity.overrides_dirname("a=" + "x" * 299)
    assert "/" not in run_identity.overrides_dirname("workload.path=/a/b")
    # A model placed elsewhere on the command line (Hydra files it under the excluded `model` group) names
    # its own directory, apart from the run without it; the experiment's own placement does not appear.
    decoder = run_identity.overrides_dirname("", ["experiment=attack_smoke", "+model@attack.decoder=tiny-llama-tied"])
    assert decoder != "default" and decoder == run_identity.overrides_dirname("", ["model@attack.decoder=tiny-llama-tied"])
    assert run_identity.overrides_dirname("", ["experiment=attack_smoke", "model=tiny-llama"]) == "default"
    assert run_identity.overrides_dirname("a=1", ["model@collab.cloud=x"]) != run_identity.overrides_dirname("a=1", [])
    # the run directory's resolver too: a decoder of its own is a run of its own (its hash differs)
    exclude = OmegaConf.load(CONF / "hydra" / "default.yaml").job.config.override_dirname.exclude_keys
    plain = run_identity.run_overrides_dirname("attack", "ep1", ["experiment=attack_smoke"], exclude)
    placed = run_identity.run_overrides_dirname("attack", "ep1", ["experiment=attack_smoke",
                                                              "+model@attack.decoder=tiny-qwen3"], exclude)
    assert plain == "default" and placed != plain and "decoder" in placed
    assert run_identity.run_overrides_dirname("attack", "ep1", ["model=tiny-llama"], exclude) == "default"


def test_logger_yaml_matches_wandb_modes(hydra_conf):
    cfg = compose_config(["logger=wandb"])
    assert cfg.logger.mode == "offline" and cfg.logger.mode in schema.WANDB_MODES


def test_launcher_plugins_compose(hydra_conf):
    # The plugin's own option (conf/ deliberately has no hydra/launcher/joblib.yaml: a file of the same
    # name as the plugin's structured config triggers Hydra's deprecated automatic schema matching).
    cfg = compose_config(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], hydra_node=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == 2


def test_submitit_slurm_launcher_composes(hydra_conf):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = compose_config(["hydra/launcher=submitit_slurm"], hydra_node=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    # Its job files land inside the experiment's output dir, beside the runs.
    assert cfg.hydra.launcher.submitit_folder == "outputs/fidelity/.submitit/%j"


def test_render_error_is_one_line(hydra_conf):
    with pytest.raises(MissingConfigException) as info:
        compose_config(["model=nope"])
    line = render_error(info.value)
    assert line.startswith("no config option 'model/nope' (available: ") and "tiny-llama" in line
    assert "\n" not in line



def test_the_default_splitft_runtime_keeps_finished_runs_hashes(hydra_conf):
    """`splitft.runtime=simulation` (the default, what every run computed before the key existed) stays out of
    the hash; the split deployment moves it."""
    from runners import splitft

    plain = splitft.semantic_config(compose_config(["experiment=splitft_smoke", "configuration=splitft_none"]))
    assert "runtime" not in plain["splitft"]
    split = splitft.semantic_config(compose_config(["experiment=splitft_smoke", "configuration=splitft_none",
                                                    "splitft.runtime=split_deployment"]))
    assert split["splitft"]["runtime"] == "split_deployment" and config_hash(split) != config_hash(plain)

"""The systems registry (harness/systems.py): every list of systems is built from it, and every registered
system has the folders docs/architecture.md names ("A whole new system"), so adding a system is its folders
plus one entry."""
from __future__ import annotations

import importlib
import json
from dataclasses import fields

import pytest
import yaml

from harness import configurations, run_identity, schema, systems
from runners import registry
from runners.report import sections

from .conftest import CONF, REPO, compose_config, run_cli_in_process


def test_configuration_registry_is_the_entries_configurations():
    declared = [c for s in systems.SYSTEMS for c in s.configurations]
    assert list(configurations.REGISTRY.values()) == declared
    assert configurations.SYSTEMS == tuple(s.name for s in systems.SYSTEMS)
    for s in systems.SYSTEMS:
        assert configurations.names(system=s.name) == tuple(c.name for c in s.configurations)
    assert not any(s.configurations for s in systems.CROSS_SYSTEM)


def test_runner_registry_is_the_entries_runners():
    declared = [(s, r) for s in systems.ENTRIES for r in s.runners]
    assert registry.RUNNERS == {r.name: r.module for _, r in declared}
    assert run_identity.READS == {r.name: r.reads for _, r in declared}
    assert run_identity.CROSS_SYSTEM == tuple(r.name for s in systems.CROSS_SYSTEM for r in s.runners) == ("calibration",)
    for s, r in declared:
        expected = systems.NAMES if s in systems.CROSS_SYSTEM else (s.name, *r.also_runs)
        assert registry.systems_of(r.name) == expected
    assert registry.systems_of("fidelity") == (configurations.SPLITEE, configurations.SANITIZE)
    assert run_identity.RUNNER_PLACEMENTS == {r.name: r.placements for _, r in declared if r.placements}


def test_report_sections_are_the_entries_sections():
    declared = [m for s in systems.ENTRIES for m in s.report_sections] + ["runners.report.tradeoff"]
    assert [m.__name__ for m in sections.SECTIONS] == declared
    assert sections.EXPERIMENTS[-1] == "tradeoff"


def test_schema_sections_are_the_entries_sections(hydra_conf):
    declared = {s.section: s for s in systems.ENTRIES if s.section is not None}
    # derived from the registry, not listed here: a new system's section joins without an edit of this test
    assert set(schema.SYSTEM_SECTIONS) == set(declared) == set(systems.sections())
    types = {f.name: f.type for f in fields(schema.SplitbenchConfig)}
    for section, entry in declared.items():
        module, _, cls = entry.schema.partition(":")
        assert schema.SYSTEM_SECTIONS[section].__name__ == module
        assert types[section] is getattr(importlib.import_module(module), cls)
        assert callable(schema.SYSTEM_SECTIONS[section].check)
        assert run_identity.SECTION_SYSTEMS[section] == entry.name
    # SpliTEE's keys predate sections: its schema module types them at the top level, right after the shared
    # `epsilon`, and harness/schema.py holds none of them
    top = {s.name: s for s in systems.ENTRIES if s.section is None}
    assert set(schema.TOP_LEVEL) == set(top) == {systems.SPLITEE}
    module, _, cls = top[systems.SPLITEE].schema.partition(":")
    assert schema.TOP_LEVEL[systems.SPLITEE].__name__ == module == "harness.splitee.config"
    own = [f.name for f in fields(getattr(importlib.import_module(module), cls))]
    names = [f.name for f in fields(schema.SplitbenchConfig)]
    assert names[names.index("epsilon") + 1:][:len(own)] == own
    defined = {n for n, o in vars(schema.TOP_LEVEL[systems.SPLITEE]).items() if getattr(o, "__module__", None) == module}
    assert "EngineConfig" in defined and not defined & set(vars(schema))
    # conf/config.yaml composes each section's defaults through the registry's node, not a list of its own
    defaults = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    assert "system_sections" in defaults and not {k for d in defaults if isinstance(d, dict) for k in d} & set(declared)
    cfg = compose_config([])
    for section in declared:
        assert all(cfg[section][k] == v for k, v in yaml.safe_load((CONF / section / "default.yaml").read_text()).items())
    # and each calibrated system's part of the calibration section from its own conf/NAME/calibration.yaml
    for s in systems.SYSTEMS:
        if s.calibration is not None:
            assert cfg.calibration[s.name] == yaml.safe_load((CONF / s.name / "calibration.yaml").read_text())


@pytest.mark.parametrize("entry", systems.ENTRIES, ids=lambda s: s.name)
def test_every_entry_names_what_exists(entry, hydra_conf):
    for runner in entry.runners:
        module = importlib.import_module(runner.module)
        assert all(callable(getattr(module, f)) for f in ("semantic_config", "run", "describe_skip")), runner.name
        assert {"runner", "model"} <= set(runner.reads)
    for name in entry.report_sections:
        assert importlib.import_module(name).EXPERIMENT in {r.name for r in entry.runners}
    for name in entry.smoke:
        cfg = compose_config([f"experiment={name}"])
        assert cfg.runner in {r.name for r in entry.runners} and "smoke" in cfg.tags, name
    if entry.section is not None:
        assert (CONF / entry.section / "default.yaml").is_file()
    assert (REPO / entry.docs).is_file()


@pytest.mark.parametrize("system", systems.SYSTEMS, ids=lambda s: s.name)
def test_every_system_has_the_same_folders(system):
    """harness/NAME/, attacks/NAME/, runners/NAME.py (or, for a system with several runners, runners/NAME/),
    runners/report/NAME.py (or runners/report/NAME/), conf/NAME/ (its section's defaults), docs/NAME.md,
    tests/NAME/."""
    name = system.name
    assert (REPO / "harness" / name / "__init__.py").is_file()
    assert (REPO / "attacks" / name / "__init__.py").is_file()
    assert (REPO / "tests" / name / "__init__.py").is_file()
    modules = [r.module for r in system.runners] + list(system.report_sections)
    assert all((REPO / (m.replace(".", "/") + ".py")).is_file() for m in modules)
    for home, declared in (("runners", [r.module for r in system.runners]), ("runners.report", system.report_sections)):
        for module in declared:
            assert module == f"{home}.{name}" or module.startswith(f"{home}.{name}."), (name, module)
    if len(system.runners) == 1:
        assert system.runners[0].module == f"runners.{name}"
        assert system.report_sections == (f"runners.report.{name}",)
    # SpliTEE's keys predate sections (engine, attack, ... at the top level): its conf/splitee/default.yaml
    # holds them in the global package, so they keep their paths and every run its hash
    assert system.section == (None if name == systems.SPLITEE else name)
    conf = CONF / name / "default.yaml"
    assert conf.is_file()
    if system.section is None:
        assert conf.read_text().startswith("# @package _global_\n")
    assert system.docs == f"docs/{name}.md" and (REPO / system.docs).is_file()


# What runners/ and runners/report/ hold beside the systems' modules: the machinery every runner or section
# shares, and tradeoff.py, the one cross-system section (every run's `tradeoff` block in one chart)
SHARED_RUNNER_MODULES = {"__init__", "run", "registry", "common", "export", "lm_eval_model", "plan"}
SHARED_REPORT_MODULES = {"__init__", "__main__", "cli", "document", "format", "other", "plotting", "provenance", "roc",
                         "runs", "sections", "tradeoff", "wandb_report"}


@pytest.mark.parametrize("home, shared", (("runners", SHARED_RUNNER_MODULES),
                                          ("runners/report", SHARED_REPORT_MODULES)))
def test_runners_hold_each_entry_in_its_own_file_or_folder(home, shared):
    """runners/ and runners/report/ hold, beside the shared modules above, one NAME.py or one NAME/ package per
    entry (systems and cross-system runs): a system's runner or section left flat beside them (SpliTEE's
    fidelity.py before issue 30) or a file no entry names fails here."""
    folder = REPO / home
    files = {p.stem for p in folder.glob("*.py")}
    packages = {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()} - {"report"}
    entries = {s.name for s in systems.ENTRIES}
    assert files - shared <= entries and packages <= entries
    assert not (files & packages)


@pytest.mark.parametrize("layer", ("harness", "attacks", "tests"))
def test_a_layer_holds_one_folder_per_system_and_no_other(layer):
    """The registry's systems are the only code folders of harness/, attacks/ and tests/ (what all systems
    share sits in their modules): a system's code split over two folders (SpliTEE's engine in harness/split/
    beside harness/splitee/ until issue 30) or a folder no entry declares fails here. A folder holding no .py
    file (harness/data/, attacks/data/: data files; a __pycache__ left by a removed package) is not code."""
    code = {d.name for d in (REPO / layer).iterdir()
            if d.is_dir() and d.name != "__pycache__" and any(d.rglob("*.py"))}
    assert code == set(systems.NAMES)


# --- a sixth system, registered at test time (issue 53 item 5) -------------------------------------------------

# Its files, as a real sixth system would have them in the repository (here: a package in tmp_path and a conf
# folder on Hydra's search path). Its attack guesses each example's secret bit from what crossed; the runner
# records the guess rate with its Clopper–Pearson interval.
_SIXTH = {
    "sixth_system/__init__.py": "",
    "sixth_system/config.py": '''
from dataclasses import dataclass

from omegaconf import MISSING

from harness.checks import check_at_least


@dataclass
class SixthConfig:
    examples: int = MISSING


def check(section, cfg):
    check_at_least("sixth.examples", section.examples, 1)
''',
    "sixth_system/attack.py": '''
def guess(crossed):
    """The secret bit read from what crossed: its parity (what crossed is the secret plus an even mask)."""
    return [c % 2 for c in crossed]
''',
    "sixth_system/runner.py": '''
import numpy as np

from harness import run_identity
from metrics.proportions import clopper_pearson
from runners import common
from sixth_system.attack import guess


def describe_skip(cfg):
    return None


def semantic_config(cfg):
    return run_identity.semantic_config(cfg)


def run(cfg, ctx):
    rng = np.random.default_rng(int(cfg.seed))
    secret = rng.integers(2, size=int(cfg.sixth.examples))
    crossed = secret + 2 * rng.integers(100, size=len(secret))
    k = int(sum(g == s for g, s in zip(guess(crossed.tolist()), secret.tolist())))
    lo, hi = clopper_pearson(k, len(secret))
    results = {**common.results_header(cfg, "sixth", model=None, workload="sixth:random-bits",
                                       n_prompts=len(secret), generation=False),
               "configuration": cfg.configuration.name, "epsilon": None,
               "metrics": {"guess_rate": k / len(secret), "guess_rate_ci": [lo, hi]}}
    return common.finish(cfg, ctx, results, [], summary=lambda r: f"sixth: guess rate {k}/{len(secret)}")
''',
    "conf/sixth/default.yaml": "examples: 20\n",
    "conf/configuration/sixth_plain.yaml": 'name: sixth_plain\ndescription: "the sixth system, undefended"\n',
    "conf/experiment/sixth_smoke.yaml": ("# @package _global_\ndefaults:\n  - override /configuration: sixth_plain\n"
                                         "  - _self_\nrunner: sixth\nexperiment_name: sixth_smoke\n"
                                         "tags: [smoke]\nsixth:\n  examples: 12\n"),
}


def _reload_registry_readers():
    """Rebuild what is built from the registry at import (the configurations, the schema and its ConfigStore
    nodes, the run identity's tables, the runners' registry)."""
    for module in (configurations, schema, run_identity, registry):
        importlib.reload(module)


def test_a_sixth_system_runs_its_smoke_touching_only_the_registry(tmp_path, monkeypatch):
    """A throwaway sixth system (one config section, one configuration, one runner, one attack) registered at
    test time in harness/systems.py's SYSTEMS runs its smoke through the command line in this process, and no
    other shared file knows it: its section is composed from the registry (harness/schema.py), its
    configuration, runner and section check are found through it. A real sixth system would touch, besides
    its own files (harness/NAME/, attacks/NAME/ with its calibration.py, runners/NAME.py,
    runners/report/NAME.py, conf/NAME/default.yaml and calibration.yaml, conf/configuration/*.yaml, conf/experiment/NAME*.yaml,
    docs/NAME.md, tests/NAME/), the shared harness/systems.py (its entry), conf/calibration/default.yaml (its
    name in calibration.systems, where it is calibrated; its values are its own conf/NAME/calibration.yaml) and
    docs/systems.md and docs/architecture.md (its lines)."""
    for path, text in _SIXTH.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text.lstrip("\n"))
    monkeypatch.syspath_prepend(str(tmp_path))
    sixth = systems.System(
        name="sixth", section="sixth", schema="sixth_system.config:SixthConfig",
        configurations=(systems.Configuration("sixth_plain", "local", system="sixth"),),
        runners=(systems.Runner("sixth", "sixth_system.runner", ("runner", "seed", "configuration", "sixth")),),
        report_sections=(), smoke=("sixth_smoke",), docs="docs/sixth.md")
    monkeypatch.setattr(systems, "SYSTEMS", (*systems.SYSTEMS, sixth))
    monkeypatch.setattr(systems, "ENTRIES", systems.SYSTEMS + systems.CROSS_SYSTEM)
    monkeypatch.setattr(systems, "NAMES", tuple(s.name for s in systems.SYSTEMS))
    _reload_registry_readers()
    try:
        res = run_cli_in_process(["experiment=sixth_smoke", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"],
                                 tmp_path / "out", tmp_path / "cache")
        assert res.returncode == 0, res.stderr
        [found] = (tmp_path / "out").rglob("results.json")
        results = json.loads(found.read_text())
        assert results["experiment_name"] == "sixth_smoke" and results["configuration"] == "sixth_plain"
        assert results["metrics"]["guess_rate"] == 1.0 and results["n_prompts"] == 12
        # the section is checked through the registry: a bad value is a one-line error, nothing written
        bad = run_cli_in_process(["experiment=sixth_smoke", "sixth.examples=0",
                                  f"hydra.searchpath=[file://{tmp_path / 'conf'}]"], tmp_path / "bad", tmp_path / "cache")
        assert bad.returncode == 2 and bad.stderr_lines[0].startswith("splitbench: error: sixth.examples")
        assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").rglob("results.json"))
    finally:
        monkeypatch.undo()
        _reload_registry_readers()
    assert "sixth" not in registry.RUNNERS and "sixth" not in schema.SYSTEM_SECTIONS

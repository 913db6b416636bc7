"""The systems registry (harness/systems.py): every list of systems is built from it, and every registered
system has the folders docs/architecture.md names ("A whole new system"), so adding a system is its folders
plus one entry."""
from __future__ import annotations

import importlib
from dataclasses import fields

import pytest
import yaml

from harness import configurations, schema, systems
from runners import registry
from runners.report import sections

from .conftest import CONF, REPO, compose_config


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
    assert registry.READS == {r.name: r.reads for _, r in declared}
    assert registry.CROSS_SYSTEM == tuple(r.name for s in systems.CROSS_SYSTEM for r in s.runners) == ("calibration",)
    for s, r in declared:
        expected = systems.NAMES if s in systems.CROSS_SYSTEM else (s.name, *r.also_runs)
        assert registry.systems_of(r.name) == expected
    assert registry.systems_of("fidelity") == (configurations.SPLITEE, configurations.SANITIZE)
    assert schema.RUNNER_PLACEMENTS == {r.name: r.placements for _, r in declared if r.placements}


def test_report_sections_are_the_entries_sections():
    declared = [m for s in systems.ENTRIES for m in s.report_sections] + ["runners.report.tradeoff"]
    assert [m.__name__ for m in sections.SECTIONS] == declared
    assert sections.EXPERIMENTS[-1] == "tradeoff"


def test_schema_sections_are_the_entries_sections():
    declared = {s.section: s for s in systems.ENTRIES if s.section is not None}
    # derived from the registry, not listed here: a new system's section joins without an edit of this test
    assert set(schema.SYSTEM_SECTIONS) == set(declared) == set(systems.sections())
    types = {f.name: f.type for f in fields(schema.SplitbenchConfig)}
    for section, entry in declared.items():
        module, _, cls = entry.schema.partition(":")
        assert schema.SYSTEM_SECTIONS[section].__name__ == module
        assert types[section] is getattr(importlib.import_module(module), cls)
        assert callable(schema.SYSTEM_SECTIONS[section].check)
        assert schema.SECTION_SYSTEMS[section] == entry.name
    # conf/config.yaml composes each section's defaults
    defaults = yaml.safe_load((CONF / "config.yaml").read_text())["defaults"]
    groups = {k for d in defaults if isinstance(d, dict) for k in d}
    assert set(declared) <= groups


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
SHARED_RUNNER_MODULES = {"__init__", "run", "registry", "identity", "common", "export", "lm_eval_model", "plan"}
SHARED_REPORT_MODULES = {"__init__", "__main__", "cli", "document", "format", "other", "plotting", "provenance",
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

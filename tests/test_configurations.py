"""The configuration registry (harness/configurations.py): one declaration per configuration, one ε rule."""
from __future__ import annotations

import math
import re

import pytest

from harness import configurations
from harness.errors import UserError

from .conftest import CONF, REPO


def test_registry_matches_the_config_group():
    yaml_names = {p.stem for p in (CONF / "configuration").glob("*.yaml")}
    assert yaml_names == set(configurations.NAMES)


def test_kinds_of_configuration():
    get = configurations.get
    assert [c for c in configurations.names() if get(c).uses_epsilon] == ["ep1"]
    assert [c for c in configurations.names(system=configurations.COLLAB) if not get(c).uses_epsilon] == ["collab_none"]
    assert [c for c in configurations.names(system=configurations.SPLITFT) if not get(c).uses_epsilon] == [
        "splitft_central", "splitft_none"]
    assert configurations.names(gaussian=True) == ("ep1", "epn")
    assert configurations.names(split=True) == ("t3", "ep1", "epn", "slalom")
    assert {get(c).mechanism for c in configurations.names(split=True)} == {"plain", "gaussian", "slalom"}
    assert all(get(c).mechanism is None for c in configurations.names(split=False))
    assert [c for c in configurations.names() if get(c).runs_on == configurations.ACCELERATOR] == ["gpu"]
    # Sanitisers: the sanitised prompt runs on the accelerator as gpu does; Stencil has no parameter.
    assert [c for c in configurations.names(system=configurations.SANITIZE) if not get(c).uses_epsilon] == ["stencil"]
    assert {get(c).parameter_name for c in ("dx_noise", "dx_stencil", "custext_plus")} == {"eta", "epsilon"}
    assert not get("cpu").in_tee and get("tdx").in_tee and get("slalom").in_tee


def test_epsilon_rule():
    lengths = [4, 100]
    assert configurations.mask_epsilons("ep1", 2.0, lengths) == [2.0, 2.0]
    assert configurations.mask_epsilons("epn", 2.0, lengths) == [0.5, 0.1]  # the knob is ignored
    for name in ("cpu", "gpu", "tdx", "t3", "slalom"):
        assert configurations.mask_epsilons(name, 2.0, lengths) == [None, None]
        assert configurations.noise_factors(name, 2.0, lengths) == [0.0, 0.0]
    # σ = Δ·factor, factor = sigma_scale/ε.
    assert configurations.noise_factors("ep1", 2.0, lengths, sigma_scale=3.0) == [1.5, 1.5]
    assert configurations.noise_factors("epn", None, lengths) == pytest.approx([2.0, 10.0])
    assert configurations.exposure_epsilons("ep1", 2.0, lengths, sigma_scale=4.0) == [0.5, 0.5]
    assert configurations.exposure_epsilons("ep1", 2.0, lengths, sigma_scale=0.0) == [math.inf, math.inf]
    assert configurations.exposure_epsilons("t3", 2.0, lengths) == [None, None]
    assert configurations.effective_epsilon("ep1", 5) == 5.0
    assert configurations.effective_epsilon("epn", 5) is None


def test_bad_names_and_values_are_user_errors():
    with pytest.raises(UserError, match="unknown configuration 'ep2'"):
        configurations.get("ep2")
    # ε's positivity is the config validation's one check (tests/test_configs.py: "epsilon must be a finite number
    # > 0"); the registry asserts it, so a library caller passing an unchecked ε fails before any mask is drawn
    for bad in (None, 0.0, -1.0, math.nan):
        with pytest.raises(AssertionError, match="epsilon must be a positive number"):
            configurations.mask_epsilons("ep1", bad, [3])


# Spellings of the ε rule or of a configuration's kind that belong to the registry alone.
_RULE_COPIES = re.compile(r"""1(\.0)?\s*/\s*math\.sqrt|\*\*\s*-?0\.5|==\s*["']ep1["']|in\s*\(\s*["']ep1["']\s*,\s*["']epn["']""")


def test_no_copy_of_the_rule_outside_the_registry():
    offenders = []
    for folder in ("runners", "harness", "attacks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "configurations.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if _RULE_COPIES.search(line.split("#", 1)[0]):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_privacy_parameter_record():
    """results.json `privacy_parameter` (written by runners.common.finish): every configuration whose knob
    changes what it computes names its parameter and the unit of its value; the others record None."""
    record = configurations.privacy_parameter
    for name, entry in configurations.REGISTRY.items():
        assert set(record(name, 2.0)) == {"name", "value", "unit"}
        if entry.uses_epsilon:
            assert record(name, 2.0)["name"] == entry.parameter_name and record(name, 2.0)["value"] == 2.0, name
            assert record(name, 2.0)["unit"], name
        elif entry.parameter_name is None:
            assert record(name, 2.0) == {"name": None, "value": None, "unit": None}, name
    assert record("dx_noise", 150)["name"] == "eta" and record("coveil", 4)["name"] == "lambda"
    assert record("decoy_mitigated", 0.35) == {"name": "sigma", "value": 0.35,
                                               "unit": configurations.get("decoy_mitigated").parameter_unit}
    assert record("collab_invisibleink", 4, unit="ε-DP per token (pure)")["unit"] == "ε-DP per token (pure)"
    assert record(None, 1.0) == record("epn", 1.0) == {"name": None, "value": None, "unit": None}

"""runners.common.summary_head: the first line of every runner's terminal summary."""
from __future__ import annotations

from runners.common import summary_head


def _results(configuration: str, epsilon: float | None) -> dict:
    return {"experiment_name": "fidelity_smoke", "model": "tiny-llama", "configuration": configuration,
            "epsilon": epsilon}


def test_summary_head_names_the_parameter_as_the_configuration_does():
    assert summary_head(_results("ep1", 1.0), "3 prompts", "8 new tokens", against="cpu") == \
        "fidelity_smoke: tiny-llama · ep1 (ε=1) vs cpu · 3 prompts · 8 new tokens"
    assert summary_head(_results("privpair", 4.0), "2 clients") == "fidelity_smoke: tiny-llama · privpair (λ=4) · 2 clients"
    assert summary_head(_results("dx_noise", 150.0)) == "fidelity_smoke: tiny-llama · dx_noise (η=150)"
    # A configuration without a privacy parameter shows none, whatever ε the run was given.
    assert summary_head(_results("t3", 5.0), "1 prompts", model="a edge / b cloud") == \
        "fidelity_smoke: a edge / b cloud · t3 · 1 prompts"

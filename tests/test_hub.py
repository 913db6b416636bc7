"""harness/hub.py: the user's offline switch stands; otherwise one TCP probe decides, and an unreachable hub
switches the process (and the libraries already imported) to the local cache, once (issue 54, item 8). The
command-line cases, a hub model and `workload=dolly` with the hub unreachable ending in one line, are in
test_bad_input.py."""
from __future__ import annotations

import os
import socket

import pytest

from harness import hub


@pytest.fixture
def environ(monkeypatch) -> dict[str, str]:
    """A process environment of the test's own, without any offline switch or proxy."""
    env = {k: v for k, v in os.environ.items()
           if k not in (*hub.OFFLINE_SWITCHES, hub.PROBED, "HF_ENDPOINT") and "proxy" not in k.lower()}
    monkeypatch.setattr(os, "environ", env)
    return env


def test_the_users_switch_stands_and_nothing_is_probed(environ, monkeypatch):
    monkeypatch.setattr(hub, "unreachable", lambda *args: pytest.fail("probed"))
    environ["HF_HUB_OFFLINE"] = "1"
    assert hub.offline_reason() == "HF_HUB_OFFLINE=1 is set" and hub.unreachable_note() is None
    environ["HF_HUB_OFFLINE"] = "0"
    assert hub.offline_reason() is None


def test_an_unreachable_hub_switches_the_process_offline_once(environ, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    calls = []
    monkeypatch.setattr(hub, "unreachable", lambda *args: calls.append(1) or "hub:443 (refused)")
    assert hub.offline_reason() == "the Hugging Face hub is unreachable at hub:443 (refused)"
    assert environ["HF_HUB_OFFLINE"] == environ["HF_DATASETS_OFFLINE"] == "1"
    assert huggingface_hub.constants.HF_HUB_OFFLINE is True     # read once at import: set where it lives
    assert hub.offline_reason() == hub.unreachable_note() == "the Hugging Face hub is unreachable at hub:443 (refused)"
    assert calls == [1]


def test_the_probe_opens_one_connection_to_the_endpoint(environ):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        environ["HF_ENDPOINT"] = f"http://127.0.0.1:{port}"
        assert hub.offline_reason() is None and "HF_HUB_OFFLINE" not in environ   # reachable: nothing changes
    why = hub.unreachable()   # the port is closed now
    assert why is not None and why.startswith(f"http://127.0.0.1:{port} (ConnectionRefusedError")


def test_the_proxy_is_the_first_hop_unless_no_proxy_names_the_hub(environ):
    environ["HTTPS_PROXY"] = "http://proxy.example:3128"
    assert hub._target() == ("proxy.example", 3128, "the proxy http://proxy.example:3128")
    environ["NO_PROXY"] = "localhost,.huggingface.co"
    assert hub._target() == ("huggingface.co", 443, "https://huggingface.co")

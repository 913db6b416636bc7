"""Whether the Hugging Face hub can be reached: asked once per process, before the first hub download.

Without network, huggingface_hub retries each request five times with back-off: 12 lines of retries and
27-39 s before splitbench's one-line error. With HF_HUB_OFFLINE=1 it reads the local cache only and fails at
once. The rule (`offline_reason`, asked before every hub model, tokenizer and dataset load):

- HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE or HF_DATASETS_OFFLINE set (to anything): the user decided; nothing
  is probed or changed.
- Otherwise one TCP connection is opened to the hub's host (HF_ENDPOINT, default huggingface.co:443), or to
  the proxy that HTTPS_PROXY / ALL_PROXY names (then the hub is reached through it), within
  PROBE_TIMEOUT_S. If it opens, nothing changes: a machine with network downloads as before. If it does
  not (no route, no DNS, refused, timed out), this process sets HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1,
  so what is in the local cache still loads and anything else fails at once with its one line.

A TCP connection is what every download needs first; a hub that answers it but then fails is reported by
the library as before. An unreachable hub is remembered in SPLITBENCH_HUB_UNREACHABLE, so the process and
the sweep jobs it starts ask once; a reachable one is asked again at each load (a connection costs little).
"""
from __future__ import annotations

import os
import socket
import sys
from urllib.parse import urlsplit, urlunsplit

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 2.0
OFFLINE_SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
PROBED = "SPLITBENCH_HUB_UNREACHABLE"


def _target() -> tuple[str, int, str]:
    """(host, port, what) of the first hop to the hub: the proxy for its scheme where one is set, else the
    hub itself. `what` names it for the note."""
    hub = urlsplit(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    proxy = next((os.environ[k] for k in (f"{hub.scheme}_proxy", f"{hub.scheme.upper()}_PROXY", "all_proxy",
                                          "ALL_PROXY") if os.environ.get(k)), None)
    no_proxy = [h.strip().lstrip(".") for h in (os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or "").split(",")]
    if proxy and not any(h and (hub.hostname or "").endswith(h) for h in no_proxy):
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return url.hostname or "", url.port or 80, f"the proxy {urlunsplit((url.scheme, url.netloc, '', '', ''))}"
    return hub.hostname or "", hub.port or (443 if hub.scheme == "https" else 80), f"{hub.scheme}://{hub.netloc}"


def unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a TCP connection to the hub (or its proxy) opens within `timeout_s`, else why not."""
    host, port, what = _target()
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except OSError as exc:   # refused, no route, DNS failure, timeout: the hub cannot be reached now
        return f"{what} ({type(exc).__name__}: {exc})"


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def offline_reason() -> str | None:
    """None when this process may download from the hub; else why it works from the local cache only: the
    user's switch, or the hub unreachable (then this call switches the libraries offline, for this process
    and the sweep jobs it starts). The module docstring has the rule."""
    if os.environ.get(PROBED) and _true(os.environ.get("HF_HUB_OFFLINE")):   # switched by an earlier call
        return unreachable_note()
    for name in OFFLINE_SWITCHES:
        value = os.environ.get(name, "").strip()
        if value:
            return f"{name}={value} is set" if _true(value) else None
    why = unreachable()
    if why is None:
        return None
    os.environ.update({PROBED: why, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    # The libraries read these switches once, at import: set them where they were already imported.
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = datasets_config.HF_DATASETS_OFFLINE = True
    return unreachable_note()


def unreachable_note() -> str | None:
    """Why this process works offline when it switched itself (the probe failed), else None."""
    why = os.environ.get(PROBED)
    return f"the Hugging Face hub is unreachable at {why}" if why and _true(os.environ.get("HF_HUB_OFFLINE")) else None

"""Flower's deployment runtime: the same ClientApp and ServerApp as the simulation, as module-level objects
a Flower app names in its pyproject.toml (`[tool.flwr.app.components]`), configured by files.

    serverapp = "harness.splitft.deployment:serverapp"
    clientapp = "harness.splitft.deployment:clientapp"

Run config keys (`[tool.flwr.app.config]` or `flwr run ... --run-config`): `recipe`, the path of a recipe
written by harness.splitft.client.write_recipe (model entry, split section, the clients' blocks, D_align: every machine reads
the same file, and each SuperNode picks its blocks by its `--node-config "partition-id=I"`), and `sink`,
where the ServerApp saves what the server saw (the view's crossings, per-round metrics, the final A/C).
The steps to start a SuperLink and SuperNodes are in docs/splitft.md "Deployment runtime";
tests/splitft/test_splitft.py::test_deployment_runtime_on_loopback runs them on 127.0.0.1 (marked slow).
"""
from __future__ import annotations

from harness.splitft.federation import Sink, client_app, server_app

clientapp = client_app()
serverapp = server_app(None, Sink())

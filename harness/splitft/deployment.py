"""Flower's deployment runtime: the same ClientApp and ServerApp as the simulation, as module-level objects
a Flower app names in its pyproject.toml (`[tool.flwr.app.components]`), configured by files.

    serverapp = "harness.splitft.deployment:serverapp"
    clientapp = "harness.splitft.deployment:clientapp"

Run config keys (`[tool.flwr.app.config]` or `flwr run ... --run-config`): `recipe`, the path of a recipe
written by `write_recipe` (model entry, split section, the clients' blocks, D_align: every machine reads
the same file, and each SuperNode picks its blocks by its `--node-config "partition-id=I"`), and `sink`,
where the ServerApp saves what the server saw (the view's crossings, per-round metrics, the final A/C).
The steps to start a SuperLink and SuperNodes are in docs/splitft.md "Deployment runtime";
tests/test_splitft.py::test_deployment_runtime_on_loopback runs them on 127.0.0.1 (marked slow).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from harness.splitft.client import Recipe
from harness.splitft.federation import Sink, client_app, server_app


def write_recipe(recipe: Recipe, path: str | Path) -> None:
    torch.save(dataclasses.asdict(recipe), path)


def load_recipe(path: str | Path) -> Recipe:
    return Recipe(**torch.load(path, weights_only=False))


clientapp = client_app()
serverapp = server_app(None, Sink())

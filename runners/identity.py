"""A run's identity: the config keys its hash covers and the overrides its directory is named by.

Both are an allow-list, the keys its runner reads (runners/registry.py READS), with a system's own section
(sanitize, splitft, collab, grad_audit) counted only where the run's configuration belongs to that system.
A parameter the run never reads (another system's section, or a section added later) moves neither: the
config hash leaves it out (`keys`, which every runner's semantic_config passes to
harness.schema.semantic_config) and so does the directory name (the `sb.run_overrides` resolver of
conf/hydra/default.yaml); runners/run.py says so in one line on stderr (`unread_overrides`).

Importing this module registers the resolver (runners/run.py imports it before Hydra names a directory).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from harness import configurations, schema
from runners.registry import CROSS_SYSTEM, READS


def keys(cfg: DictConfig) -> tuple[str, ...]:
    """The top-level config keys the run's config hash covers."""
    found = identity_keys(str(cfg.runner), str(cfg.configuration.name))
    assert found is not None, f"runner {cfg.runner!r} has no entry in runners.registry.READS"
    return found


def identity_keys(runner: str, configuration: str) -> tuple[str, ...] | None:
    """What `runner` reads when it runs `configuration`: its READS, a system's section only for a
    configuration of that system. None for a runner or configuration validate will refuse (nothing is left
    out of the directory name then; the job stops at validation)."""
    entry = configurations.REGISTRY.get(configuration)
    if runner not in READS or entry is None:
        return None
    if runner in CROSS_SYSTEM:
        return READS[runner]
    # a section another system owns drops out (harness/systems.py: which entry declares each section)
    return tuple(k for k in READS[runner] if schema.SECTION_SYSTEMS.get(k, entry.system) == entry.system)


def _top_key(override: Override) -> str:
    """The top-level config key an override writes: `collab` for collab.alpha=0.5, `attack` for
    +model@attack.decoder=NAME (a group placed under a package), `workload` for workload=dolly."""
    target = override.package if override.package and not override.package.startswith("_") else override.key_or_group
    return re.split(r"[./]", target, maxsplit=1)[0]


def unread_overrides(overrides: Sequence[Any], exclude_keys: Sequence[Any], runner: str,
                     configuration: str) -> list[str]:
    """The command-line overrides (hydra.overrides.task) of keys the run does not read, as typed; labels
    (`exclude_keys`: experiment, tags, logger, paths, ...) are not among them."""
    return _named(overrides, exclude_keys, runner, configuration)[1]


def _named(overrides: Iterable[Any], exclude_keys: Iterable[Any], runner: str,
           configuration: str) -> tuple[list[str], list[str]]:
    """The overrides that name the run directory and those left out as not read (labels are neither)."""
    reads = identity_keys(runner, configuration)
    exclude = {str(k) for k in exclude_keys}
    named, unread = [], []
    for o in OverridesParser.create().parse_overrides([str(o) for o in overrides]):
        if o.key_or_group in exclude:
            continue
        (named if reads is None or _top_key(o) in reads else unread).append(o.input_line)
    return named, unread


def run_overrides_dirname(runner: Any, configuration: Any, overrides: Any, exclude_keys: Any) -> str:
    """The run directory's last component: Hydra's `override_dirname` (the overrides as typed, sorted, joined
    by `,`, without `exclude_keys`: hydra/_internal/config_loader_impl.py get_overrides_dirname) less the
    overrides of keys the run does not read, made safe by harness.schema.overrides_dirname. A run without
    such overrides keeps the name Hydra's own override_dirname gives it."""
    named, _ = _named(overrides or (), exclude_keys or (), str(runner), str(configuration))
    return schema.overrides_dirname(",".join(sorted(named)))


def configuration_dirname(runner: Any, configuration: Any, epsilon: Any) -> str:
    """The run directory's `<configuration>/<eps=ε | eps=na>` components. A cross-system runner
    (calibration) runs no configuration of the `configuration` group and reads no ε, so its runs sit under
    `<runner>/eps=na` instead of under whatever SpliTEE configuration and ε the defaults select."""
    if str(runner) in CROSS_SYSTEM:
        return f"{runner}/eps=na"
    return f"{configuration}/{schema.eps_dirname(configuration, epsilon)}"


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("sb.run_overrides", run_overrides_dirname, replace=True)
    OmegaConf.register_new_resolver("sb.configuration_dir", configuration_dirname, replace=True)


register_resolvers()

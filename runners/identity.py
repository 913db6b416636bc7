"""A run's identity: the config keys its hash covers and the overrides its directory is named by.

Both come from one allow-list, what its runner declares it reads (harness/systems.py Runner: READS, IGNORES,
READS_ONLY_FOR, UNHASHED in runners/registry.py), with a system's own section (sanitize, splitft, collab,
grad_audit) counted only where the run's configuration belongs to that system. A key is a top-level key or
a dotted path (`engine.sigma_scale`). A parameter the run never reads (another system's section, a part of
a section it does not read, or a section added later) moves neither: the config hash leaves it out
(`semantic_config`, which every runner's semantic_config calls) and so does the directory name (the
`sb.run_overrides` resolver of conf/hydra/default.yaml); runners/run.py says so in one line on stderr
(`unread_overrides`).

Importing this module registers the resolver (runners/run.py imports it before Hydra names a directory).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from harness import configurations, schema
from harness.errors import UserError
from runners.registry import CROSS_SYSTEM, IGNORES, READS, READS_ONLY_FOR, UNHASHED


@dataclass(frozen=True)
class Identity:
    """What one run reads: `reads` (top-level keys or dotted paths) less `ignores`; `unhashed` (path, value)
    pairs stay out of its hash at that value."""
    reads: tuple[str, ...]
    ignores: tuple[str, ...]
    unhashed: tuple[tuple[str, Any], ...]

    def covers(self, path: str) -> bool:
        """Whether writing `path` (an override's dotted key) can change what the run reads: it meets a read
        key (lies under it, or holds one) and lies under no ignored part."""
        return (any(_under(path, r) or _under(r, path) for r in self.reads)
                and not any(_under(path, i) for i in self.ignores))


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent + ".")


def semantic_config(cfg: DictConfig, **replace: Any) -> dict[str, Any]:
    """What the run's config hash covers: the keys it reads (harness.schema.semantic_config), `replace`
    applied (runners normalise ε)."""
    found = of(cfg)
    return schema.semantic_config(cfg, found.reads, ignore=found.ignores, unhashed=found.unhashed, **replace)


def keys(cfg: DictConfig) -> tuple[str, ...]:
    """The config keys (top-level or dotted) the run's config hash covers, before its ignored parts."""
    return of(cfg).reads


def of(cfg: DictConfig) -> Identity:
    found = identity_of(str(cfg.runner), str(cfg.configuration.name))
    assert found is not None, f"runner {cfg.runner!r} has no entry in runners.registry.READS"
    return found


def identity_of(runner: str, configuration: str) -> Identity | None:
    """What `runner` reads when it runs `configuration`: its READS (a system's section only for a
    configuration of that system) less its IGNORES and the parts READS_ONLY_FOR keeps for other
    configurations. None for a runner or configuration validate will refuse (nothing is left out of the
    directory name then; the job stops at validation)."""
    entry = configurations.REGISTRY.get(configuration)
    if runner not in READS or entry is None:
        return None
    reads = READS[runner]
    if runner not in CROSS_SYSTEM:
        # a section another system owns drops out (harness/systems.py: which entry declares each section)
        reads = tuple(k for k in reads if schema.SECTION_SYSTEMS.get(k.split(".")[0], entry.system) == entry.system)
    ignores = IGNORES[runner] + tuple(p for p, only in READS_ONLY_FOR[runner].items() if configuration not in only)
    return Identity(reads, ignores, UNHASHED[runner])


def _path(override: Override) -> str:
    """The dotted config key an override writes: `collab.alpha` for collab.alpha=0.5, `attack.decoder` for
    +model@attack.decoder=NAME (a group placed under a package), `workload` for workload=dolly."""
    target = override.package if override.package and not override.package.startswith("_") else override.key_or_group
    return re.sub(r"/", ".", target)


def unread_overrides(overrides: Sequence[Any], exclude_keys: Sequence[Any], runner: str,
                     configuration: str) -> list[str]:
    """The command-line overrides (hydra.overrides.task) of keys the run does not read, as typed; labels
    (`exclude_keys`: experiment, tags, logger, paths, ...) are not among them."""
    return _named(overrides, exclude_keys, runner, configuration)[1]


def _named(overrides: Iterable[Any], exclude_keys: Iterable[Any], runner: str,
           configuration: str) -> tuple[list[str], list[str]]:
    """The overrides that name the run directory and those left out as not read (labels are neither)."""
    found = identity_of(runner, configuration)
    exclude = {str(k) for k in exclude_keys}
    named, unread = [], []
    for o in OverridesParser.create().parse_overrides([str(o) for o in overrides]):
        # by the key it writes: `+model@attack.decoder=NAME` is the attack's decoder, not the excluded `model`
        if _path(o) in exclude:
            continue
        (named if found is None or found.covers(_path(o)) else unread).append(o.input_line)
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


def duplicated_override(overrides: Iterable[Any]) -> str | None:
    """One line naming the first config key (or group) the command line sets more than once, else None.

    Hydra takes the last of repeated overrides without a word (its maintainers keep that: hydra#3283), and its
    basic sweeper collapses repeated sweep keys (hydra#3106); only a group chosen twice in a defaults list is
    its error ("Multiple values for KEY"). A repeat on splitbench's command line is a slip (`experiment=smoke
    experiment=nope` ran the second, and both values of a repeated key named the run directory), so it is
    refused the way Hydra refuses the defaults-list repeat."""
    seen: dict[str, list[str]] = {}
    for o in OverridesParser.create().parse_overrides([str(o) for o in overrides]):
        target = o.key_or_group + (f"@{o.package}" if o.package else "")
        seen.setdefault(target, []).append(o.input_line)
    for target, given in seen.items():
        if len(given) > 1:
            return (f"multiple values for {target} on the command line ({' '.join(given)}): give it once "
                    f"(to sweep several values, one override with -m: {target}=A,B)")
    return None


def sweep_dirname(output_dir: Any, experiment_name: Any, overrides: Any) -> str:
    """hydra.sweep.dir, `<paths.output_dir>/<experiment_name>` (conf/hydra/default.yaml), after the checks that
    must come before Hydra writes there: Hydra resolves this first, then makes the folder (and a sweep's
    multirun.yaml), all before splitbench's own code runs. An empty paths.output_dir would put the runs at
    the filesystem root (`/smoke/...`), `experiment_name=../..` outside the output folder, and a repeated
    override (duplicated_override) would run what the user did not mean."""
    if output_dir is None or not str(output_dir).strip():
        raise UserError("paths.output_dir is empty: give the folder the results go under (default: outputs)")
    repeated = duplicated_override(overrides or ())
    if repeated:
        raise UserError(repeated)
    return f"{output_dir}/{schema.plain_dirname('experiment_name', experiment_name)}"


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("sb.sweep_dir", sweep_dirname, replace=True)
    OmegaConf.register_new_resolver("sb.run_overrides", run_overrides_dirname, replace=True)
    OmegaConf.register_new_resolver("sb.configuration_dir", configuration_dirname, replace=True)


register_resolvers()

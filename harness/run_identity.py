"""A run's identity: the config keys its hash covers and the overrides its directory is named by, in one place.

Both come from one allow-list, what its runner declares it reads in the systems registry (harness/systems.py
Runner: `reads`, `ignores`, `reads_only_for`, `unhashed`, `placements`; the tables below are built from it),
with a system's own section (sanitize, splitft, collab, grad_audit) counted only where the run's configuration
belongs to that system. A key is a top-level key or a dotted path (`engine.sigma_scale`). A parameter the run
never reads (another system's section, a part of a section it does not read, or a section added later) moves
neither: the config hash leaves it out (`semantic_config`, which every runner's semantic_config calls; the
hash itself is harness.results.config_hash) and so does the directory name (the `sb.*` resolvers of
conf/hydra/default.yaml); runners/run.py says so in one line on stderr (`unread_overrides`). Two older
spellings keep the hash of every run finished before them: HASHED_AS, and a placement on the CPU in float32.

Importing this module registers the `sb.*` resolvers (runners/run.py imports it before Hydra names a directory).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from harness import configurations, placement, systems
from harness.errors import UserError

# ---------------------------------------------------------------------------------------------------
# What each runner reads, from the systems registry
# ---------------------------------------------------------------------------------------------------

# The config keys each runner reads: its config hash covers these keys only and its run directory is named by
# overrides of these keys only. Labels (logger, paths, tags, experiment_name, rerun) are never among them.
READS: dict[str, tuple[str, ...]] = {r.name: r.reads for _, r in systems.runners()}
# What a runner's READS names that it does not read: always (IGNORES), or for the configurations a part is
# not read for (READS_ONLY_FOR: path → the configurations that read it). Neither enters its hash or directory.
IGNORES: dict[str, tuple[str, ...]] = {r.name: r.ignores for _, r in systems.runners()}
READS_ONLY_FOR: dict[str, dict[str, tuple[str, ...]]] = {r.name: dict(r.reads_only_for) for _, r in systems.runners()}
# (path, value) pairs left out of a runner's config hash at that value (harness/systems.py Runner.unhashed).
UNHASHED: dict[str, tuple[tuple[str, object], ...]] = {r.name: r.unhashed for _, r in systems.runners()}
# Runners that read several systems' sections whatever the configuration: their READS count whole.
CROSS_SYSTEM: tuple[str, ...] = tuple(r.name for s in systems.CROSS_SYSTEM for r in s.runners)
# The system each section belongs to (a cross-system entry's section: that entry's name).
SECTION_SYSTEMS: dict[str, str] = {section: system for section, (system, _) in systems.sections().items()}
# The placement nodes each runner reads (harness/placement.py); SpliTEE's runners read none (the engine places
# its parts itself), and fidelity runs a sanitiser's mechanism only, never its model placement.
RUNNER_PLACEMENTS: dict[str, tuple[str, ...]] = {r.name: r.placements for _, r in systems.runners() if r.placements}

# (path, value, hashed as): a value the config hash takes in under an older spelling. The engine moved from
# harness/split/ into harness/splitee/ (issue 30); every SpliTEE run finished before the move hashed
# `engine._target_` as the old module path, so the new path is hashed as that string and those runs keep
# their config hash (runners/run.py skips them as complete, not stale). results.json records the path as run.
HASHED_AS: tuple[tuple[str, Any, Any], ...] = (
    ("engine._target_", "harness.splitee.engine.EngineSettings", "harness.split.engine.EngineSettings"),
)


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
        reads = tuple(k for k in reads if SECTION_SYSTEMS.get(k.split(".")[0], entry.system) == entry.system)
    ignores = IGNORES[runner] + tuple(p for p, only in READS_ONLY_FOR[runner].items() if configuration not in only)
    return Identity(reads, ignores, UNHASHED[runner])


def of(cfg: DictConfig) -> Identity:
    found = identity_of(str(cfg.runner), str(cfg.configuration.name))
    assert found is not None, f"runner {cfg.runner!r} has no entry in READS (harness/systems.py)"
    return found


def keys(cfg: DictConfig) -> tuple[str, ...]:
    """The config keys (top-level or dotted) the run's config hash covers, before its ignored parts."""
    return of(cfg).reads


def placements(cfg: DictConfig) -> dict[str, DictConfig]:
    """The placement nodes this run's runner reads, by key (RUNNER_PLACEMENTS)."""
    return {key: OmegaConf.select(cfg, key) for key in RUNNER_PLACEMENTS.get(str(cfg.runner), ())}


# ---------------------------------------------------------------------------------------------------
# The config hash's input
# ---------------------------------------------------------------------------------------------------


def semantic_config(cfg: DictConfig, **replace: Any) -> dict[str, Any]:
    """What the run's config hash covers: the resolved config's keys the run reads (an allow-list; `engine.
    sigma_scale` keeps that part of `engine` only) less its ignored parts and its `unhashed` (path, value)
    pairs at their value, the HASHED_AS values under their older spelling, with `replace` applied (runners
    normalise ε). A key the run does not read, a section added later included, never enters."""
    found = of(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(resolved, dict)
    out: dict[str, Any] = {}
    for key in found.reads:
        *parents, leaf = key.split(".")
        source: Any = resolved
        for part in parents:
            source = source[part]
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = source[leaf]
    for key in found.ignores:
        _pop_path(out, key)
    for key, value in found.unhashed:
        if _get_path(out, key) == value:
            _pop_path(out, key)
    for key, value, hashed_as in HASHED_AS:
        *parents, leaf = key.split(".")
        node = _get_path(out, ".".join(parents)) if parents else out
        if isinstance(node, dict) and node.get(leaf) == value:
            node[leaf] = hashed_as
    out.update(replace)
    _drop_placements(out, set(RUNNER_PLACEMENTS.get(str(resolved.get("runner")), ())))
    return out


def _get_path(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _pop_path(tree: dict[str, Any], key: str) -> None:
    *parents, leaf = key.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def _drop_placements(semantic: dict[str, Any], read: set[str]) -> None:
    """Leave out of the hash a placement the runner never reads, and one on the CPU in float32
    (placement.CPU_FLOAT32): what every run computed before placements existed, so those finished runs keep
    their hash. Any other placement changes the numbers (another device's kernels, another precision) and
    stays in."""
    for runner_keys in RUNNER_PLACEMENTS.values():
        for key in runner_keys:
            *parents, leaf = key.split(".")
            node: Any = semantic
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and isinstance(node.get(leaf), dict) and (
                    key not in read or placement.record(node[leaf]) == placement.CPU_FLOAT32):
                del node[leaf]
            if (isinstance(node, dict) and parents and parents[-1] == "placement" and not node
                    and isinstance(semantic.get(parents[0]), dict)):
                semantic[parents[0]].pop("placement", None)


# ---------------------------------------------------------------------------------------------------
# The run directory's name (the sb.* resolvers of conf/hydra/default.yaml and conf/experiment/timing*.yaml)
# ---------------------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._,=+\-]")
_MAX_DIRNAME = 120
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def plain_dirname(key: Any, value: Any) -> str:
    """`value` as it is when it is one plain path component (letters, digits, '.', '_', '-', not starting with
    '.'), else a UserError: `experiment_name=../..` would put the runs outside paths.output_dir, and Hydra
    makes the directory from this name before any of splitbench's checks run."""
    text = str(value)
    if not _PLAIN_NAME.fullmatch(text) or len(text) > _MAX_DIRNAME:
        raise UserError(f"{key}={text!r} must be a plain name (letters, digits, '.', '_', '-'; it names a directory "
                        f"under paths.output_dir)")
    return text


def eps_dirname(configuration: Any, epsilon: Any) -> str:
    """`eps=<ε>` when the configuration uses ε (its registry entry says so), else `eps=na`, so an ε sweep
    over a configuration that ignores ε lands every job in one directory (and all but the first are
    skipped as complete). An unknown name gets `eps=na` here and is rejected by `validate` in one line."""
    entry = configurations.REGISTRY.get(str(configuration))
    return eps_label(epsilon) if entry is not None and entry.uses_epsilon else "eps=na"


def eps_label(epsilon: Any) -> str:
    """`eps=<ε>` with ε in its shortest form, so epsilon=1 and epsilon=1.0 name one directory."""
    return f"eps={float(epsilon):g}"


def overrides_dirname(override_dirname: Any, task_overrides: Any = ()) -> str:
    """The remaining semantic overrides as one safe path component ("default" when there are none).

    Characters that would nest or escape directories (`/`, spaces, ...) become `_`; names longer than
    120 characters keep a prefix and a short hash so distinct overrides never share a directory.
    `task_overrides` (hydra.overrides.task, the command line's overrides) adds a model chosen for another
    place (`+model@attack.decoder=NAME`, `model@collab.cloud=NAME`): Hydra leaves it out of override_dirname
    with the `model` group it belongs to, and its runs would share the default run's directory.
    """
    placed = sorted(str(o).lstrip("+~") for o in (task_overrides or ()) if str(o).lstrip("+~").startswith("model@"))
    text = ",".join(p for p in [str(override_dirname or ""), *placed] if p)
    if not text:
        return "default"
    safe = _UNSAFE.sub("_", text)
    if safe != text or len(safe) > _MAX_DIRNAME:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        safe = f"{safe[:_MAX_DIRNAME - 11]}-{digest}"
    return safe


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
    overrides of keys the run does not read, made safe by overrides_dirname. A run without such overrides
    keeps the name Hydra's own override_dirname gives it."""
    named, _ = _named(overrides or (), exclude_keys or (), str(runner), str(configuration))
    return overrides_dirname(",".join(sorted(named)))


def configuration_dirname(runner: Any, configuration: Any, epsilon: Any) -> str:
    """The run directory's `<configuration>/<eps=ε | eps=na>` components. A cross-system runner
    (calibration) runs no configuration of the `configuration` group and reads no ε, so its runs sit under
    `<runner>/eps=na` instead of under whatever SpliTEE configuration and ε the defaults select."""
    if str(runner) in CROSS_SYSTEM:
        return f"{runner}/eps=na"
    return f"{configuration}/{eps_dirname(configuration, epsilon)}"


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
    return f"{output_dir}/{plain_dirname('experiment_name', experiment_name)}"


def register_resolvers() -> None:
    for name, resolver in (("sb.eps_dir", eps_dirname), ("sb.eps", eps_label), ("sb.overrides_dir", overrides_dirname),
                           ("sb.plain", plain_dirname), ("sb.sweep_dir", sweep_dirname),
                           ("sb.run_overrides", run_overrides_dirname),
                           ("sb.configuration_dir", configuration_dirname)):
        OmegaConf.register_new_resolver(name, resolver, replace=True)


register_resolvers()

"""The systems registry: each system splitbench benchmarks, declared once (torch-free).

A system (SpliTEE's split inference, the token sanitisers, split fine-tuning, cloud-edge decoding, the
gradient audit) is one entry of SYSTEMS: its name (results.json `system`, adversary-view meta `system`), its
config section, its configurations, its runners with the config keys each one reads, its report sections,
its smoke experiments and its docs page. Everything that lists systems is built from these entries:

    harness/configurations.py     REGISTRY, SYSTEMS        (every configuration, by name)
    harness/schema.py             SYSTEM_SECTIONS, TOP_LEVEL: each system's keys in SplitbenchConfig
    harness/run_identity.py       READS, IGNORES, ..., RUNNER_PLACEMENTS: a run's config hash and directory
    runners/registry.py           RUNNERS, SYSTEMS
    runners/report/sections.py    SECTIONS                 (report.md's order: the entries' order)

A runner or report section is named by its module path (a string): harness never imports runners, and a
runner's module is imported only when a job runs it. CROSS_SYSTEM holds what runs across systems (the
calibration of every system's verdict against nulls): declared like a system, with no configurations of
its own. Adding a system: its folders (harness/NAME/, attacks/NAME/, runners/NAME.py, runners/report/NAME.py,
conf/NAME/, conf/experiment/NAME*.yaml, docs/NAME.md, tests/NAME/) and one entry in SYSTEMS
(tests/test_systems.py checks both). A system with several runners keeps them in runners/NAME/ and its
report sections in runners/report/NAME/ (SpliTEE: runners/splitee/, runners/report/splitee/).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Where the whole model (or, for split configurations, everything but the offloaded ops) runs.
HOST_CPU, ACCELERATOR, TEE = "host_cpu", "accelerator", "tee"
# How a privacy parameter becomes a per-row ε (the factor is then sigma_scale / ε):
CONSTANT = "constant"              # the `epsilon` knob itself, for every row (EP1)
INVERSE_SQRT_N = "inverse_sqrt_n"  # ε = 1/√n for a prompt of n tokens; no knob (EPN, paper §7.3.1)
# The knob is the mechanism's own privacy parameter, passed to it as it is (η of a dχ sanitiser, the ε of
# CusText+, a defence's strength); no Gaussian masks are derived from it here.
OWN_PARAMETER = "own_parameter"
# The unit of a dχ-privacy parameter η: the mechanism's guarantee scales with η·d(x, x').
DCHI = "dχ-privacy per unit of embedding distance"
# Systems (results.json `system`, adversary-view meta `system`).
SPLITEE, SANITIZE, SPLITFT, COLLAB, GRAD_AUDIT = "splitee", "sanitize", "splitft", "collab", "grad_audit"


@dataclass(frozen=True)
class Configuration:
    name: str
    runs_on: str                      # host_cpu | accelerator | tee; the other systems: clients | edge | local
    split: bool = False               # linear ops offloaded through the Boundary to the accelerator
    mechanism: str | None = None      # harness/splitee/mechanisms.py: plain | gaussian | slalom (split only)
    epsilon_rule: str | None = None   # CONSTANT | INVERSE_SQRT_N: Gaussian masks whose σ follows ε
    # The name the mechanism's own paper gives its privacy parameter, and what its value measures (results.json
    # `privacy_parameter`, beside `epsilon`: harness/configurations.py privacy_parameter).
    parameter_name: str | None = None
    parameter_unit: str | None = None
    system: str = SPLITEE

    @property
    def uses_epsilon(self) -> bool:
        """Whether the `epsilon` knob changes what this configuration computes."""
        return self.epsilon_rule in (CONSTANT, OWN_PARAMETER)

    @property
    def gaussian(self) -> bool:
        """Whether what crosses carries SpliTEE's Gaussian masks calibrated to an ε (EP1, EPN)."""
        return self.epsilon_rule in (CONSTANT, INVERSE_SQRT_N)

    @property
    def in_tee(self) -> bool:
        """Whether part of the computation runs inside the TEE (so the TEE kind is detected and recorded)."""
        return self.runs_on == TEE


@dataclass(frozen=True)
class Runner:
    """A runner (`cfg.runner`): its module (the contract in runners/registry.py) and the config keys it reads,
    its run's identity (harness/run_identity.py: only these enter its config hash and its directory's name).

    A key is a top-level key (`engine`: all of it) or a dotted path (`engine.sigma_scale`: that part only);
    `ignores` takes parts back out of what `reads` names, `reads_only_for` does so for the configurations it
    does not list, and `unhashed` leaves a key out of the hash at one value."""
    name: str
    module: str
    reads: tuple[str, ...]
    # Parts of what it reads that it never reads (the attack runner reads `attack` but not its sequential
    # attacker's `attack.sequential`).
    ignores: tuple[str, ...] = ()
    # (path, configurations): a part it reads only when it runs one of those configurations.
    reads_only_for: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # (path, value): at that value the key stays out of the config hash: what every run computed before the
    # key existed, so those finished runs keep their hash. Any other value goes in.
    unhashed: tuple[tuple[str, Any], ...] = ()
    # The other systems whose configurations it runs besides its own (fidelity runs the sanitisers too).
    also_runs: tuple[str, ...] = ()
    # The placement nodes it reads (harness/placement.py); SpliTEE's runners read none (the engine places its parts).
    placements: tuple[str, ...] = ()


@dataclass(frozen=True)
class System:
    name: str
    # Its config section (conf/SECTION/default.yaml) and the `module:Class` typing it; the module's
    # check(section, cfg) is called by harness.schema.validate. SpliTEE's keys predate sections: no section,
    # and its class's fields are top-level keys (top_level()).
    section: str | None
    schema: str | None
    configurations: tuple[Configuration, ...]
    runners: tuple[Runner, ...]
    report_sections: tuple[str, ...]   # runners/report modules, in report.md's order
    smoke: tuple[str, ...]             # conf/experiment/NAME.yaml, tagged smoke
    docs: str                          # its page under docs/
    # Its verdict's calibration against nulls (runner calibration): its entry, `module:function`
    # (attacks/NAME/calibration.py `entry`; the module also types and checks calibration.NAME), imported only
    # when a calibration runs, and the config keys that entry reads besides calibration.NAME (the calibration
    # runner reads them: they enter its hash). None: the system is not calibrated.
    calibration: str | None = None
    calibration_reads: tuple[str, ...] = ()


# The keys SpliTEE's inference runners share.
_SPLITEE_READS = ("runner", "seed", "model", "configuration", "epsilon", "workload", "generation", "engine",
                  "epn_n", "mask_seeds", "semantic_model")

SYSTEMS: tuple[System, ...] = (
    # SpliTEE (paper 000): split inference between a TEE and an untrusted accelerator.
    System(
        name=SPLITEE, section=None, schema="harness.splitee.config:SpliteeConfig",
        configurations=(
            Configuration("cpu", HOST_CPU),
            Configuration("gpu", ACCELERATOR),
            Configuration("tdx", TEE),
            Configuration("t3", TEE, split=True, mechanism="plain"),
            Configuration("ep1", TEE, split=True, mechanism="gaussian", epsilon_rule=CONSTANT,
                          parameter_name="epsilon", parameter_unit="ε-GDP per exposure"),
            Configuration("epn", TEE, split=True, mechanism="gaussian", epsilon_rule=INVERSE_SQRT_N),
            Configuration("slalom", TEE, split=True, mechanism="slalom"),
        ),
        runners=(
            # fidelity also runs the sanitisers (sanitised prompt, then the plain engine): `sanitize` counts
            # only for their configurations (harness/run_identity.py)
            # dp_delta: 1e-5 is what every run converted with before the key existed (unhashed)
            Runner("fidelity", "runners.splitee.fidelity", (*_SPLITEE_READS, "baseline", "sanitize", "dp_delta"),
                   also_runs=(SANITIZE,), unhashed=(("dp_delta", 1e-5), ("sanitize.attack.per_item_bound_pp", 100.0))),
            # timing times the configurations of its own section, not the `configuration` group
            Runner("timing", "runners.splitee.timing", ("runner", "seed", "model", "epsilon", "workload", "generation",
                                                "engine", "epn_n", "mask_seeds", "timing")),
            # of the engine, only what sizes its σ: the offloaded ops, the sensitivity rule and σ's scale
            Runner("fp_error", "runners.splitee.fp_error", ("runner", "seed", "model", "configuration", "epsilon",
                                                    "workload", "engine.offload", "engine.sensitivity_rule",
                                                    "engine.sigma_scale", "epn_n", "mask_seeds", "fp_error")),
            Runner("controlled_error", "runners.splitee.controlled_error", (*_SPLITEE_READS, "controlled_error")),
            # `attack.sequential` is the sequential attacker's; the learned attack's options never move it
            Runner("attack", "runners.splitee.attack", (*_SPLITEE_READS, "attack", "dp_delta"),
                   ignores=("attack.sequential",), unhashed=(("dp_delta", 1e-5), ("attack.controls.per_item_bound_pp", 100.0))),
            # map_reference: prior, prune_union_prior: null and pruning_rule: recall are what every run computed
            # before the keys existed (unhashed)
            Runner("sequential_attack", "runners.splitee.sequential_attack",
                   (*_SPLITEE_READS, "attack.sequential", "attack.controls"),
                   unhashed=(("attack.sequential.map_reference", "prior"),
                             ("attack.sequential.prune_union_prior", None),
                             ("attack.sequential.pruning_rule", "recall"),
                             ("attack.controls.per_item_bound_pp", 100.0))),
            # the privacy audit generates nothing: of the shared keys, the prompt, the engine's σ and ε's reading
            Runner("privacy_audit", "runners.splitee.privacy_audit",
                   ("runner", "seed", "model", "configuration", "epsilon", "workload", "engine", "epn_n",
                    "privacy_audit", "dp_delta")),
            # restore: the source attack run fixed the configuration, workload and generation
            Runner("restore", "runners.splitee.restore", ("runner", "seed", "model", "semantic_model", "restore")),
        ),
        report_sections=("runners.report.splitee.fidelity", "runners.report.splitee.timing",
                         "runners.report.splitee.fp_error", "runners.report.splitee.controlled_error",
                         "runners.report.splitee.attack", "runners.report.splitee.sequential_attack",
                         "runners.report.splitee.privacy_audit", "runners.report.splitee.restore"),
        smoke=("smoke", "timing_smoke", "fp_error_smoke", "controlled_error_smoke", "attack_smoke",
               "sequential_attack_smoke", "privacy_audit_smoke", "restore_smoke"),
        docs="docs/splitee.md",
        calibration="attacks.splitee.calibration:entry",
        # the sequential attacker's margin, recall threshold and MAP reference, and the engine's σ settings
        calibration_reads=("attack.controls", "attack.sequential.min_pruning_recall",
                           "attack.sequential.map_reference", "engine.sigma_scale", "engine.sensitivity_rule"),
    ),
    # Token-level prompt sanitisers (paper 001; harness/sanitize/). The prompt is sanitised on the client/TEE
    # side, then runs on the accelerator as `gpu` does; the name is the mechanism's
    # (harness/sanitize/mechanisms.py). Stencil is deterministic: no privacy parameter.
    System(
        name=SANITIZE, section="sanitize", schema="harness.sanitize.config:SanitizeConfig",
        configurations=(
            Configuration("stencil", ACCELERATOR, system=SANITIZE),
            Configuration("dx_noise", ACCELERATOR, epsilon_rule=OWN_PARAMETER, parameter_name="eta",
                          parameter_unit=DCHI, system=SANITIZE),
            Configuration("dx_stencil", ACCELERATOR, epsilon_rule=OWN_PARAMETER, parameter_name="eta",
                          parameter_unit=DCHI, system=SANITIZE),
            Configuration("custext_plus", ACCELERATOR, epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                          parameter_unit="ε-DP per token (exponential mechanism)", system=SANITIZE),
        ),
        runners=(
            Runner("sanitize", "runners.sanitize", ("runner", "seed", "model", "configuration", "epsilon",
                                                    "workload", "sanitize"), placements=("sanitize.placement",),
                   unhashed=(("sanitize.attack.per_item_bound_pp", 100.0),)),
        ),
        report_sections=("runners.report.sanitize",),
        smoke=("sanitize_smoke",),
        docs="docs/sanitize.md",
        calibration="attacks.sanitize.calibration:entry", calibration_reads=("sanitize.attack",),
    ),
    # Split federated fine-tuning and its defences (paper 002; harness/splitft/). The knob of each defence is
    # its own strength (harness/splitft/defences.py); splitft_central is the centralised (unsplit,
    # unfederated) fine-tuning reference, splitft_none split FL without a defence.
    System(
        name=SPLITFT, section="splitft", schema="harness.splitft.config:SplitFtConfig",
        configurations=(
            Configuration("splitft_central", "clients", system=SPLITFT),
            Configuration("splitft_none", "clients", system=SPLITFT),
            Configuration("privpair", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="lambda",
                          parameter_unit="coupling weight (no DP claim)", system=SPLITFT),
            Configuration("smashed_dp_gaussian", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                          parameter_unit="(ε, δ)-DP per token and exposure, δ = splitft.dp.delta", system=SPLITFT),
            Configuration("smashed_dp_laplace", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                          parameter_unit="ε-DP per token and exposure", system=SPLITFT),
            Configuration("embedding_dx", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="eta",
                          parameter_unit=DCHI, system=SPLITFT),
            Configuration("nopeek", "clients", epsilon_rule=OWN_PARAMETER, parameter_name="alpha",
                          parameter_unit="weight of the dCor loss (no DP claim)", system=SPLITFT),
        ),
        runners=(
            # `splitft.runtime: simulation` is what every run computed before the key existed; the split
            # deployment (other processes, the same numbers to float tolerance) enters the hash
            Runner("splitft", "runners.splitft", ("runner", "seed", "model", "configuration", "epsilon", "splitft"),
                   unhashed=(("splitft.runtime", "simulation"), ("splitft.attack.per_item_bound_pp", 100.0)),
                   placements=("splitft.placement",)),
        ),
        report_sections=("runners.report.splitft",),
        smoke=("splitft_smoke",),
        docs="docs/splitft.md",
        calibration="attacks.splitft.calibration:entry", calibration_reads=("splitft.attack",),
    ),
    # Cloud-edge collaborative decoding and its defences (paper 003; harness/collab/).
    System(
        name=COLLAB, section="collab", schema="harness.collab.config:CollabConfig",
        configurations=(
            Configuration("collab_none", "edge", system=COLLAB),
            Configuration("coveil", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="lambda",
                          parameter_unit="penalty weight of the privacy term (no DP claim)", system=COLLAB),
            Configuration("collab_cogenesis", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="B",
                          parameter_unit="probabilities uploaded per step (no DP claim)", system=COLLAB),
            Configuration("collab_dp_logit", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                          parameter_unit="(ε, δ)-DP per step, δ = collab.dp_delta", system=COLLAB),
            Configuration("collab_dp_fusion", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                          parameter_unit="Rényi divergence bound per step, order collab.renyi_order", system=COLLAB),
            Configuration("collab_custext", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                          parameter_unit="ε-DP per token (exponential mechanism)", system=COLLAB),
            Configuration("collab_ldp_sampler", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                          parameter_unit="ε-LDP per token", system=COLLAB),
            # Its unit follows collab.invisibleink.accounting (runners/collab.py): this one is `sequence`'s.
            Configuration("collab_invisibleink", "edge", epsilon_rule=OWN_PARAMETER, parameter_name="epsilon",
                          parameter_unit="(ε, δ)-DP per answer, δ = collab.dp_delta", system=COLLAB),
        ),
        runners=(
            Runner("collab", "runners.collab", ("runner", "seed", "model", "configuration", "epsilon",
                                                "semantic_model", "collab"),
                   placements=("collab.placement.edge", "collab.placement.cloud")),
        ),
        report_sections=("runners.report.collab",),
        smoke=("collab_smoke",),
        docs="docs/collab.md",
        calibration="attacks.collab.calibration:entry",
        calibration_reads=("collab.controls", "collab.alpha", "collab.renyi_order"),
    ),
    # The returned-gradient audit's trainer and its mitigation (paper 004; harness/grad_audit/).
    System(
        name=GRAD_AUDIT, section="grad_audit", schema="harness.grad_audit.config:GradAuditConfig",
        configurations=(
            # The trainer as audited: the returned gradient goes back as it is (exactly zero on the decoys).
            Configuration("decoy_trainer", "local", system=GRAD_AUDIT),
            # The mitigation: the returned gradient clipped per row and noised (grad_audit.mitigation, not ε).
            # Its σ is grad_audit.mitigation.noise_multiplier, not the `epsilon` knob (runners/grad_audit.py
            # records it).
            Configuration("decoy_mitigated", "local", parameter_name="sigma",
                          parameter_unit="noise std per unit of the row clip (no DP claim)", system=GRAD_AUDIT),
        ),
        runners=(
            # its seeds are grad_audit.seeds
            # the mitigation's settings only where it runs
            Runner("grad_audit", "runners.grad_audit", ("runner", "model", "configuration", "epsilon", "grad_audit"),
                   reads_only_for=(("grad_audit.mitigation", ("decoy_mitigated",)),),
                   unhashed=(("grad_audit.gates.per_item_bound_pp", 100.0),), placements=("grad_audit.placement",)),
        ),
        report_sections=("runners.report.grad_audit",),
        smoke=("grad_audit_smoke",),
        docs="docs/grad_audit.md",
        calibration="attacks.grad_audit.calibration:entry", calibration_reads=("grad_audit.gates",),
    ),
)

# Issue 51's per-item bounds (the earned interval's B) at 100 pp are what every run's verdict read before the
# keys existed: left out of the hash there, so committed runs keep their identity.
_BOUNDS_UNHASHED = tuple((key, 100.0) for key in ("sanitize.attack.per_item_bound_pp", "splitft.attack.per_item_bound_pp",
                                                  "grad_audit.gates.per_item_bound_pp",
                                                  "attack.controls.per_item_bound_pp"))

# What runs across systems, declared like a system with no configurations: its runner runs every system's
# configurations and reads every section it names whatever the configuration (harness/run_identity.py).
CROSS_SYSTEM: tuple[System, ...] = (
    # every system's verdict calibrated against nulls (issue 31; attacks/calibration.py): its own section and
    # what each system's calibration entry reads (its `calibration_reads`: its margins; SpliTEE's adds the
    # sequential attacker's recall threshold and MAP reference and the engine's σ settings)
    System(
        name="calibration", section="calibration",
        schema="harness.calibration_config:CalibrationConfig",
        configurations=(),
        runners=(
            Runner("calibration", "runners.calibration",
                   ("runner", "model", "calibration", *(k for s in SYSTEMS for k in s.calibration_reads)),
                   also_runs=tuple(s.name for s in SYSTEMS),
                   unhashed=(("attack.sequential.map_reference", "prior"), *_BOUNDS_UNHASHED)),
        ),
        report_sections=("runners.report.calibration",),
        smoke=("calibration_smoke",),
        docs="docs/design.md",
    ),
)

ENTRIES: tuple[System, ...] = SYSTEMS + CROSS_SYSTEM
NAMES: tuple[str, ...] = tuple(s.name for s in SYSTEMS)


def runs(system: System, runner: Runner) -> tuple[str, ...]:
    """The systems whose configurations `runner` (declared under `system`) runs: its own, then also_runs."""
    own = () if system in CROSS_SYSTEM else (system.name,)
    return tuple(dict.fromkeys((*own, *runner.also_runs)))


def runners() -> tuple[tuple[System, Runner], ...]:
    """Every runner with the entry that declares it, in the entries' order."""
    return tuple((s, r) for s in ENTRIES for r in s.runners)


def sections() -> dict[str, tuple[str, str]]:
    """Every config section an entry declares: section → (the entry's name, its `module:Class` schema)."""
    return {s.section: (s.name, s.schema) for s in ENTRIES if s.section is not None and s.schema is not None}


def top_level() -> dict[str, str]:
    """Every entry whose keys sit at the top level of the config (SpliTEE's): name → its `module:Class` schema."""
    return {s.name: s.schema for s in ENTRIES if s.section is None and s.schema is not None}

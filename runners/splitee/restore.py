"""Restore runner (paper §7.4.4, Table 7): do broken reconstructions hold more than their raw scores say?

One run restores the reconstructions of one finished attack run (`restore.source`) with the instruct model
`model` (harness/splitee/restoration.py) and scores the restored texts against the prompts with the attack's own
metrics (attacks/controls.py `score`), beside the raw reconstructions (attacks/splitee/restored.py):

- per attacker (`restore.attackers`: the learned inverter, the Bayes attacker): token P/R/F1, exact match,
  BLEU, ROUGE-L and semantic similarity, raw and restored, each with its 95% interval, and the paired
  change in token F1 over prompts;
- the restored text's own no-signal floor: the token F1 of restorations made for the *other* prompts
  (attacks/controls.exposure_free_f1), since a fluent restorer writes generic words that match any prompt
  a little; the restored verdict is classified against that floor with the source's controls;
- `verdict`: the worst of the source attack's verdict and the restored ones.

The run records the source's configuration and ε (a restored reconstruction is another attacker of the
same configuration) and its half of the privacy–utility point.

    splitbench experiment=restore restore.source=outputs/attack/smollm2-135m/t3/eps=na/<overrides>
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attacks.splitee.restored import HEADLINE
from harness import run_identity
from harness.errors import UserError
from harness.results import DONE, RESULTS, SAMPLES, RunContext, read_json, read_jsonl
from runners import common


def semantic_config(cfg: DictConfig) -> dict[str, Any]:
    """The restoration model and section, and the source run's own config hash (a source recomputed with
    different settings makes its restoration stale); nothing of the configuration or generation groups,
    which the source fixed."""
    source = Path(str(cfg.restore.source)) if cfg.restore.source else None
    source_hash = None
    if source is not None and (source / RESULTS).is_file():
        try:
            recorded = read_json(source / RESULTS)
            source_hash = recorded.get("config_hash") if isinstance(recorded, dict) else None  # else: read_source
        except (OSError, ValueError):
            source_hash = None
    return run_identity.semantic_config(cfg, source_config_hash=source_hash)


def describe_skip(cfg: DictConfig) -> str | None:
    return None


def read_source(path: Path | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The finished attack run's results and samples, or one line saying why they cannot be restored."""
    if path is None:
        raise UserError("restore.source is required: a finished attack run directory "
                        """('restore.source="PATH"', quoted when PATH contains '=')""")
    if not (path / RESULTS).is_file():
        raise UserError(f"restore.source={path}: no {RESULTS} there (give a finished attack run's directory)")
    try:
        results = read_json(path / RESULTS)
        if not isinstance(results, dict):
            raise UserError(f"restore.source={path}: its {RESULTS} is not a JSON object (not a splitbench run's)")
        samples = read_jsonl(path / SAMPLES)
    except (OSError, ValueError) as exc:
        raise UserError(f"restore.source={path}: cannot read the run ({type(exc).__name__}: {exc})") from None
    if results.get("experiment") != "attack":
        raise UserError(f"restore.source={path} is a {results.get('experiment')!r} run, not an attack run")
    if results.get("status") != "ok" or not (path / DONE).is_file():
        raise UserError(f"restore.source={path} did not finish (status {results.get('status')!r}, no {DONE})")
    if len(samples) < 2:
        raise UserError(f"restore.source={path} has {len(samples)} samples; restoring needs at least 2 prompts")
    return results, samples


def run(cfg: DictConfig, ctx: RunContext) -> dict[str, Any]:
    from attacks.splitee.restored import restore_attackers
    from harness.models import load_model

    source = Path(str(cfg.restore.source)) if cfg.restore.source else None
    src, src_samples = read_source(source)
    recorded = (src.get("provenance") or {}).get("config") or {}
    victim_cfg = recorded.get("model")
    if victim_cfg is None:
        raise UserError(f"restore.source={source}: its results.json records no model config (provenance.config.model)")
    restorer = load_model(cfg.model, cache_dir=cfg.paths.cache_dir)
    victim = restorer if victim_cfg.get("name") == restorer.name else load_model(victim_cfg, cache_dir=cfg.paths.cache_dir)
    tok = victim.tokenizer
    recorded_controls = recorded.get("attack", {}).get("controls", {})
    margin = float(recorded_controls.get("gate_margin_pp", cfg.attack.controls.gate_margin_pp))
    # the source run's B where it recorded one (runs from before issue 51 did not: this run's then)
    bound = float(recorded_controls.get("per_item_bound_pp", cfg.attack.controls.per_item_bound_pp))
    src_m = src.get("metrics") or {}
    restored = restore_attackers(restorer, tok, src_samples, cfg.restore, common.load_semantic(cfg), margin, src_m,
                                 per_item_bound_pp=bound)
    per_attacker = restored.attackers
    if not per_attacker:
        raise UserError(f"restore.source={source}: none of restore.attackers={list(cfg.restore.attackers)} "
                        "has reconstructions in that run")
    samples = restored.samples(src_samples, lambda ids: tok.decode(list(ids), skip_special_tokens=True))
    results = {
        # the victim's model: the point belongs to its configuration
        **common.results_header(cfg, "restore", model=src.get("model"), workload=src.get("workload"),
                                n_prompts=len(src_samples), generation=False),
        "restoration_model": restorer.name,
        "restoration_model_source": restorer.source,
        "configuration": src.get("configuration"),
        "epsilon": src.get("epsilon"),
        "privacy_parameter": src.get("privacy_parameter"),   # None (older runs): derived by common.finish
        "attack": {k: (src.get("attack") or {}).get(k) for k in ("setting", "component", "layer")},
        "source": {"run_dir": str(source), "config_hash": src.get("config_hash"),
                   "commit": ((src.get("provenance") or {}).get("code") or {}).get("commit")},
        "restore": OmegaConf.to_container(cfg.restore, resolve=True),
        "attackers": per_attacker,
        "metrics": restored.metrics(src_m.get("verdict")),
        "notes": restored.notes,
    }
    best = max(per_attacker, key=lambda a: per_attacker[a]["restored"]["token_f1"])
    r = per_attacker[best]["restored"]
    results["tradeoff"] = common.tradeoff(
        leakage_metric="token_f1", leakage=r["token_f1"], leakage_ci=(r.get("token_f1_ci_lo"), r.get("token_f1_ci_hi")),
        attacker=f"{best} reconstruction restored by {restorer.name}",
        leakage_floor=per_attacker[best]["restored_floor_token_f1"])
    return common.finish(cfg, ctx, results, samples, summary=summary)


def summary(results: dict[str, Any]) -> str:
    a = results["attack"]
    lines = [common.summary_head(results, str(a.get("setting")), f"{a.get('component')} layer {a.get('layer')}",
                                 f"restored by {results['restoration_model']}", f"{results['n_prompts']} prompts"),
             f"  {'attacker / metric':<32}{'raw':>8}{'restored':>10}"]
    for name, v in results["attackers"].items():
        for k in HEADLINE:
            if v["raw"].get(k) is not None:
                lines.append(f"  {name + ' ' + k:<32}{v['raw'][k]:>8.2f}{v['restored'][k]:>10.2f}")
        lines.append(f"  {name} token F1 change {v['delta_token_f1']:+.2f} [{v['delta_token_f1_ci_lo']:+.2f}, "
                     f"{v['delta_token_f1_ci_hi']:+.2f}]; restored floor {v['restored_floor_token_f1']:.2f}; "
                     f"restored verdict {v['restored_verdict']}")
    lines.append(f"  verdict: {results['metrics']['verdict']} (source {results['metrics']['source_verdict']})")
    lines += [f"  note: {n}" for n in results.get("notes", [])]
    return "\n".join(lines)

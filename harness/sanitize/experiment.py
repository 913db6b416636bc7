"""One token-sanitiser run's utility and record, as library calls the runner composes (the attacks are
attacks/sanitize/suite.py): the tasks' examples, lm-eval's accuracy on their sanitised inputs beside the
unsanitised model's (cached), each task's constant-answer floor and skill, the chart's utility, and the
samples of the sanitised prompts."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.sanitize import tasks


@dataclass
class TaskDocs:
    """The examples of each task of `sanitize.tasks` and where they came from."""

    docs: dict[str, list[dict[str, Any]]]
    sources: dict[str, str]

    def record(self) -> dict[str, dict[str, Any]]:
        """results.json `tasks`."""
        return {name: {"n_examples": len(d), "source": self.sources[name]} for name, d in self.docs.items()}


@dataclass
class Utility:
    """What sanitising the tasks' inputs cost in accuracy."""

    scored: dict[str, Any]    # per task, lm-eval on the sanitised inputs (tasks.Scored: per-example acc, samples)
    metrics: dict[str, Any]   # accuracy per task and pooled, sanitised and not, floors and skill (results `metrics`)
    value: Any                # the privacy–utility chart's utility (metrics.proportions Proportion)
    reference: str            # which tasks it pools


def load_tasks(section: Any, seed: int) -> TaskDocs:
    loaded = {name: tasks.load_docs_with_source(name, section.task_paths[name], section.task_limit, seed)
              for name in section.tasks}
    return TaskDocs({name: d for name, (d, _) in loaded.items()}, {name: s for name, (_, s) in loaded.items()})


def utility(sanitize: Any, section: Any, loaded: Any, task_docs: TaskDocs, seed: int, cache_dir: str) -> Utility:
    """lm-eval zero-shot accuracy on each task with its inputs sanitised by `sanitize` (seeded by `seed`),
    beside the same model on the unsanitised inputs, each with its Wilson 95% interval; each task's
    constant-answer floor and whether the unsanitised model clears it (skill)."""
    from metrics.proportions import proportion_ci

    docs, tokenizer = task_docs.docs, loaded.tokenizer
    noisy_docs = {name: tasks.sanitize_docs(d, name, sanitize, tokenizer, seed) for name, d in docs.items()}
    scored = tasks.accuracy(loaded.model, tokenizer, noisy_docs, int(section.eval_batch_size))
    clean = unsanitized_accuracy(loaded, docs, int(section.eval_batch_size), cache_dir)
    metrics: dict[str, Any] = {}
    skilled = []   # the tasks on which the unsanitised model beats the constant answer (labels are not sanitised)
    for name in docs:
        metrics.update(proportion_ci(scored[name].acc).flat(f"accuracy_{name}"))
        reference = proportion_ci(clean[name])
        metrics.update(reference.flat(f"accuracy_unsanitized_{name}"))
        metrics[f"accuracy_floor_{name}"] = floor = scored[name].constant_floor
        metrics[f"accuracy_skill_{name}"] = skill = reference.lo is not None and reference.lo > floor
        if skill:
            skilled.append(name)
    pooled = proportion_ci([a for name in docs for a in scored[name].acc])
    metrics.update(pooled.flat("accuracy"))
    metrics.update(proportion_ci([a for name in docs for a in clean[name]]).flat("accuracy_unsanitized"))
    # The chart's utility: pooled over the tasks with skill only, where any has it (a task at its constant floor
    # would pull every sanitiser towards the same number and hide the cost); the reference says which.
    if skilled:
        value = proportion_ci([a for name in skilled for a in scored[name].acc])
        metrics.update(value.flat("accuracy_skilled"))
        reference_tasks = f"tasks above their constant-answer floor: {', '.join(skilled)}"
    else:
        value, reference_tasks = pooled, "no task above its constant-answer floor: this accuracy cannot show a cost"
    return Utility(scored, metrics, value, reference_tasks)


def unsanitized_accuracy(loaded: Any, docs: dict[str, list], batch_size: int, cache_dir: str) -> dict[str, list[float]]:
    """The unsanitised reference accuracy, the same for every sanitiser run of a model and task set: cached
    under cache_dir, keyed by the model, the examples themselves, lm-eval's version and the code."""
    from importlib.metadata import version

    from harness import provenance
    from harness.results import GenerationCache, cache_key

    key = cache_key({"kind": "sanitize_unsanitized_accuracy", "model": {"name": loaded.name, "source": loaded.source},
                     "docs": docs, "lm_eval": version("lm_eval"), "batch_size": batch_size,
                     "code": provenance.source_digest()})
    cache = GenerationCache(cache_dir)
    hit = cache.get(key)
    if hit is not None:
        return hit["accuracy"]
    acc = {name: scored.acc for name, scored in tasks.accuracy(loaded.model, loaded.tokenizer, docs,
                                                                batch_size).items()}
    cache.put(key, {"accuracy": acc})
    return acc


def samples(prompts: Sequence[Any], sanitized: Any, attacks: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """samples.jsonl: per prompt, its sanitised text and ids, the share of text tokens left unchanged, and
    each attacker's scores and guesses (attacks: attacks/sanitize/suite.py SuiteResult)."""
    texts = sanitized.text_ids()
    return [{"id": p.id, "prompt": p.text, "sanitized_text": tokenizer.decode(texts[i]),
             "text_span": list(sanitized.spans[i]), "original_text_ids": sanitized.original_text_ids[i],
             "output_ids": sanitized.input_ids[i],
             "unchanged_rate": 100.0 * sum(a == b for a, b in zip(sanitized.original_text_ids[i], texts[i]))
             / max(1, len(texts[i])),
             **{f"{s.name}_{key}": value for s in attacks.scores for key, value in s.rows[i].items()},
             **{f"{name}_guess_ids": g[i] for name, g in attacks.guesses.items()}}
            for i, p in enumerate(prompts)]

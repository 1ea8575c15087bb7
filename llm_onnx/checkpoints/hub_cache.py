"""What the local Hugging Face cache holds (no network, ever): where the cache is, which snapshot
a revision names, and whether that snapshot holds everything an export reads.

The cache is found as huggingface_hub finds it, but from the environment as it is now (its
``constants`` are read once, when it is imported): ``HF_HUB_CACHE``, else the older
``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``, else
``~/.cache/huggingface/hub``. Its layout::

    models--org--name/refs/main              the commit a branch or tag names
    models--org--name/snapshots/<commit>/... the files of that commit (links into blobs/)
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath

COMMIT = re.compile(r"^[0-9a-f]{40}$")
ST_MODULES = "modules.json"  # a sentence-transformers folder: the model may sit in a subfolder


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub would compute it now."""
    def expand(path: str) -> str:
        return os.path.expandvars(os.path.expanduser(path))

    home = expand(os.getenv("HF_HOME", os.path.join(
        os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")),
        "huggingface")))
    return Path(expand(os.getenv("HF_HUB_CACHE",
                                 os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))))


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is 1/ON/YES/TRUE, as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return value is not None and value.upper() in {"1", "ON", "YES", "TRUE"}


def repo_folder(repo_id: str, cache: Path | None = None) -> Path:
    return (cache or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot(repo_id: str, revision: str = "main", cache: Path | None = None) -> Path | None:
    """The snapshot folder of ``repo_id`` at ``revision`` (a branch, a tag or a commit), or None
    when the cache has no such snapshot."""
    repo = repo_folder(repo_id, cache)
    if COMMIT.fullmatch(revision):
        commit = revision
    else:
        ref = repo / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text(encoding="utf-8").strip()
    snapshot = repo / "snapshots" / commit
    return snapshot if commit and snapshot.is_dir() else None


def write_ref(repo_id: str, revision: str, commit: str, cache: Path | None = None) -> None:
    """Record that ``revision`` names ``commit``, as huggingface_hub does (refs/<revision>)."""
    if COMMIT.fullmatch(revision) or revision == commit:
        return
    ref = repo_folder(repo_id, cache) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.is_file() or ref.read_text(encoding="utf-8") != commit:
        ref.write_text(commit, encoding="utf-8")


def module_folders(modules: object) -> tuple[str, list[str]]:
    """From a sentence-transformers modules.json: the folder of its Transformer module ("" for
    the root) and the folders of every module, as repository paths."""
    entries = [m for m in modules if isinstance(m, dict)] if isinstance(modules, list) else []
    folders, transformer = [], ""
    for m in entries:
        sub = m.get("path") or ""
        if not isinstance(sub, str) or ".." in PurePosixPath(sub).parts or sub.startswith("/"):
            continue
        sub = str(PurePosixPath(sub)) if sub else ""
        folders.append(sub)
        if str(m.get("type", "")).rsplit(".", 1)[-1] == "Transformer" and not transformer:
            transformer = sub
    return transformer, folders


def index_shards(index_file: Path) -> list[str] | None:
    """The shard names a model.safetensors.index.json lists, or None when it cannot be read."""
    try:
        data = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        return None
    return sorted({str(v) for v in weight_map.values()})


def complete_checkpoint(snapshot: Path) -> bool:
    """Whether ``snapshot`` holds a whole safetensors checkpoint: config.json and every weight
    file (the index's shards, or model.safetensors), in the folder a sentence-transformers
    modules.json names, else the root. Tokenizer files are downloaded before the weights, so a
    snapshot whose weights are all there has them too (when the repository has them)."""
    folder = snapshot
    if (snapshot / ST_MODULES).is_file():
        try:
            modules = json.loads((snapshot / ST_MODULES).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return False
        folder = snapshot / module_folders(modules)[0]
    if not (folder / "config.json").is_file():
        return False
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = index_shards(index)
        return bool(shards) and all((folder / s).is_file() for s in shards)
    return (folder / "model.safetensors").is_file()


"""The exported model folders a user has, for `llm-onnx models`: those in llm-onnx's cache (where
the default model is exported on first use) and those in ./models (where `llm-onnx export` writes
by default). Only a folder holding an llm-onnx manifest is listed or ever removed.
"""

from __future__ import annotations

import difflib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from llm_onnx.default_model import cache_root
from llm_onnx.errors import ModelFolderError
from llm_onnx.model_folder import FORMAT, MANIFEST


@dataclass(frozen=True)
class StoredModel:
    name: str  # the folder's name
    folder: Path
    family: str  # the Hugging Face architecture (Qwen3ForCausalLM)
    precision: str
    bytes: int
    created: str  # ISO 8601, from the manifest
    task: str = "generate"


def model_roots() -> list[Path]:
    """Where exported folders are looked for: llm-onnx's cache, then ./models."""
    return [cache_root() / "models", Path("models")]


def read_stored(folder: Path) -> StoredModel | None:
    """``folder`` as a listed model, or None when it holds no llm-onnx manifest (of any format
    version: an old folder is listed too, so that it can be removed)."""
    manifest = folder / MANIFEST
    if not folder.is_dir() or not manifest.is_file() or manifest.is_symlink():
        return None
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None

    def field(section: str, key: str) -> str:
        value = data.get(section)
        return str(value.get(key, "?")) if isinstance(value, dict) else "?"

    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.is_symlink())
    return StoredModel(folder.name, folder, field("config", "architecture"),
                       field("precision", "precision"), size, str(data.get("created", "")),
                       str(data.get("task", "generate")))


def list_models(roots: list[Path] | None = None) -> list[StoredModel]:
    """Every model folder directly inside ``roots`` (default: model_roots()), by root then name."""
    found = []
    for root in model_roots() if roots is None else roots:
        if not root.is_dir():
            continue
        for folder in sorted(root.iterdir(), key=lambda p: p.name):
            if not folder.name.startswith("."):  # an export's scratch folder, a lock
                model = read_stored(folder)
                if model is not None:
                    found.append(model)
    return found


def find_model(name: str, roots: list[Path] | None = None) -> StoredModel:
    """The model folder ``name`` names: a folder name from the list, or a path to a model
    folder. ModelFolderError when none or several match."""
    path = Path(name).expanduser()
    if ("/" in name or name in (".", "..")) and path.exists():
        model = read_stored(path)
        if model is None:
            raise ModelFolderError(f"{name}: not a model folder made by `llm-onnx export` (no "
                                   f"llm-onnx {MANIFEST}); `llm-onnx models rm` removes only "
                                   "those.")
        return model
    models = list_models(roots)
    hits = [m for m in models if m.name == name]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise ModelFolderError(f"{name} is in {len(hits)} places ("
                               + ", ".join(str(m.folder) for m in hits)
                               + "); give the folder's path instead.")
    close = difflib.get_close_matches(name, [m.name for m in models], n=3)
    where = ", ".join(str(r) for r in (model_roots() if roots is None else roots))
    raise ModelFolderError(f"No model folder named {name} in {where}"
                           + (f". Did you mean {', '.join(close)}?" if close else
                              "; `llm-onnx models` lists them."))


def remove_model(model: StoredModel) -> None:
    """Delete a model folder, only if it is one (an llm-onnx manifest, and nothing its
    manifest does not list: the rule `export --force` follows)."""
    from llm_onnx.export.folder import unreplaceable

    folder = model.folder
    if folder.is_symlink() or read_stored(folder) is None:
        raise ModelFolderError(f"{folder}: not a model folder made by `llm-onnx export`; "
                               "nothing removed.")
    reason = unreplaceable(folder)
    if reason:
        raise ModelFolderError(f"{folder}: {reason}; nothing removed (delete it yourself if you "
                               "mean to).")
    shutil.rmtree(folder)

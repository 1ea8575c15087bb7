"""manifest.json: the contract between the exporter and the runtime.

A model folder holds prefill.onnx, decode.onnx, weights.data (shared by both graphs), tokenizer
files and this manifest, which records the model config, precision, graph I/O, KV-cache layout,
tokenizer and generation defaults, the export's parity report, the sha256 of every file and the
tool versions. The runtime reads only this; it refuses a folder whose format version it does not
know, whose files are missing, or whose checksums do not match.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_onnx.errors import ModelFolderError

FORMAT = "llm-onnx-model"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PREFILL, DECODE, WEIGHTS = "prefill.onnx", "decode.onnx", "weights.data"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Manifest:
    folder: Path
    data: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        return self.data["config"]

    @property
    def num_layers(self) -> int:
        return int(self.data["kv_cache"]["num_layers"])

    @property
    def context_length(self) -> int:
        return int(self.data["context_length"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    def path(self, graph: str) -> Path:
        return self.folder / self.data["graphs"][graph]["file"]

    @property
    def tokenizer(self) -> dict[str, Any]:
        return self.data["tokenizer"]

    @property
    def kv_dtype(self) -> str:
        return self.data["kv_cache"]["dtype"]


def _fail(folder: Path, what: str) -> ModelFolderError:
    return ModelFolderError(f"{folder}: {what}")


def load_manifest(folder: Path, verify: bool = True) -> Manifest:
    """Read and check a model folder's manifest.

    Args:
        folder: the model folder.
        verify: check every listed file's sha256 (sizes are always checked).
    """
    folder = Path(folder)
    file = folder / MANIFEST
    if not folder.is_dir():
        raise _fail(folder, "no such model folder (export one with `llm-onnx export`).")
    if not file.is_file():
        raise _fail(folder, f"no {MANIFEST}; this is not a model folder made by `llm-onnx export`.")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(folder, f"{MANIFEST} is not valid JSON ({e}).") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _fail(folder, f"{MANIFEST} is not an llm-onnx manifest.")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise _fail(folder, f"{MANIFEST} has format_version {version!r}; this llm-onnx reads "
                            f"version {FORMAT_VERSION}. Re-export the model with this version.")
    for key in ("config", "graphs", "kv_cache", "tokenizer", "files", "context_length"):
        if key not in data:
            raise _fail(folder, f"{MANIFEST} lacks the '{key}' section.")
    files = data["files"]
    for name, info in files.items():
        path = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts or "/" in name or "\\" in name:
            raise _fail(folder, f"{MANIFEST} lists file {name!r} outside the model folder.")
        if not path.is_file():
            raise _fail(folder, f"file {name} listed in {MANIFEST} is missing.")
        if not path.resolve().is_relative_to(folder.resolve()):
            raise _fail(folder, f"{name} is a link to {path.resolve()}, outside the model folder; "
                                "refusing to load it.")
        size = path.stat().st_size
        if size != info["bytes"]:
            raise _fail(folder, f"{name} has {size} bytes, {MANIFEST} says {info['bytes']} "
                                "(truncated or modified; re-export the model).")
        if verify and _cached_sha256(path) != info["sha256"]:
            raise _fail(folder, f"{name} does not match its sha256 in {MANIFEST} "
                                "(corrupt or modified; re-export the model).")
    for graph in (PREFILL, DECODE, WEIGHTS):
        if graph not in files:
            raise _fail(folder, f"{MANIFEST} does not list {graph}.")
    return Manifest(folder, data)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llm-onnx"


def _cached_sha256(path: Path) -> str:
    """sha256 of a file, remembered by (path, size, mtime, inode) so that loading a multi-GB model
    a second time does not re-read it. The cache is advisory: when it cannot be written, hashing
    simply happens every time."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    store = _cache_dir() / "verified.json"
    try:
        known = json.loads(store.read_text()) if store.is_file() else {}
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    digest = sha256_file(path)
    if st.st_size >= 64 << 20:  # only worth remembering for big files
        known[key] = digest
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            tmp = store.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, store)
        except OSError:
            pass
    return digest

"""Find a vendor's checkpoint in the local Hugging Face cache (no network, ever)."""

from __future__ import annotations

import os
from pathlib import Path


def hub_cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def find_cached_checkpoint(repo_id: str) -> Path | None:
    """The snapshot folder of ``repo_id`` (refs/main, else the newest) holding config.json and
    safetensors, or None."""
    folder_name = "models--" + repo_id.replace("/", "--")
    for cache in hub_cache_dirs():
        repo = cache / folder_name
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = repo / "refs" / "main"
        candidates = []
        if ref.is_file():
            candidates.append(snapshots / ref.read_text().strip())
        candidates += sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        for snap in candidates:
            if (snap / "config.json").is_file() and (
                    (snap / "model.safetensors").is_file()
                    or (snap / "model.safetensors.index.json").is_file()):
                return snap
    return None

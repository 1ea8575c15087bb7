"""Turning the export command's options into a Checkpoint."""

from __future__ import annotations

from pathlib import Path

from llm_onnx.build_model.load import Checkpoint, open_checkpoint, random_checkpoint
from llm_onnx.errors import ConfigError
from llm_onnx.export.hub_cache import find_cached_checkpoint, hub_cache_dirs
from llm_onnx.models import HF_REPOS, get_config


def resolve_checkpoint(config_name: str | None, checkpoint: Path | None, random_weights: bool,
                       seed: int = 0) -> Checkpoint:
    """--checkpoint PATH | --config NAME --random-weights | --config NAME (local HF cache)."""
    if checkpoint is not None and config_name is not None:
        raise ConfigError("Give either --checkpoint PATH or --config NAME, not both.")
    if checkpoint is not None:
        if random_weights:
            raise ConfigError("--random-weights goes with --config NAME, not --checkpoint.")
        return open_checkpoint(checkpoint)
    if config_name is None:
        raise ConfigError("Say what to export: --checkpoint PATH (Hugging Face folder or .gguf) "
                          "or --config NAME.")
    cfg = get_config(config_name)
    if random_weights:
        return random_checkpoint(cfg, config_name, seed)
    repo = HF_REPOS.get(config_name)
    found = find_cached_checkpoint(repo) if repo else None
    if found is None:
        where = ", ".join(str(d) for d in hub_cache_dirs())
        raise ConfigError(
            f"No local weights for {config_name}"
            + (f" ({repo} is not in the Hugging Face cache: {where})" if repo else "")
            + ". Pass --checkpoint PATH, or --random-weights for random weights of its shape.")
    ckpt = open_checkpoint(found)
    ckpt.name = config_name
    return ckpt

"""How an embedding model turns hidden states into one vector, read from its checkpoint's files.

The rule, first match wins:

1. A sentence-transformers folder (``modules.json``): its pipeline. The Pooling module's
   ``config.json`` gives the pooling (``pooling_mode_lasttoken`` -> "last",
   ``pooling_mode_mean_tokens`` -> "mean", ``pooling_mode_cls_token`` -> "cls"; newer releases
   write ``"pooling_mode": "lasttoken"``), a Normalize module after it L2-normalises, and
   ``sentence_bert_config.json``'s ``max_seq_length`` bounds the context. A module llm-onnx
   does not compute (Dense, LayerNorm, ...) or another pooling mode is refused, naming it.
2. A GGUF file with ``<arch>.pooling_type`` (llama.cpp's: mean, cls, last): that pooling,
   L2-normalised as llama.cpp normalises embeddings.
3. The bare model's weights (``Qwen3Model``: no LM head, no ``model.`` prefix, or config.json
   naming a ``...Model`` class) without those files: the last token, L2-normalised
   (Qwen3-Embedding's own recipe).
4. Anything else (a causal LM used as an embedder): the mean over the tokens, not normalised
   (what sentence-transformers adds to a plain model before its version 6, which picks the last
   token for a ``...ForCausalLM`` class). ``--pooling`` and ``--normalize`` choose otherwise.

Pure Python.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_onnx.errors import CheckpointError

MODULES = "modules.json"
# sentence-transformers' pooling modes -> ours (model_folder.POOLINGS)
ST_POOLINGS = {"lasttoken": "last", "mean": "mean", "cls": "cls"}
# its legacy config keys, in the order it concatenates them
ST_LEGACY_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                  "pooling_mode_mean_tokens": "mean",
                  "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                  "pooling_mode_weightedmean_tokens": "weightedmean",
                  "pooling_mode_lasttoken": "lasttoken"}
# modules of a pipeline llm-onnx computes (Dropout does nothing at inference)
ST_MODULES = ("Transformer", "Pooling", "Normalize", "Dropout")
GGUF_POOLINGS = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's LLAMA_POOLING_TYPE_*


@dataclass(frozen=True)
class PoolingRule:
    pooling: str  # "last" | "mean" | "cls"
    normalize: bool
    rule: str  # where it was read from, in words (the manifest's EmbeddingSpec.rule)
    max_seq_length: int | None = None  # sentence-transformers' bound on the input


def _read(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: cannot read it as JSON ({e}).") from None


def _modules(root: Path) -> list[dict] | None:
    """modules.json's entries, or None for a folder without one."""
    file = root / MODULES
    if not file.is_file():
        return None
    modules = _read(file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{file}: expected a list of modules ({{\"path\", \"type\"}}).")
    return modules


def _kind(module: dict) -> str:
    """A module's class name: the last part of its ``type`` (the import path changed in v6)."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _inside(root: Path, module: dict) -> Path:
    sub = module.get("path") or ""
    if not isinstance(sub, str):
        raise CheckpointError(f"{root / MODULES}: module path {sub!r} is not a string.")
    folder = (root / sub).resolve()
    if not folder.is_relative_to(root.resolve()):
        raise CheckpointError(f"{root / MODULES}: module path {sub!r} leaves the folder.")
    return root / sub if sub else root


def transformer_folder(root: Path) -> Path:
    """Where a checkpoint's config.json and weights are: a sentence-transformers folder's
    Transformer module (its own folder, or a subfolder such as 0_Transformer), else ``root``."""
    modules = _modules(root) if root.is_dir() else None
    found = [m for m in modules or [] if _kind(m) == "Transformer"]
    return _inside(root, found[0]) if found else root


def _pooling_mode(file: Path) -> tuple[str, dict]:
    """The one pooling mode of a Pooling module's config.json, and the config."""
    config = _read(file)
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: expected a JSON object.")
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in ST_LEGACY_KEYS.items() if config.get(key) is True] or \
            ["mean"]  # sentence-transformers' default
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1 or modes[0] not in ST_POOLINGS:
        raise CheckpointError(f"{file}: pooling {' + '.join(map(str, modes))} is not supported; "
                              "llm-onnx pools one of lasttoken, mean, cls "
                              "(pooling_mode_lasttoken, pooling_mode_mean_tokens, "
                              "pooling_mode_cls_token).")
    return modes[0], config


def _sentence_transformers(root: Path, modules: list[dict], width: int) -> PoolingRule:
    unknown = [m for m in modules if _kind(m) not in ST_MODULES]
    if unknown:
        raise CheckpointError(f"{root / MODULES}: module {unknown[0].get('type')} "
                              f"({unknown[0].get('path')}) is not supported; llm-onnx exports "
                              "Transformer -> Pooling (-> Normalize) pipelines.")
    kinds = [_kind(m) for m in modules]
    if "Pooling" not in kinds or "Transformer" not in kinds:
        raise CheckpointError(f"{root / MODULES}: a sentence embedding pipeline needs a "
                              "Transformer and a Pooling module.")
    pooling = modules[kinds.index("Pooling")]
    folder = _inside(root, pooling)
    mode, config = _pooling_mode(folder / "config.json")
    dims = config.get("word_embedding_dimension") or config.get("embedding_dimension")
    if isinstance(dims, int) and dims != width:
        raise CheckpointError(f"{folder / 'config.json'}: the pooling takes {dims} dimensions "
                              f"but the model's hidden states have {width}.")
    normalize = "Normalize" in kinds[kinds.index("Pooling"):]
    bound = None
    st_config = _inside(root, modules[kinds.index("Transformer")]) / "sentence_bert_config.json"
    if st_config.is_file():
        data = _read(st_config)
        if isinstance(data, dict) and data.get("do_lower_case") is True:
            raise CheckpointError(f"{st_config}: do_lower_case true (the text lowercased before "
                                  "tokenizing) is not supported.")
        if isinstance(data, dict) and isinstance(data.get("max_seq_length"), int):
            bound = data["max_seq_length"]
    where = pooling.get("path") or "."
    return PoolingRule(ST_POOLINGS[mode], normalize,
                       f"sentence-transformers: {where}/config.json pools {mode}"
                       + (", then Normalize" if normalize else ", not normalised"), bound)


def pooling_rule(path: Path | None, bare: bool, width: int,
                 gguf_pooling: str | None = None) -> PoolingRule:
    """The pooling of the checkpoint at ``path`` (see the module docstring); ``bare``: it holds
    the bare model's weights; ``width``: its hidden states' size; ``gguf_pooling``: a GGUF
    file's own pooling type."""
    if path is not None and path.is_dir():
        modules = _modules(path)
        if modules is not None:
            return _sentence_transformers(path, modules, width)
    if gguf_pooling is not None:
        return PoolingRule(gguf_pooling, True, f"the GGUF file's pooling_type ({gguf_pooling}), "
                                               "L2-normalised as llama.cpp does")
    if bare:
        return PoolingRule("last", True, "the bare model's weights without sentence-transformers "
                                         "files: the last token, L2-normalised")
    return PoolingRule("mean", False, "a causal LM without sentence-transformers files: the mean "
                                      "over the tokens, not normalised")

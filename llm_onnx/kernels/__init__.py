"""llm-onnx's own ONNX Runtime operators: a C++ library (``src/``), optional.

ONNX Runtime lets a model bring operators its CPU op set lacks, as a custom-operator library
registered on the session options. Ours holds ``RoutedExperts`` (domain ``llm_onnx``): a
mixture of experts' chosen experts on block-quantized weights (docs/kernels.md). It is built on
request, never by ``pip install``, into the user's cache folder:

    python -m llm_onnx.kernels build         (needs ONNX Runtime's headers, CMake, a C++ compiler)

keyed by the onnxruntime version and a hash of the sources, so an upgrade of either builds a
fresh copy beside the old. Without it everything runs on ONNX Runtime's own operators; a model
folder exported with our kernels says so in its manifest and refuses to load without them.

This module imports neither torch nor onnxruntime at import time (the runtime imports it).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from pathlib import Path

from llm_onnx.errors import KernelsError, ModelFolderError

__all__ = ["KernelsError", "available", "library_path", "register", "require"]

DOMAIN = "llm_onnx"
# The operators' format, as the library reports it (llm_onnx_kernels_ops_version): a folder's
# graphs need a library of this version.
OPS_VERSION = "1"
SOURCES = Path(__file__).parent / "src"
# A library to use instead of the cached build (a path; tests and packagers set it).
LIBRARY_ENV = "LLM_ONNX_KERNELS_LIBRARY"
# Forces one instruction-set path of the kernels (auto, avx512vnni, avxvnni, avx2, portable);
# read when a session creates the kernels.
ISA_ENV = "LLM_ONNX_KERNELS_ISA"
BUILD_HINT = ("build them with `python -m llm_onnx.kernels build` (needs ONNX Runtime's headers, "
              "CMake and a C++ compiler: docs/kernels.md)")


def cache_root() -> Path:
    """llm-onnx's cache folder (default_model.cache_root's, which this module does not import:
    the runtime imports it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llm-onnx"


def library_name() -> str:
    if sys.platform == "win32":
        return "llm_onnx_kernels.dll"
    return "libllm_onnx_kernels.dylib" if sys.platform == "darwin" else "libllm_onnx_kernels.so"


def source_hash() -> str:
    """A hash of the library's sources (names and bytes), 16 hex digits."""
    h = hashlib.sha256()
    for path in sorted(SOURCES.iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def onnxruntime_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def build_dir() -> Path:
    """Where ``build`` puts the library for this onnxruntime and these sources."""
    return cache_root() / "kernels" / f"ort{onnxruntime_version()}-{source_hash()}"


def library_path() -> Path | None:
    """The library to load: $LLM_ONNX_KERNELS_LIBRARY when set, else the cached build for this
    onnxruntime and these sources; None when there is none."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return Path(override) if Path(override).is_file() else None
    path = build_dir() / library_name()
    return path if path.is_file() else None


def available() -> bool:
    return library_path() is not None


def require() -> Path:
    """The library's path, or KernelsError saying how to get it."""
    path = library_path()
    if path is None:
        where = os.environ.get(LIBRARY_ENV) or str(build_dir())
        raise KernelsError(f"llm-onnx's kernel library is not built (looked for {where}); "
                           f"{BUILD_HINT}")
    return path


def register(session_options) -> Path:
    """Register the library on an onnxruntime.SessionOptions; returns its path."""
    path = require()
    session_options.register_custom_ops_library(str(path))
    return path


def register_for_folder(session_options, ops_version_needed: str, ops: tuple[str, ...],
                        folder: Path | None) -> None:
    """Register the library for a model folder whose manifest lists our operators, or raise
    ModelFolderError (one line) saying how to build it or re-export without it."""
    path = library_path()
    where = f"{folder}: " if folder is not None else ""
    if path is None:
        raise ModelFolderError(f"{where}exported with llm-onnx's kernels ({', '.join(ops)}), "
                               f"whose library is not built here; {BUILD_HINT}, or re-export "
                               f"the folder with --kernels ort.")
    have = ops_version(path)
    if have != ops_version_needed:
        raise ModelFolderError(f"{where}needs llm-onnx's kernels at operator version "
                               f"{ops_version_needed}, the library at {path} has {have}; "
                               f"rebuild it with this llm-onnx (python -m llm_onnx.kernels build "
                               f"--force) or re-export the folder.")
    session_options.register_custom_ops_library(str(path))


def _query(path: Path, symbol: str) -> str:
    lib = ctypes.CDLL(str(path))
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_char_p
    return fn().decode()


def supported_isas(path: Path | None = None) -> list[str]:
    """The instruction-set paths the library has and this CPU runs, best first."""
    return _query(path or require(), "llm_onnx_kernels_isas").split(",")


def ops_version(path: Path | None = None) -> str:
    return _query(path or require(), "llm_onnx_kernels_ops_version")


def created(isa: str, path: Path | None = None) -> int:
    """How many kernels this process created with the instruction-set path ``isa`` (-1 for a
    path the library does not have): tests check that forcing a path takes it."""
    lib = ctypes.CDLL(str(path or require()))
    lib.llm_onnx_kernels_created.restype = ctypes.c_long
    lib.llm_onnx_kernels_created.argtypes = [ctypes.c_char_p]
    return int(lib.llm_onnx_kernels_created(isa.encode()))

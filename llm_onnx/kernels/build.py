"""Building the kernel library with CMake, into the cache folder ``build_dir()`` names.

The build is a command of its own (``python -m llm_onnx.kernels build``), not part of
``pip install``: the install must succeed on a machine without ONNX Runtime's headers or a
compiler, and the library is tied to the onnxruntime installed beside it, which pip may upgrade
after the package was built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from llm_onnx.errors import KernelsError
from llm_onnx.kernels import SOURCES, build_dir, cache_root, library_name, onnxruntime_version

HEADER = "onnxruntime_cxx_api.h"
FETCH_SCRIPT = Path(__file__).parent / "fetch_headers.sh"


def header_candidates() -> list[Path]:
    """Where ONNX Runtime's headers are looked for, in order: $ORT_INCLUDE_DIR, the folder
    fetch_headers.sh fills, conda's prefix, the system's include folders."""
    found = []
    if os.environ.get("ORT_INCLUDE_DIR"):
        found.append(Path(os.environ["ORT_INCLUDE_DIR"]))
    found.append(cache_root() / "ort-headers" / "usr" / "include" / "onnxruntime")
    if os.environ.get("CONDA_PREFIX"):
        found.append(Path(os.environ["CONDA_PREFIX"]) / "include" / "onnxruntime")
    found += [Path(p) / "onnxruntime" for p in ("/usr/include", "/usr/local/include",
                                                "/opt/homebrew/include")]
    return found


def find_headers(include_dir: Path | None = None) -> Path | None:
    for folder in [include_dir] if include_dir else header_candidates():
        for sub in (folder, folder / "core" / "session"):  # (source trees nest them)
            if (sub / HEADER).is_file():
                return sub
    return None


def header_api_version(include_dir: Path) -> int:
    text = (include_dir / "onnxruntime_c_api.h").read_text(encoding="utf-8", errors="replace")
    match = re.search(r"#define\s+ORT_API_VERSION\s+(\d+)", text)
    if match is None:
        raise KernelsError(f"{include_dir}/onnxruntime_c_api.h has no ORT_API_VERSION")
    return int(match.group(1))


def build(force: bool = False, include_dir: Path | None = None, verbose: bool = False) -> Path:
    """Build the library (unless this onnxruntime and these sources have one already, or
    ``force``) and return its path."""
    out = build_dir() / library_name()
    if out.is_file() and not force:
        return out
    cmake = shutil.which("cmake")
    if cmake is None:
        raise KernelsError("building llm-onnx's kernels needs CMake (3.18 or newer) and a C++17 "
                           "compiler: apt-get install cmake g++, brew install cmake, or "
                           "pip install cmake")
    headers = find_headers(include_dir)
    if headers is None:
        looked = ", ".join(str(p) for p in ([include_dir] if include_dir else header_candidates()))
        raise KernelsError(f"ONNX Runtime's headers ({HEADER}) not found (looked in {looked}); "
                           f"set ORT_INCLUDE_DIR, install libonnxruntime-dev (Debian 13, Ubuntu) "
                           f"or onnxruntime (Homebrew, conda-forge), or on Debian 12 run "
                           f"{FETCH_SCRIPT}")
    runtime = onnxruntime_version()
    api = header_api_version(headers)
    runtime_api = int(runtime.split(".")[1])
    if api > runtime_api:
        raise KernelsError(f"the headers in {headers} are of ONNX Runtime API {api}, newer than "
                           f"the installed onnxruntime {runtime} (API {runtime_api}); use headers "
                           f"of 1.{runtime_api} or older")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llm-onnx-kernels-") as tmp:
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        steps = [[cmake, "-S", str(SOURCES), "-B", tmp, *generator, "-DCMAKE_BUILD_TYPE=Release",
                  f"-DORT_INCLUDE_DIR={headers}"],
                 [cmake, "--build", tmp, "--config", "Release"]]
        for step in steps:
            done = subprocess.run(step, capture_output=not verbose, text=True)
            if done.returncode != 0:
                tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-20:])
                raise KernelsError(f"building llm-onnx's kernels failed ({' '.join(step[:3])} "
                                   f"...):\n{tail}")
        built = next((p for p in Path(tmp).rglob(library_name())), None)
        if built is None:
            raise KernelsError(f"the kernel build finished without {library_name()} in {tmp}")
        staged = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # (two builds may race)
        shutil.copy2(built, staged)
        os.replace(staged, out)  # atomic: a concurrent reader sees the old file or the new
    return out

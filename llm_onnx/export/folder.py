"""The output folder, written atomically: a scratch folder beside ``--out`` renamed at the end,
removed on any failure, Ctrl-C or SIGTERM, an existing ``--out`` kept until the new one is
complete."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llm_onnx.errors import ExportError


def check_output(out: Path, force: bool, checkpoint_path: Path | None) -> None:
    out = Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out} already exists; pass --force to replace it (the old folder is "
                          "kept until the new one is complete).")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder.")
    if checkpoint_path is not None:
        src = checkpoint_path if checkpoint_path.is_dir() else checkpoint_path.parent
        try:
            out.resolve().relative_to(src.resolve())
            inside = checkpoint_path.is_dir()
        except ValueError:
            inside = False
        if inside:
            raise ExportError(f"--out {out} is inside the checkpoint folder {src}; choose a folder "
                              "outside it.")


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """A scratch folder that becomes ``out`` when the block completes, and disappears if it
    does not (any exception, Ctrl-C, SIGTERM). A full disk or another OSError is reported as one
    line naming the folder or the file that could not be read."""
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        with _interrupts_as_exceptions():
            yield scratch
            _replace_folder(scratch, out)
    except OSError as e:  # disk full, read-only file system, permissions: one line, no leftovers
        shutil.rmtree(scratch, ignore_errors=True)
        if e.filename and not str(e.filename).startswith(str(scratch)):
            raise ExportError(f"{e.filename}: cannot read ({e.strerror or e}).") from e
        raise ExportError(f"{out}: cannot write the model folder ({e.strerror or e}); "
                          "free disk space or choose another --out.") from e
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


@contextmanager
def _interrupts_as_exceptions() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C, so the scratch folder is removed either way."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _replace_folder(scratch: Path, out: Path) -> None:
    """Rename scratch -> out; an existing out is moved aside first and removed only afterwards."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        try:
            os.replace(scratch, out)
        except BaseException:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(scratch, out)


def release_memory(collect: bool = True) -> None:
    """Hand freed heap back to the OS between stages and layers (glibc keeps it otherwise);
    ``collect``: run Python's cycle collector first (tens of ms with torch loaded)."""
    import ctypes
    import gc

    if collect:
        gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class HeapTrim:
    """Hands freed heap back (``release_memory`` without the cycle collector) each time at least
    ``every`` bytes of weights have gone through since the last time: after every layer or two of
    a large model, almost never for a small one. glibc keeps freed blocks of up to 32 MiB as heap,
    so an export's resident memory otherwise grows with the layers (Qwen3.6-35B-A3B: 9.1 GiB in
    the calibration, 4.8 GiB writing weights; 3.0 GiB with trims). A trim costs little itself,
    but the pages it gives back are faulted in again by the next allocations, and a collection
    over every live object costs 0.15 s and more in a long-lived process (a test session, a
    server): neither is worth it for a small model."""

    def __init__(self, every: int = 64 << 20) -> None:
        self.every, self.pending = every, 0

    def __call__(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= self.every:
            self.pending = 0
            release_memory(collect=False)

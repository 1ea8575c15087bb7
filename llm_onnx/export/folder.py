"""The output folder, written atomically: a scratch folder beside ``--out`` renamed at the end,
removed on any failure, Ctrl-C or SIGTERM, an existing ``--out`` kept until the new one is
complete."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llm_onnx.errors import ExportError
from llm_onnx.model_folder import FORMAT, MANIFEST


def check_output(out: Path, force: bool, checkpoint_path: Path | None = None) -> None:
    """Refuse an ``--out`` the export may not write, before anything is read: one that exists
    without ``force``; with ``force``, anything but an empty folder or a model folder made by
    ``llm-onnx export`` (a manifest, and no file it does not list), the working directory or a
    folder above it, a symbolic link, a folder inside the checkpoint's own."""
    out = Path(out)
    if out.is_symlink():
        raise ExportError(f"--out {out} is a symbolic link (to {os.readlink(out)}); give a real "
                          "folder (the link itself would be replaced, not what it points to).")
    if out.exists():
        if not out.is_dir():
            raise ExportError(f"--out {out} exists and is not a folder; choose another --out.")
        if not force:
            raise ExportError(f"{out} already exists; pass --force to replace it (the old folder "
                              "is kept until the new one is complete).")
        reason = unreplaceable(out)
        if reason:
            raise ExportError(f"--out {out}: {reason}; --force replaces only a model folder made "
                              "by `llm-onnx export` or an empty folder. Choose another --out.")
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


def unreplaceable(folder: Path) -> str | None:
    """Why ``folder`` (an existing folder) must not be replaced by an export, or None when it may:
    it is empty, or it is a model folder whose every entry its manifest lists (so nothing of the
    user's is inside)."""
    here = Path.cwd().resolve()
    target = folder.resolve()
    if here == target or target in here.parents:
        return "it is the working directory or holds it"
    if target == Path.home().resolve() or target.parent == target:
        return "it is a home or root folder"
    entries = sorted(p.name for p in folder.iterdir())
    if not entries:
        return None
    manifest = folder / MANIFEST
    listed = _manifest_files(manifest) if manifest.is_file() and not manifest.is_symlink() else None
    if listed is None:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        return f"it is not a model folder made by `llm-onnx export` (it holds {shown})"
    others = [name for name in entries if name != MANIFEST and name not in listed]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return f"it is a model folder, but also holds {shown}, which its {MANIFEST} does not list"
    return None


def _manifest_files(manifest: Path) -> set[str] | None:
    """The file names an llm-onnx manifest lists (of any format version), or None when the file
    is not one."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    files = data.get("files")
    return {str(name) for name in files} if isinstance(files, dict) else set()


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
    """Rename scratch -> out; an existing out is moved aside first and removed only afterwards,
    and only if it may still be replaced (something may have been put there while the export
    ran)."""
    if out.exists() or out.is_symlink():
        reason = "it is a symbolic link" if out.is_symlink() else unreplaceable(out)
        if reason:
            raise ExportError(f"--out {out} changed while the export ran: {reason}; it is left "
                              "as it is and the export discarded. Choose another --out.")
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

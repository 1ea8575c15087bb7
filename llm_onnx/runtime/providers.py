"""Execution providers: which one runs, decided by what really comes up, not by what is listed.

onnxruntime-gpu lists CUDAExecutionProvider even on a machine without a GPU or CUDA libraries, and
when asked for it silently falls back to CPU after logging two lines. So the only reliable check
is to create a session with CUDA and look at ``session.get_providers()``; the probe below does that
once per process on a 71-byte Identity model, with ORT's own logging silenced.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Iterator

import onnxruntime as ort

from llm_onnx.errors import ProviderError

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
PROVIDER_CHOICES = ("auto", "cpu", "cuda")

# Identity(x: float[1]) -> y, opset 13: the smallest model a session can be created for.
_PROBE_MODEL = base64.b64decode(
    "CAcSADo7ChAKAXgSAXkiCElkZW50aXR5EgVwcm9iZVoPCgF4EgoKCAgBEgQKAggBYg8KAXkSCgoICAESBAoC"
    "CAFCBAoAEA0=")


def quiet_session_options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 3  # errors only: no "falling back to CPU" warnings
    return so


@functools.lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """(usable, reason). Usable means a CUDA session really comes up in this process."""
    if os.environ.get("LLM_ONNX_DISABLE_CUDA"):
        return False, "disabled by LLM_ONNX_DISABLE_CUDA"
    if CUDA not in ort.get_available_providers():
        return False, "this onnxruntime build has no CUDA execution provider"
    with _captured_stderr() as captured:
        try:
            session = ort.InferenceSession(_PROBE_MODEL, quiet_session_options(),
                                           providers=[CUDA, CPU])
            up = CUDA in session.get_providers()
        except Exception as e:  # ORT raises its own Fail/RuntimeException types
            return False, f"creating a CUDA session failed ({_first_line(str(e))})"
    if up:
        return True, "CUDA session created"
    return False, f"the CUDA session fell back to CPU ({_why(captured())})"


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0][:200] if text else "no message"


def _why(log: str) -> str:
    """The useful part of ORT's log, e.g. 'libcublasLt.so.13: cannot open shared object file'."""
    for line in log.splitlines():
        if "error:" in line:
            return line.rsplit("error:", 1)[1].strip()[:200]
    return "no GPU or CUDA libraries found"


@contextlib.contextmanager
def _captured_stderr() -> Iterator[Callable[[], str]]:
    """ORT logs the fallback from C++ straight to file descriptor 2: capture it there."""
    text = ""

    def read() -> str:
        return text

    try:
        saved = os.dup(2)
    except OSError:  # no usable stderr (embedded interpreter): nothing to hide
        yield read
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield read
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")


def resolve_provider(requested: str) -> str:
    """'auto' -> CUDA when it really works, else CPU; 'cuda' without a GPU is an error."""
    requested = requested.lower()
    if requested not in PROVIDER_CHOICES:
        raise ProviderError(f"provider {requested!r} is not supported; choose one of "
                            f"{', '.join(PROVIDER_CHOICES)}.")
    if requested == "cpu":
        return CPU
    usable, reason = cuda_status()
    if usable:
        return CUDA
    if requested == "cuda":
        raise ProviderError(f"provider 'cuda' was requested but CUDA is not usable here: {reason}. "
                            "Use --provider cpu (or auto).")
    return CPU

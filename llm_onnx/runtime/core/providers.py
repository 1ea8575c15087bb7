"""Execution providers: which one runs, decided by what really comes up, not by what is listed.

onnxruntime-gpu lists CUDAExecutionProvider even on a machine without a GPU or CUDA libraries, and
when asked for it falls back to CPU: the Python wrapper prints an "EP Error" line on **stdout**,
the C++ side logs on stderr. So the only reliable check is to create a session with CUDA on the
configured device and look at ``session.get_providers()``; the probe below does that once per
process and device on a 71-byte Identity model, with both streams captured so the real reason
(driver too old, cuDNN missing, no device) reaches the user in one line.

Where each node runs is ONNX Runtime's decision at session creation; ``node_placement`` reads its
verbose "Node placements" log, so a folder that would leave compute nodes on the CPU is caught
before its first token rather than running slowly (see Engine).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

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


def quiet_run_options(graph_id: int | None = None) -> ort.RunOptions:
    """Run options logging errors only, and with ``graph_id`` the CUDA graph the run captures
    or replays (``gpu_graph_id``; -1 runs without one in a session that has CUDA graphs on)."""
    options = ort.RunOptions()
    options.log_severity_level = 3
    # Always named, 0 (ORT's default) when not given: onnxruntime's Python run() and
    # run_with_iobinding look the entry up at every run, and a missing one costs a C++ exception
    # turned into a Python one, 42 us a run here (0.3 us when set): ~0.7% of a SmolLM2 decode step.
    options.add_run_config_entry("gpu_graph_id", str(0 if graph_id is None else graph_id))
    return options


def preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN from the nvidia-* pip packages (the ``[cuda]`` extra) where this
    onnxruntime offers it; without it they are found only after an ``import torch``."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None or CUDA not in ort.get_available_providers():
        return
    with captured_output():  # it prints what it cannot find; the probe reports the consequence
        try:
            preload()
        except Exception:  # noqa: BLE001 - best effort: the probe below tells what is missing
            pass


@functools.lru_cache(maxsize=None)
def cuda_status(device_id: int = 0) -> tuple[bool, str]:
    """(usable, reason). Usable means a CUDA session really comes up on ``device_id`` in this
    process."""
    if os.environ.get("LLM_ONNX_DISABLE_CUDA"):
        return False, "disabled by LLM_ONNX_DISABLE_CUDA"
    if CUDA not in ort.get_available_providers():
        return False, "this onnxruntime build has no CUDA execution provider (the cuda " \
                      "extra installs onnxruntime-gpu: pip install '.[cuda]' in the checkout)"
    preload_cuda_libraries()
    with captured_output() as captured:
        try:
            session = ort.InferenceSession(_PROBE_MODEL, quiet_session_options(),
                                           providers=[(CUDA, {"device_id": device_id}), CPU])
            up = CUDA in session.get_providers()
        except Exception as e:  # ORT raises its own Fail/RuntimeException types
            return False, f"creating a CUDA session on device {device_id} failed " \
                          f"({_first_line(str(e))})"
    if up:
        return True, f"CUDA session created on device {device_id}"
    return False, f"the CUDA session on device {device_id} fell back to CPU " \
                  f"({fallback_reason(captured())})"


def _first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0][:300] if text else "no message"


def fallback_reason(log: str) -> str:
    """The useful part of what ORT printed when CUDA did not come up: the wrapper's
    "EP Error: <reason> using [...]" line (stdout), else the C++ log's "error: <reason>"."""
    for line in log.splitlines():
        m = re.search(r"EP Error:?\s*(.*?)(?:\s+(?:using|when using)\s+\[.*)?$", line)
        if m and m.group(1).strip():
            return _shorten(m.group(1))
    for line in log.splitlines():
        if "error:" in line.lower():
            return _shorten(re.split(r"(?i)error:", line, maxsplit=1)[1])
    return "no GPU or CUDA libraries found"


def _shorten(text: str) -> str:
    """ORT's messages carry source locations ("/onnxruntime_src/...cc:123 fn"): drop them."""
    text = re.sub(r"\S*/onnxruntime\S*:\d+\s+", "", text)
    text = re.sub(r"^(?:[\w:<>*&]+\s+)*\w+(?:::\w+)+\([^)]*\)\s*", "", text).strip()
    return text[:300] or "no message"


@contextlib.contextmanager
def captured_output() -> Iterator[Callable[[], str]]:
    """Capture what ORT writes while the block runs: Python prints (the "EP Error" banner) and
    the C++ log on file descriptors 1 and 2. ``read()`` gives the text once the block is done."""
    text = ""

    def read() -> str:
        return text

    py_out, py_err = io.StringIO(), io.StringIO()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # no usable descriptors (embedded interpreter): Python prints only
        with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
            yield read
        text = py_out.getvalue() + py_err.getvalue()
        return
    with tempfile.TemporaryFile() as tmp:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            with contextlib.redirect_stdout(py_out), contextlib.redirect_stderr(py_err):
                yield read
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            text = py_out.getvalue() + py_err.getvalue() + tmp.read().decode("utf-8", "replace")


# ----------------------------------------------------------------------------- node placement

# Ops ONNX Runtime deliberately keeps on the CPU next to a GPU (shape arithmetic on small int64
# tensors); they cost no transfer of activations.
SHAPE_OPS = frozenset({
    "Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Reshape", "Cast",
    "Range", "Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "Where", "Expand",
    "ConstantOfShape", "ReduceMax", "ReduceMin", "Max", "Min", "Identity", "Constant",
    "MemcpyToHost", "MemcpyFromHost"})


@dataclass
class Placement:
    """Nodes per execution provider, read from ORT's verbose session log."""

    nodes: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # ep -> (op, name)
    counts: dict[str, int] = field(default_factory=dict)
    found: bool = False  # whether the log had a "Node placements" section at all

    def on(self, provider: str) -> list[tuple[str, str]]:
        return self.nodes.get(provider, [])

    def compute_on_cpu(self, shape_ops: frozenset[str] = SHAPE_OPS) -> list[str]:
        """Op types of the CPU nodes that move activations (anything but shape arithmetic)."""
        return sorted({op for op, _ in self.on(CPU) if op not in shape_ops})

    def summary(self) -> str:
        return ", ".join(f"{ep.replace('ExecutionProvider', '')}: {n}"
                         for ep, n in self.counts.items()) or "unknown"


def parse_placement(log: str) -> Placement:
    """ORT's verbose "Node placements" section, e.g.

        Node placements
         All nodes placed on [CUDAExecutionProvider]. Number of nodes: 12
    or
         Node(s) placed on [CPUExecutionProvider]. Number of nodes: 3
          Shape (/model/Shape)
          GroupQueryAttention (/model/layers.0/attn/GroupQueryAttention)
    """
    placement = Placement()
    current: str | None = None
    for raw in log.splitlines():
        # Log records start "2026-01-01 00:00:00.0 [V:onnxruntime:, file.cc:12 Function] ".
        header = re.match(r"^\d{4}-\d\d-\d\d[^\[]*\[[^\]]*\]\s?", raw)
        body = raw[header.end():] if header else raw
        if "Node placements" in body:
            placement.found, current = True, None
            continue
        m = re.search(r"(?:All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)",
                      body)
        if m:
            placement.found = True
            current = m.group(1)
            placement.counts[current] = placement.counts.get(current, 0) + int(m.group(2))
            placement.nodes.setdefault(current, [])
            continue
        node = re.match(r"^\s*([A-Za-z][\w.]*) \((.*)\)\s*$", body)
        if current is not None and node:
            placement.nodes[current].append((node.group(1), node.group(2)))
        elif current is not None and body.strip():
            current = None  # another log record: the section is over
    return placement


def resolve_provider(requested: str, device_id: int = 0) -> str:
    """'auto' -> CUDA when it really works, else CPU; 'cuda' without a GPU is an error."""
    requested = requested.lower()
    if requested not in PROVIDER_CHOICES:
        raise ProviderError(f"provider {requested!r} is not supported; choose one of "
                            f"{', '.join(PROVIDER_CHOICES)}.")
    if requested == "cpu":
        return CPU
    usable, reason = cuda_status(device_id)
    if usable:
        return CUDA
    if requested == "cuda":
        raise ProviderError(f"provider 'cuda' was requested but CUDA is not usable here: {reason}. "
                            "Use --provider cpu (or auto).")
    return CPU

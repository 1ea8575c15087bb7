"""What machine a figure comes from: the CPU's name and flags (Linux's /proc/cpuinfo), its
cores, the platform, and the versions of what ran. Standard library only."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

# the distributions whose versions every result record names (those installed)
VERSIONED = ("llm-onnx", "onnxruntime", "onnxruntime-gpu", "onnxruntime-genai", "numpy",
             "tokenizers", "torch", "transformers", "llama-cpp-python")


def _cpuinfo_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first ``name : value`` of /proc/cpuinfo (Linux), or None."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    line = next((ln for ln in text.splitlines() if ln.startswith(name)), None)
    return None if line is None else line.partition(":")[2].strip()


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (Linux), or none."""
    return set((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform says."""
    return _cpuinfo_field("model name") or platform.processor()


def machine() -> dict:
    return {"cpu": cpu_name(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def versions(names: tuple[str, ...] = VERSIONED) -> dict[str, str]:
    """The installed versions of ``names`` (those not installed left out)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out

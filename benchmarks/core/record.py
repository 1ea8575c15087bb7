"""The one result record every benchmark writes: what ran (the command), when (UTC), where (the
machine) and with what (the versions), above the benchmark's own figures.

    {"record": {"benchmark": "serving.load", "date": "2026-11-28 09:40 UTC",
                "command": "python -m benchmarks.serving.load --clients 8", "machine": {...},
                "versions": {"onnxruntime-gpu": "1.31.1", ...}},
     ...the benchmark's figures...}

results/README.md is the ledger of the records kept in the repository."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from benchmarks.core.machine import machine, versions


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def header(benchmark: str, argv: list[str] | None = None) -> dict:
    """The record of this run of ``python -m benchmarks.<benchmark>`` (``argv``: its arguments,
    default this process's)."""
    args = sys.argv[1:] if argv is None else argv
    return {"benchmark": benchmark, "date": utc_now(),
            "command": shlex.join(["python", "-m", f"benchmarks.{benchmark}", *map(str, args)]),
            "machine": machine(), "versions": versions()}


def with_record(benchmark: str, figures: dict, argv: list[str] | None = None) -> dict:
    """``figures`` under the record of this run (a record already there is kept)."""
    return {"record": figures.get("record") or header(benchmark, argv),
            **{k: v for k, v in figures.items() if k != "record"}}


def write(path: Path, benchmark: str, figures: dict, indent: int = 1, **dump) -> Path:
    """``figures`` with this run's record, as JSON at ``path`` (written whole or not at all)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(with_record(benchmark, figures), indent=indent, **dump))
    os.replace(tmp, path)
    return path

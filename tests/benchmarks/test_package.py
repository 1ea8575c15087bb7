"""The benchmarks are a package like the product: every module under 500 lines, no sys.path
edits, each command (`python -m benchmarks.NAME`) importable and shown by `python -m benchmarks`
and docs/benchmarks.md, and the modules a peer's venv runs importing the standard library only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import commands

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "research").rglob("*.py")])
MAX_LINES = 500


def test_every_module_is_under_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in SOURCES
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_no_module_edits_sys_path():
    edits = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "path"
                    and isinstance(node.value, ast.Name) and node.value.id == "sys"):
                edits.append(str(path.relative_to(ROOT)))
    assert not edits, edits


def test_the_commands_are_listed_and_documented():
    names = [name for name, _ in commands()]
    assert {"benchmarks.peers", "benchmarks.serving.load", "benchmarks.gpu.check",
            "benchmarks.full_size"} <= set(names)
    assert "benchmarks.peers.worker" not in names  # run by the peer comparison, not by hand
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    assert not [n for n in names if f"python -m {n}" not in docs]


@pytest.mark.parametrize("module", ["benchmarks.peers.worker", "benchmarks.core.env",
                                    "benchmarks.core.timing", "benchmarks.peers.prompts",
                                    "benchmarks.fidelity.answer_runs"])
def test_a_peer_venv_runs_the_worker_on_the_standard_library(module):
    """`python -S` leaves site-packages out: only the standard library and this checkout."""
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module}"
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_command_answers_help():
    for name, _ in commands():
        done = subprocess.run([sys.executable, "-m", name, "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "usage" in done.stdout, (name, done.stderr[-500:])

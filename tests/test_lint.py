"""The checks the code is held to, as configured in pyproject.toml: ``ruff check`` over the whole
repository (pyflakes, pycodestyle, import order: the package, tests, benchmarks, research) and
``mypy`` over the runtime and the model folder's contract. A finding fails the suite, printed
in full; docs/testing.md says how to run either alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _check(*command: str) -> None:
    out = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        pytest.fail(f"`{' '.join(command)}` exited {out.returncode}:\n{out.stdout}{out.stderr}",
                    pytrace=False)


def test_ruff_finds_nothing():
    _check("ruff", "check", "--no-cache", "--output-format", "concise")


def test_mypy_finds_nothing(tmp_path):
    # a fresh cache: nothing of an earlier run (or another checkout) is trusted; about 15 s
    _check("mypy", "--cache-dir", str(tmp_path / "mypy-cache"))

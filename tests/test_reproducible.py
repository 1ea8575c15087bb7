"""The suite checks the same thing on every machine: README's test command installs with the
pinned constraints, the reference libraries are those versions, property tests are derandomized."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
# The libraries the parity tests compare against or run on: a different version is a different
# reference.
REFERENCES = ["transformers", "tokenizers", "gguf", "numpy", "onnx", "onnxscript", "torch",
              "sentence-transformers"]


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            found[name.lower()] = version
    return found


def test_readme_installs_with_the_constraints():
    readme = (ROOT / "README.md").read_text()
    command = readme.split("<!-- test-command -->", 1)[1].split("```bash", 1)[1].split("```")[0]
    assert command.count("-c constraints.txt") == command.count("pip install") == 2


@pytest.mark.parametrize("name", REFERENCES)
def test_reference_libraries_are_the_pinned_versions(name):
    version = metadata.version(name).split("+")[0]  # torch's local tag (+cpu) aside
    assert version == pins()[name], f"{name} {version} is installed, constraints.txt pins " \
        f"{pins()[name]}: install with `pip install -c constraints.txt ...`"


def test_onnxruntime_is_pinned_whichever_wheel_is_installed():
    names = {d.metadata["Name"].lower() for d in metadata.distributions()}
    wheel = "onnxruntime-gpu" if "onnxruntime-gpu" in names else "onnxruntime"
    assert metadata.version(wheel) == pins()[wheel]


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci",
                    reason="another Hypothesis profile was asked for")
def test_property_tests_are_derandomized():
    assert settings.default.derandomize and settings.default.database is None


def test_ci_runs_in_a_fresh_clone():
    script = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"git clone --quiet \"\$repo\"", script) and "rm -rf \"$work\"" in script

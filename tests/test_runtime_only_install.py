"""The runtime alone: `pip install llm-onnx` (no extras) in a fresh virtualenv has no torch, and
its `llm-onnx generate` runs an exported folder, giving the tokens of the runtime here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llm_onnx.runtime import Model

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.install


def test_the_runtime_installs_and_generates_without_torch(tmp_path, tiny_export):
    folder = tiny_export("gpt2_tiny", "fp32")  # a folder with a (word-level) tokenizer
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                          "-c", str(ROOT / "constraints.txt"), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import importlib.util as u; print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "True"  # the runtime's dependencies do not pull torch in
    # The chat page's files are package data: the installed package carries them all.
    listing = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import llm_onnx, pathlib; web = pathlib.Path(llm_onnx.__file__)"
                              ".parent / 'serve' / 'web'; print(sorted(p.name for p in "
                              "web.iterdir() if p.is_file() and p.suffix != '.py'))"],
                             capture_output=True, text=True, check=True, cwd=tmp_path)
    web = ROOT / "llm_onnx" / "serve" / "web"
    assert listing.stdout.strip() == str(sorted(p.name for p in web.iterdir()
                                                if p.is_file() and p.suffix != ".py"))
    prompt = "t5 t9 t11 t2 t7 t40"
    run = subprocess.run([str(venv / "bin" / "llm-onnx"), "generate", "--model", str(folder), "-q",
                          "--json", "--temperature", "0", "--max-new-tokens", "8", prompt],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    here = Model.load(folder).generate(prompt, max_new_tokens=8, temperature=0)
    assert json.loads(run.stdout)["token_ids"] == here.token_ids and len(here.token_ids) == 8

"""The runtime is what other apps embed: importing it must not import torch (or the exporter)."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_runtime_does_not_import_torch():
    mods = _modules_after("import llm_onnx.runtime")
    assert "torch" not in mods
    assert not any(m.startswith(("llm_onnx.export", "llm_onnx.model.decoder", "transformers"))
                   for m in mods)


def test_presets_and_cli_help_do_not_import_torch():
    assert "torch" not in _modules_after("import llm_onnx.families")
    assert "torch" not in _modules_after("import llm_onnx.cli")

"""The precision of an export that names none: fp16 for a GPU; on the CPU fp32 for a model of
at most 1 GiB of fp32 weights (where int8 costs a small model answers: docs/quantization.md),
else int8."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from llm_onnx.cli import main
from llm_onnx.export.options import SMALL_FP32_BYTES, default_precision
from llm_onnx.families import PRESETS
from llm_onnx.model_folder import read_manifest
from llm_onnx.modeling.shapes import num_parameters


@pytest.mark.parametrize("preset, cpu", [("smollm2_135m", "fp32"), ("gpt2", "fp32"),
                                         ("llama_tiny", "fp32"), ("opt_350m", "int8"),
                                         ("qwen3_8b", "int8"), ("qwen3_30b_a3b", "int8")])
def test_small_models_default_to_fp32_on_the_cpu(preset, cpu):
    assert default_precision(PRESETS[preset], cuda=False) == cpu
    assert default_precision(PRESETS[preset], cuda=True) == "fp16"


def test_the_limit_is_the_fp32_bytes():
    cfg = PRESETS["smollm2_135m"]
    grown = [replace(cfg, num_hidden_layers=n) for n in range(30, 200, 10)]
    sizes = [(4 * num_parameters(c), default_precision(c, cuda=False)) for c in grown]
    assert {p for b, p in sizes if b <= SMALL_FP32_BYTES} == {"fp32"}
    assert {p for b, p in sizes if b > SMALL_FP32_BYTES} == {"int8"}


def test_unknown_size_is_undecided_on_the_cpu_only():
    assert default_precision(None, cuda=False) is None
    assert default_precision(None, cuda=True) == "fp16"


def test_the_cli_exports_a_tiny_model_at_fp32_unless_told(tmp_path, monkeypatch):
    monkeypatch.setattr("llm_onnx.runtime.core.providers.cuda_status", lambda: (False, "no"))
    for extra, want in (([], "fp32"), (["--precision", "int8"], "int8")):
        out = tmp_path / want
        result = CliRunner().invoke(main, ["export", "--config", "llama_tiny", "--random-weights",
                                           "--max-seq-len", "32", "--no-validate",
                                           "--no-huge-pages", "--out", str(out), *extra])
        assert result.exit_code == 0, result.output
        assert f"({want})" in result.output
        assert read_manifest(out).precision.precision == want

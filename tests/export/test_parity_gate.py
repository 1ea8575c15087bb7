"""The parity gate fails an export whose graphs do not compute what torch computes, and leaves
no folder behind."""

from __future__ import annotations

import onnxscript
import pytest

from llm_onnx.checkpoints import random_checkpoint
from llm_onnx.errors import ParityError
from llm_onnx.export import ExportOptions, custom_ops, export_model
from llm_onnx.families import get_config

_msft = onnxscript.values.Opset("com.microsoft", 1)
_here = onnxscript.values.Opset("tests.broken", 1)


@onnxscript.script(opset=_here)
def broken_rms_norm(x: custom_ops.TFloat, weight: custom_ops.TFloat, eps: float) -> custom_ops.TFloat:
    # A plausible translation bug: the epsilon attribute lost (ORT's default is 1e-5 ... and 0.5 here)
    return _msft.SimplifiedLayerNormalization(x, weight, axis=-1, epsilon=0.5, stash_type=1)


def test_a_wrong_translation_fails_the_export(tmp_path, monkeypatch):
    monkeypatch.setattr(custom_ops, "rms_norm", broken_rms_norm)
    ckpt = random_checkpoint(get_config("qwen3_tiny"), "qwen3_tiny")
    with pytest.raises(ParityError) as e:
        export_model(ckpt, tmp_path / "m", ExportOptions(precision="fp32", max_seq_len=32),
                     progress=False)
    assert "ONNX vs torch: logits max|diff|" in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []

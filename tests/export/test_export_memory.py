"""Export memory: a layer's experts are read from the checkpoint one expert at a time (by the
calibration, the quantizer and the float writer), never stacked whole. At Qwen3-30B-A3B's shape
the stacked experts of one layer are 1.1 GiB in bfloat16 and 2.3 GiB in float32; an int4 export
of one full-shape layer peaked at 3.8 GiB RSS while they were (benchmarks/moe_full.py)."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.checkpoints.load import ExpertsProducer, random_checkpoint
from llm_onnx.checkpoints.sources import RandomSource
from llm_onnx.export import ExportOptions, export_model
from llm_onnx.families import get_config


def test_experts_producer_interleaves_gate_and_up_rows_as_ort_wants():
    cfg = get_config("qwen3_moe_tiny")
    src = RandomSource(cfg, seed=3)
    prefix = "model.layers.1.mlp.experts"
    stacked = ExpertsProducer(prefix, cfg.moe.num_experts, fused=True)(src).float().numpy()
    down = ExpertsProducer(prefix, cfg.moe.num_experts, fused=False)(src).float().numpy()
    for e in range(cfg.moe.num_experts):
        gate = src.get(f"{prefix}.{e}.gate_proj.weight").float().numpy()  # (I, D)
        up = src.get(f"{prefix}.{e}.up_proj.weight").float().numpy()
        np.testing.assert_array_equal(stacked[e, 0::2], gate)  # rows g0, u0, g1, u1, ...
        np.testing.assert_array_equal(stacked[e, 1::2], up)
        np.testing.assert_array_equal(down[e], src.get(f"{prefix}.{e}.down_proj.weight").float())


@pytest.mark.parametrize("precision", ["int4", "fp16"])
def test_export_never_stacks_a_layers_experts(precision, tmp_path, monkeypatch):
    """int4 (awq: calibration, then QMoE's quantizer) and fp16 (float experts) exports of the
    tiny Qwen3-MoE read experts one at a time, and still pass the parity gate."""
    def stacked(self, src):
        raise AssertionError(f"{self.prefix}: a layer's experts were stacked whole")

    monkeypatch.setattr(ExpertsProducer, "__call__", stacked)
    cfg = get_config("qwen3_moe_tiny")
    out = export_model(random_checkpoint(cfg, "moe"), tmp_path / precision,
                       ExportOptions(precision=precision, target="cpu", max_seq_len=64),
                       progress=False)
    assert (out / "manifest.json").is_file()

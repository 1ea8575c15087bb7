"""research/linear_attention_cuda.py's own code on the CPU (CI has no GPU): its numpy gated
delta rule against ONNX Runtime's LinearAttention, and a wrong rule caught."""

from __future__ import annotations

import json

import numpy as np

from research import linear_attention_cuda as la


def test_linear_attention_probe_matches_its_reference_and_catches_a_wrong_one(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr("sys.argv", ["x", "--smoke", "--out", str(tmp_path), "--repeat", "2"])
    assert la.main() == 0
    got = json.loads((tmp_path / "linear_attention_cuda.json").read_text())
    assert got["LinearAttention/fp32"]["max_abs_diff_out"] < 1e-5
    assert got["LinearAttention/fp32"]["b1_t16_ms"] > 0
    right = la.reference

    def no_decay(q, k, v, state, g, beta):
        return right(q, k, v, state, np.zeros_like(g), beta)

    monkeypatch.setattr(la, "reference", no_decay)
    assert la.main() == 1

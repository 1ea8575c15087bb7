"""The GPU probes' own code on the CPU (CI has no GPU): benchmarks/linear_attention_cuda.py's
numpy gated delta rule against ONNX Runtime's LinearAttention (and a wrong rule caught), and
benchmarks/cuda_node_diff.py over a tiny MoE folder (the CPU against itself: nothing differs,
every router TopK reported with its margin)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.scripts import load_benchmark


def test_linear_attention_probe_matches_its_reference_and_catches_a_wrong_one(tmp_path,
                                                                              monkeypatch):
    la = load_benchmark("linear_attention_cuda")
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


def test_node_diff_runs_over_a_moe_folder(tmp_path, monkeypatch, tiny_export):
    nd = load_benchmark("cuda_node_diff")
    folder = tiny_export("gemma4_tiny", "fp32")  # its router: a TopK in the graph
    monkeypatch.setattr("sys.argv", ["x", str(folder), "--smoke", "--out", str(tmp_path),
                                     "--tokens", "7"])
    assert nd.main() == 0
    got = json.loads((tmp_path / f"node_diff-{folder.name}.json").read_text())
    assert got["first_over_tolerance"] == [] and got["int_outputs_that_differ"] == []
    assert got["logits_vs_cpu_all"]["cpu/all"] == 0.0
    assert got["topk"] and all(t["rows_picking_other"] == 0 for t in got["topk"])
    assert all(t["smallest_margin"] >= 0 for t in got["topk"])
    assert pytest.approx(got["logits_disable_all_outputs"], abs=1e-6) == 0.0

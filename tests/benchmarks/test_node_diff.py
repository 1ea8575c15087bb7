"""python -m benchmarks.gpu.node_diff's own code on the CPU (CI has no GPU): over a tiny MoE
folder the CPU against itself: nothing differs, every router TopK reported with its margin."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu import node_diff as nd


def test_node_diff_runs_over_a_moe_folder(tmp_path, monkeypatch, tiny_export):
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

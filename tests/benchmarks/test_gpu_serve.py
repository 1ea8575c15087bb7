"""The GPU serving benchmark's own code (python -m benchmarks.gpu.serve) on the CPU (CI has no
GPU): the engine part (static batches, verify runs, the prefix copy checked against the source
row), the server under clients with its /metrics read, schema requests, and speculation giving
the same tokens. No figure from here is a GPU figure; this keeps the script that takes them
working between leases."""

from __future__ import annotations

import json
import sys

from benchmarks.gpu import serve as gpu_serve


def test_smoke_run_measures_every_part(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_serve.py", "--smoke", "--out", str(tmp_path)])
    assert gpu_serve.main() == 0
    r = json.loads((tmp_path / "gpu_serve.json").read_text())
    assert r["errors"] == {}
    engine = r["engine"]
    assert engine["decode_tok_s_b1"] > 0 and engine["decode_tok_s_b32"] > 0
    assert set(engine["verify_run"]) == {"k1_ms", "k2_ms", "k4_ms", "k8_ms"}
    copy = engine["prefix_copy"]
    assert copy["ok"] and copy["layer0_keys_equal"] and copy["relative_logits_diff"] < 1e-5
    for n in ("1", "2"):
        level = r["serve"]["levels"][n]
        assert level["error_count"] == 0 and level["tokens"] == 2 * int(n) * 8, level
        assert level["profile"]["decode_runs"] > 0
    structured = r["structured"]
    assert structured["error_count"] == 0 and structured["masks"] > 0
    assert structured["invalid"] == 0
    assert r["speculative"]["same_tokens"]


def test_a_reply_is_valid_only_when_finished_parsed_and_complete():
    ok = {"finish": "stop", "text": '{"name": "a", "age": 3, "tags": []}'}
    assert gpu_serve._valid(ok) is True
    assert gpu_serve._valid({**ok, "finish": "length"}) is None
    assert gpu_serve._valid({**ok, "text": '{"name": "a", "age": 3}'}) is False
    assert gpu_serve._valid({**ok, "text": '{"name": "a", "age": 3, "tags": [}'}) is False


def test_async_parts_run_under_a_running_event_loop():
    """The client loads run whether or not this thread already runs an event loop (as under a
    notebook's or another tool's loop)."""

    async def inner():
        return 7

    async def outer():  # here a loop is certainly running: the nested call takes a thread
        return gpu_serve._run_async(inner())

    assert gpu_serve._run_async(outer()) == 7
    assert gpu_serve._run_async(inner()) == 7

"""`llm-onnx bench`: its JSON, the bandwidth ceiling beside each run, and `--profile`, whose
per-op node counts must equal the graph ONNX Runtime actually runs (its optimized model, saved
by ONNX Runtime itself) and whose phase split is checked on a hand-made trace."""

from __future__ import annotations

import json
from collections import Counter

import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from llm_onnx.bench import BandwidthProbe, DeviceBandwidthProbe, profile_table, summarize_profile
from llm_onnx.cli import main
from llm_onnx.errors import GenerationError


def _run(ts, dur):
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}


def _node(name, op, ts, dur):
    return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur,
            "args": {"op_name": op}}


def test_summarize_profile_splits_prefill_from_decode_steps():
    events = [
        _run(0, 1000), _node("old", "MatMulNBits", 10, 900),            # an earlier generation
        _run(2000, 500),                                                  # prefill
        _node("a", "MatMulNBits", 2010, 300), _node("b", "GroupQueryAttention", 2320, 100),
        _node("b_fence", "Add", 2420, 20),
        {"cat": "Node", "name": "a_fence_before", "ts": 2005, "dur": 1},  # not a kernel event
        _run(3000, 100),                                                  # decode step 1
        _node("a", "MatMulNBits", 3005, 40), _node("b", "GroupQueryAttention", 3050, 20),
        _run(4000, 140),                                                  # decode step 2
        _node("a", "MatMulNBits", 4005, 60), _node("b", "GroupQueryAttention", 4070, 40),
    ]
    p = summarize_profile(events, runs=3)
    pre, dec = p["prefill"], p["decode"]
    assert pre["runs"] == 1 and dec["runs"] == 2
    assert pre["run_ms"] == pytest.approx(0.5) and pre["node_ms"] == pytest.approx(0.42)
    assert pre["outside_ms"] == pytest.approx(0.08) and pre["weight_ms"] == pytest.approx(0.3)
    assert [o["op"] for o in pre["ops"]] == ["MatMulNBits", "GroupQueryAttention", "Add"]
    # decode: per step means over the two steps
    assert dec["run_ms"] == pytest.approx(0.12)
    assert dec["weight_ms"] == pytest.approx(0.05)
    assert dec["outside_ms"] == pytest.approx((240 - 160) / 2 / 1e3)
    assert {o["op"]: o["nodes"] for o in dec["ops"]} == {"MatMulNBits": 1, "GroupQueryAttention": 1}
    text = profile_table(p)
    assert "MatMulNBits" in text and "outside nodes" in text
    with pytest.raises(GenerationError, match="expected 5"):
        summarize_profile(events, runs=5)


def test_bandwidth_probe_measures_a_plausible_rate():
    probe = BandwidthProbe(threads=1, total_bytes=64 << 20)
    try:
        rate = probe.measure(repeat=4)
    finally:
        probe.close()
    assert 1e8 < rate < 1e12  # bytes/s: between a floppy and ten times any RAM


def test_device_probe_reads_its_whole_buffer_through_onnx_runtime():
    """The GPU probe's code path, on the CPU provider: its ReduceSum must really read the buffer
    (the sum of 2**22 ones), and its rate must be plausible."""
    probe = DeviceBandwidthProbe("CPUExecutionProvider", total_bytes=16 << 20)
    try:
        probe.session.run_with_iobinding(probe.binding)
        assert probe.y.numpy() == pytest.approx(float(1 << 22))
        assert 1e8 < probe.measure(repeat=3) < 1e12
    finally:
        probe.close()


@pytest.fixture(scope="module")
def bench_json(tiny_export, tmp_path_factory):
    folder = tiny_export("llama_tiny", "int8")
    result = CliRunner().invoke(main, ["bench", "--model", str(folder), "--json", "--profile",
                                       "--prompt-len", "12", "--new-tokens", "6", "--repeat", "2",
                                       "--provider", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    return folder, json.loads(result.output)


def test_bench_json_reports_medians_memory_and_the_ceiling(bench_json):
    folder, d = bench_json
    for key in ("ttft_s", "prefill_tok_s", "decode_tok_s"):
        s = d[key]
        assert 0 < s["min"] <= s["median"] <= s["max"]
    assert d["prompt_len"] == 12 and d["new_tokens"] == 6 and d["repeat"] == 2
    assert d["peak_rss_mib"] >= d["rss_before_load_mib"] > 0  # a high-water mark: in pytest, torch set it
    assert len(d["memory_bandwidth_samples_gb_s"]) == 2  # one probe after each timed run
    assert "host memory, 1 threads" in d["bandwidth_probe"]
    assert d["decode_ceiling_tok_s"] > 0 and 0 < d["decode_ceiling_reached"]
    # weights (less an untied embedding table, only gathered) + the KV cache at mid-generation
    kv = json.loads((folder / "manifest.json").read_text())["kv_cache"]
    kv_bytes = 2 * kv["num_layers"] * kv["num_key_value_heads"] * kv["head_dim"] * (12 + 3) * 4
    assert kv_bytes < d["bytes_per_token"] <= d["weight_bytes"] + kv_bytes
    assert d["weight_bytes_per_token"] == d["bytes_per_token"] - kv_bytes
    # the host's time between decode runs: part of every step, less than a whole step
    h = d["host_us_per_step"]
    assert 0 < h["min"] <= h["median"] <= h["max"] < 1e6 / d["decode_tok_s"]["min"]


def test_profile_counts_the_nodes_onnx_runtime_runs(bench_json, tmp_path):
    folder, d = bench_json
    prof = d["profile"]
    assert prof["prefill"]["runs"] == 1 and prof["decode"]["runs"] == 5  # 6 tokens, 1 prefill
    # The reference: the optimized graph ONNX Runtime runs, written by ONNX Runtime itself.
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(folder / "prefill.onnx"), so, providers=["CPUExecutionProvider"])
    graph_ops = Counter(n.op_type for n in onnx.load(so.optimized_model_filepath,
                                                       load_external_data=False).graph.node)
    for phase in ("prefill", "decode"):
        p = prof[phase]
        assert {o["op"]: o["nodes"] for o in p["ops"]} == dict(graph_ops), phase
        assert 0 < p["weight_ms"] <= p["node_ms"] <= p["run_ms"]
        assert p["outside_ms"] == pytest.approx(p["run_ms"] - p["node_ms"])
    assert graph_ops["MatMulNBits"] > 0
    dec = prof["decode"]
    assert dec["weight_read_gb_s"] == pytest.approx(d["weight_bytes_per_token"] / dec["weight_ms"]
                                                    / 1e6)


def test_profile_table_is_printed_after_the_timings(tiny_export):
    folder = tiny_export("llama_tiny", "fp32")
    result = CliRunner().invoke(main, ["bench", "--model", str(folder), "--profile",
                                       "--prompt-len", "8", "--new-tokens", "3", "--repeat", "1",
                                       "--provider", "cpu"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert text.index("decode ceiling") < text.index("profile (ONNX Runtime profiler")
    assert "weight kernels" in text and "whole run" in text


def test_plot_without_matplotlib_fails_at_once_and_writes_nothing(tiny_export, tmp_path,
                                                                 monkeypatch):
    import sys

    import llm_onnx.bench as bench

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    loads = []
    monkeypatch.setattr(bench.Model, "load", classmethod(lambda cls, *a, **k: loads.append(a)))
    out = tmp_path / "curve.png"
    result = CliRunner().invoke(main, ["bench", "--model", str(tiny_export("llama_tiny")),
                                       "--plot", str(out)])
    assert result.exit_code == 1
    assert "--plot needs matplotlib: pip install '.[bench]' in the checkout." in result.output
    assert loads == [] and list(tmp_path.iterdir()) == []  # before loading, nothing on disk


def test_decode_curve_measures_every_context_and_batch_that_fits(tiny_export):
    from llm_onnx.bench import curve_contexts, decode_curve
    from llm_onnx.runtime import Model

    model = Model.load(tiny_export("llama_tiny"), provider="cpu", threads=1)
    contexts = curve_contexts(model.context_length, tokens=4)  # max_seq_len 64: 15, 30, 60
    assert contexts == [15, 30, 60] and curve_contexts(8192) == [128, 512, 1024, 2048]
    points = decode_curve(model, contexts + [61], [1, 2], tokens=4)  # 61 + 4 > 64: skipped
    assert [(p["batch"], p["context"]) for p in points] == [(b, c) for b in (1, 2) for c in contexts]
    assert all(p["decode_tok_s"] > 0 for p in points)


def _stored_bytes(folder, match) -> int:
    """Bytes in weights.data of the prefill graph's initializers whose names ``match``, as the
    graph itself records them (external data lengths), each stored tensor counted once."""
    graph = onnx.load(str(folder / "prefill.onnx"), load_external_data=False).graph
    spans = set()
    for t in graph.initializer:
        if match(t.name):
            info = {e.key: int(e.value) for e in t.external_data if e.key in ("offset", "length")}
            spans.add((info["offset"], info["length"]))
    return sum(length for _, length in spans)


def test_moe_decode_step_reads_the_top_k_experts_share(tiny_export):
    """A mixture of experts' decode step reads k of its E experts: the bytes bench divides the
    bandwidth by, worked out by hand for the tiny Qwen3-MoE at int4 (qwen3_moe_tiny: vocabulary
    256, hidden 64, 2 layers, 4 experts of width 32, top 2, untied 4-bit embedding), and those
    hand figures checked against the tensors the graph stores."""
    from llm_onnx.bench import weight_bytes_read
    from llm_onnx.model_folder import read_manifest

    folder = tiny_export("qwen3_moe_tiny", "int4")
    m = read_manifest(folder)
    V, D, L, E, K, I = 256, 64, 2, 4, 2, 32  # noqa: E741 (I: the intermediate size)
    assert (m.config.vocab_size, m.config.hidden_size, m.config.num_hidden_layers,
            m.config.moe.num_experts, m.config.moe.num_experts_per_tok,
            m.config.moe.moe_intermediate_size) == (V, D, L, E, K, I)
    # int4 on CPU: half a byte per weight and a float32 scale per block of 32 inputs (the
    # experts' default block 64 fits 32: I = 32); the experts' 4-bit zero points packed two to
    # a byte, a row's rounded up to a whole byte
    gate_up = E * 2 * I * (D // 2 + D // 32 * 4 + 1)  # (E, 2I, D): 4 * 64 * 41 = 10496
    down = E * D * (I // 2 + I // 32 * 4 + 1)  # (E, D, I): 4 * 64 * 21 = 5376
    experts = L * (gate_up + down)  # 31744
    row = D // 2 + D // 32 * 4  # a row of the 4-bit table: 40 bytes
    table = V * row  # 10240
    assert m.precision.quantization.experts.scheme == "zero_point"
    assert _stored_bytes(folder, lambda n: ".mlp.experts." in n) == experts
    assert _stored_bytes(folder, lambda n: n.startswith("model.embed_tokens.")) == table
    size = (folder / "weights.data").stat().st_size
    # batch 1: 2 of 4 experts per layer, one row of the table, everything else whole
    assert weight_bytes_read(m) == size - experts // 2 - table + row
    # batch 2, rows routed independently: 1 - (1 - 2/4)^2 = 3/4 of the experts, two rows
    assert weight_bytes_read(m, 2) == size - experts // 4 - table + 2 * row


def test_dense_decode_step_reads_all_weights_but_the_table(tiny_export):
    """A dense model's step reads every weight but the untied embedding table's other rows:
    llama_tiny at int8 (vocabulary 256, hidden 48: 8-bit codes, a float32 scale per block of 16,
    the largest power of two <= 32 dividing 48)."""
    from llm_onnx.bench import weight_bytes_read
    from llm_onnx.model_folder import read_manifest

    folder = tiny_export("llama_tiny", "int8")
    m = read_manifest(folder)
    assert (m.config.vocab_size, m.config.hidden_size, m.config.tie_word_embeddings) == \
        (256, 48, False)
    row = 48 + 48 // 16 * 4  # 60 bytes
    assert _stored_bytes(folder, lambda n: n.startswith("model.embed_tokens.")) == 256 * row
    size = (folder / "weights.data").stat().st_size
    assert weight_bytes_read(m) == size - 256 * row + row


def test_a_hybrid_rows_memory_counts_its_recurrent_state(tiny_export):
    """qwen3_5_tiny: a linear-attention layer (conv state (3, 2*2*16 + 4*32), recurrent state
    (4, 16, 32), float32) and one full layer (2 kv heads of 64): keys and values per position
    of the full layer only; a row's state once, with its checkpoints and a verify copy, whatever
    its length; bench reports both and reads the state every step."""
    folder = tiny_export("qwen3_5_tiny", "fp32")
    result = CliRunner().invoke(main, ["bench", "--model", str(folder), "--json",
                                       "--prompt-len", "12", "--new-tokens", "6", "--repeat", "1",
                                       "--provider", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    per_position = 2 * 1 * 2 * 64 * 4  # keys and values, one layer, 2 heads of 64, float32
    state = ((4 - 1) * (2 * 2 * 16 + 4 * 32) + 4 * 16 * 32) * 4  # one linear layer, one row
    assert d["kv_bytes_per_position"] == per_position
    assert d["state_bytes_per_row"] == state * (2 + 4)  # live, 4 checkpoints, a verify copy
    assert d["row_bytes"] == per_position * 18 + state * 6
    assert d["bytes_per_token"] - d["weight_bytes_per_token"] == per_position * 15 + state


def test_gemma4_decode_step_reads_the_chosen_experts_share(tiny_export):
    """Gemma 4's experts sit beside every layer's dense MLP and, in the CPU export, only the
    chosen ones run: gemma4_tiny at int8 (hidden 48, 4 layers, 4 experts of width 32, top 2,
    tied embedding; 8-bit codes, a float32 scale per block: gate/up blocked along D = 48 by 16,
    down along I = 32 by 32), by hand and against the tensors the graph stores."""
    from llm_onnx.bench import weight_bytes_read
    from llm_onnx.model_folder import read_manifest

    folder = tiny_export("gemma4_tiny", "int8")  # (the folder test_architectures exports)
    m = read_manifest(folder)
    D, L, E, K, I = 48, 4, 4, 2, 32  # noqa: E741 (I: the intermediate size)
    assert (m.config.hidden_size, m.config.num_hidden_layers, m.config.moe.num_experts,
            m.config.moe.num_experts_per_tok, m.config.moe.moe_intermediate_size,
            m.config.tie_word_embeddings) == (D, L, E, K, I, True)
    gate_up = 2 * I * (D + D // 16 * 4)  # an expert's (2I, D): 64 * 60 = 3840
    down = D * (I + I // 32 * 4)  # (D, I): 48 * 36 = 1728
    experts = L * E * (gate_up + down)  # 89088
    assert _stored_bytes(folder, lambda n: ".experts." in n) == experts
    size = (folder / "weights.data").stat().st_size
    assert weight_bytes_read(m) == size - experts // 2  # 2 of 4 experts; the table is the head
    assert weight_bytes_read(m, 2) == size - experts // 4

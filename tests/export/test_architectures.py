"""Rung 3 for every family beyond the first three (GPT-2, BLOOM, Falcon, Mistral, ... from the
registry): tiny random checkpoints exported and run on ONNX Runtime (CPU) against transformers,
the ONNX Runtime ops each family maps to, and the measured semantics of GroupQueryAttention's
sliding window and attention bias. Their fp16 and quantized rungs are in test_export.py.

A right-padded batch of two prompts (9 and 5 tokens: both longer than mistral_tiny's window of
4) is prefilled, then 8 decode steps run through decode.onnx.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from llm_onnx.families import get_config
from llm_onnx.modeling.ops import attention_ref
from tests.conftest import FAMILY_ARCHS
from tests.export.test_export import PROMPT_LENS, STEPS, rows_for, transposed_weights
from tests.ort_helpers import Graphs, batch_logits, hf_logits
from tests.perturb import perturbed
from tests.tolerances import OP_FP32, ORT_FP32


@pytest.mark.parametrize("arch", FAMILY_ARCHS)
def test_fp32_matches_transformers(arch, tiny_hf, tiny_export):
    hf = tiny_hf(arch)[0]
    rows = rows_for(arch)
    got = batch_logits(Graphs(tiny_export(arch, "fp32")), rows, PROMPT_LENS, STEPS)
    want = hf_logits(hf, rows, PROMPT_LENS, STEPS)
    assert max(np.abs(g - w).max() for g, w in zip(got, want)) <= ORT_FP32
    assert max(np.abs(w).max() for w in want) > 0.1  # not a trivially small signal
    # The comparison can fail: transformers with one perturbed weight is far outside it.
    with perturbed(hf) as hf_moved:
        moved = hf_logits(hf_moved, rows, PROMPT_LENS, STEPS)
    assert max(np.abs(g - m).max() for g, m in zip(got, moved)) > ORT_FP32


def nodes(folder: Path, graph: str) -> list[onnx.NodeProto]:
    return list(onnx.load(str(folder / graph), load_external_data=False).graph.node)


def attribute(node: onnx.NodeProto, name: str):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


# What a family maps to beyond MatMul/MatMulNBits and GroupQueryAttention: RMS-norm families
# (Llama's kind) map to the simplified norms; the others name theirs.
RMS_OPS = {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"}
FAMILY_OPS = {
    "gpt2_tiny": {"SkipLayerNormalization", "FastGelu", "Gather"},
    "bloom_tiny": {"LayerNormalization", "SkipLayerNormalization", "FastGelu", "Range"},
    "falcon_tiny": {"LayerNormalization", "SkipLayerNormalization", "Gelu"},
    # post-LN: every norm follows a residual sum, so all are SkipLayerNormalization
    "opt_350m_tiny": {"SkipLayerNormalization", "Relu", "Gather"},
    "xglm_tiny": {"SkipLayerNormalization", "Gelu", "Gather", "Mul"},  # Mul: sqrt(d) scale
    # Gemma 3: the norms on the attention's and the MLP's outputs are plain
    # SimplifiedLayerNormalization; the soft cap is Tanh
    "gemma3_tiny": RMS_OPS | {"FastGelu", "Tanh", "Mul"},
    # Qwen3.5: the gated delta rule and the gated norm as contrib ops; the convolution and the
    # gates in plain ops (GatherElements picks the conv state, Softplus the decay)
    "qwen3_5_tiny": RMS_OPS | {"LinearAttention", "GatedRMSNorm", "GatherElements", "Softplus"},
    "qwen3_5_moe_tiny": RMS_OPS | {"LinearAttention", "GatedRMSNorm", "Softplus", "Sigmoid"},
    "qwen3_next_tiny": RMS_OPS | {"LinearAttention", "GatedRMSNorm", "Softplus", "Sigmoid"},
    # Gemma 4: FastGelu in the MLP, the experts and the per-layer gate; TopK in the router;
    # Tanh for the cap (the quantized experts' If per expert: tests/export/test_routed_experts.py)
    "gemma4_tiny": RMS_OPS | {"FastGelu", "Tanh", "TopK", "Gather", "Softmax"},
}


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("arch", FAMILY_ARCHS)
def test_graphs_use_contrib_ops(arch, precision, tiny_export):
    cfg = get_config(arch)
    expected = FAMILY_OPS.get(arch, RMS_OPS if cfg.norm.norm_type == "rms" else None)
    assert expected is not None, f"say in FAMILY_OPS which ONNX Runtime ops {arch} maps to"
    folder = tiny_export(arch, precision)
    for graph in ("prefill.onnx", "decode.onnx"):
        found = nodes(folder, graph)
        types = {n.op_type for n in found}
        assert expected <= types, types
        assert ("MatMulNBits" if precision == "int8" else "MatMul") in types
        assert not transposed_weights(folder, graph)
        gqa = [n for n in found if n.op_type == "GroupQueryAttention"]
        assert len(gqa) == len(cfg.attention_layers)  # Qwen3.5: its full-attention layers only
        linear = [n for n in found if n.op_type == "LinearAttention"]
        assert len(linear) == len(cfg.linear_layers)
        for n in linear:  # as many query/key heads as the checkpoint, no repeat to value heads
            la = cfg.linear_attention
            assert (attribute(n, "q_num_heads"), attribute(n, "kv_num_heads")) == (
                la.num_key_heads, la.num_value_heads)
        for layer, n in zip(cfg.attention_layers, gqa):  # one node per layer, in order
            # RoPE inside the attention kernel (not on SmolLM3's NoPE layers: no cos/sin caches
            # either); a sliding window as local_window_size (Gemma 3: on its sliding layers
            # only); ALiBi as the attention_bias input; multi-query as one kv head.
            rope = cfg.layer_uses_rope(layer)
            assert (attribute(n, "do_rotary") or 0) == int(rope)
            assert bool(n.input[7:9] and all(n.input[7:9])) == rope
            assert attribute(n, "local_window_size") == (cfg.layer_window(layer) or -1)
            bias = n.input[10] if len(n.input) > 10 else ""
            assert bool(bias) == (cfg.positions.position_embedding_type == "alibi")
            assert attribute(n, "kv_num_heads") == cfg.layer_kv_heads(layer)  # (Gemma 4)
            sink = n.input[11] if len(n.input) > 11 else ""  # gpt-oss: head_sink
            assert bool(sink) == cfg.attention.attention_sinks
        for n in (n for n in found if n.op_type in ("MoE", "QMoE")):  # the experts' SwiGLU
            moe = cfg.moe
            bias = [n.input[i] if len(n.input) > i else "" for i in
                    ((3, 5) if n.op_type == "MoE" else (4, 7))]
            assert [bool(b) for b in bias] == [moe.bias, moe.bias]
            assert (attribute(n, "activation_alpha"), attribute(n, "activation_beta")) == \
                pytest.approx((moe.swiglu_alpha, moe.swiglu_beta))
            limit = attribute(n, "swiglu_limit")
            assert limit == (float("inf") if moe.swiglu_limit is None
                             else pytest.approx(moe.swiglu_limit))
        if cfg.positions.position_embedding_type == "alibi":  # one ALiBi bias, shared by all layers
            assert len({n.input[10] for n in gqa}) == 1


def _gqa_session(heads: int, kv_heads: int, head_dim: int, window: int, with_bias: bool):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    def vi(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, shape)

    f = TensorProto.FLOAT
    inputs = [vi("q", f, ["B", "T", heads * head_dim]), vi("k", f, ["B", "T", kv_heads * head_dim]),
              vi("v", f, ["B", "T", kv_heads * head_dim]), vi("pk", f, ["B", kv_heads, "P", head_dim]),
              vi("pv", f, ["B", kv_heads, "P", head_dim]), vi("seqlens_k", TensorProto.INT32, ["B"]),
              vi("total", TensorProto.INT32, [])]
    names = ["q", "k", "v", "pk", "pv", "seqlens_k", "total"]
    if with_bias:
        inputs.append(vi("bias", f, [1, heads, "T", "S"]))
        names += ["", "", "", "bias"]
    node = helper.make_node("GroupQueryAttention", names, ["out", "ok", "ov"], domain="com.microsoft",
                            num_heads=heads, kv_num_heads=kv_heads, local_window_size=window)
    graph = helper.make_graph([node], "gqa", inputs, [vi(o, f, None) for o in ("out", "ok", "ov")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("case", ["prefill", "decode"])
def test_gqa_window_and_bias_semantics(case):
    """Rung 3 for what the families rely on: ORT's local_window_size=w attends to the w keys
    p-w+1 ... p (what attention_ref implements and transformers' Mistral sliding_window means),
    not w+1; attention_bias (1, H, T, total) is added to the scaled scores."""
    heads, kv_heads, d = 4, 2, 16
    rng = np.random.default_rng(0)
    if case == "prefill":
        t, seqlens, total, cache = 9, [8, 8], 9, np.zeros((2, kv_heads, 12, d), np.float32)
    else:
        t, seqlens, total = 1, [9, 6], 10
        cache = rng.standard_normal((2, kv_heads, 12, d)).astype(np.float32)
    q = rng.standard_normal((2, t, heads * d)).astype(np.float32)
    k, v = (rng.standard_normal((2, t, kv_heads * d)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal((1, heads, t, total)).astype(np.float32)
    feed = dict(q=q, k=k, v=v, pk=cache, pv=cache.copy(), seqlens_k=np.array(seqlens, np.int32),
                total=np.array(total, np.int32))

    def reference(window: int, with_bias: bool) -> np.ndarray:
        args = [torch.from_numpy(x) for x in (q, k, v, cache, cache.copy())]
        out = attention_ref(*args, torch.tensor(seqlens, dtype=torch.int32),
                            torch.tensor(total, dtype=torch.int32), None, None, heads, kv_heads,
                            d ** -0.5, window, False, torch.from_numpy(bias) if with_bias else None)
        return out[0].numpy()

    got = _gqa_session(heads, kv_heads, d, 3, False).run(None, feed)[0]
    assert np.abs(got - reference(3, False)).max() <= OP_FP32
    assert np.abs(got - reference(4, False)).max() > 0.01  # w + 1 keys would be wrong
    got = _gqa_session(heads, kv_heads, d, -1, True).run(None, {**feed, "bias": bias})[0]
    assert np.abs(got - reference(-1, True)).max() <= OP_FP32
    assert np.abs(got - reference(-1, False)).max() > 0.01

"""ONNX translations of the custom ops (the decoder's in llm_onnx/modeling/ops.py, the quantized
ones in llm_onnx/export/quant.py): each becomes one ONNX Runtime kernel with the same contract, so
the eager op is the reference the parity tests hold ORT to.

Translations are onnxscript functions (they need return annotations, and contrib ops can only be
emitted from scripted functions). ONNX Runtime registers SimplifiedLayerNormalization in the
default domain at version 1, which onnxscript cannot emit next to opset 18: it is emitted in the
``com.microsoft`` domain here and moved by ``fix_domains`` after export.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import onnx_ir as ir
import onnxscript
import torch
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat
from onnxscript.onnx_types import FLOAT, INT32, INT64, UINT8

from llm_onnx.export import kernel_experts, quant  # noqa: F401  (register torch.ops.llm_onnx.*)
from llm_onnx.export.kv_int8_attention import (
    PROMPT_STEP,
    group_query_attention_int8,
    group_query_attention_int8_steps,
    group_query_attention_int8_steps_packed,
    group_query_attention_int8_steps_rotated,
)
from llm_onnx.export.plain_attention import plain_attention
from llm_onnx.export.vision_translations import vision_translations
from llm_onnx.modeling import linear_attention as _la  # noqa: F401  (its torch.ops.llm_onnx.*)
from llm_onnx.modeling import ops  # noqa: F401  (registers torch.ops.llm_onnx.* of the decoder)

msft = onnxscript.values.Opset("com.microsoft", 1)
op18 = onnxscript.opset18
_here = onnxscript.values.Opset("llm_onnx.translations", 1)


@onnxscript.script(opset=_here)
def rms_norm(x: TFloat, weight: TFloat, eps: float) -> TFloat:
    return msft.SimplifiedLayerNormalization(x, weight, axis=-1, epsilon=eps, stash_type=1)


@onnxscript.script(opset=_here)
def add_rms_norm(x: TFloat, residual: TFloat, weight: TFloat, eps: float) -> tuple[TFloat, TFloat]:
    normed, _mean, _inv_std, total = msft.SkipSimplifiedLayerNormalization(
        x, residual, weight, epsilon=eps)
    return normed, total


@onnxscript.script(opset=_here)
def layer_norm(x: TFloat, weight: TFloat, bias: TFloat, eps: float) -> TFloat:
    return op.LayerNormalization(x, weight, bias, axis=-1, epsilon=eps, stash_type=1)


@onnxscript.script(opset=_here)
def add_layer_norm(x: TFloat, residual: TFloat, weight: TFloat, bias: TFloat,
                   eps: float) -> tuple[TFloat, TFloat]:
    normed, _mean, _inv_std, total = msft.SkipLayerNormalization(x, residual, weight, bias,
                                                                 epsilon=eps)
    return normed, total


# ORT folds the bias Add before either into one kernel (BiasGelu, FastGelu with bias).
@onnxscript.script(opset=_here)
def gelu(x: TFloat) -> TFloat:
    return msft.Gelu(x)


@onnxscript.script(opset=_here)
def fast_gelu(x: TFloat) -> TFloat:
    return msft.FastGelu(x)


@onnxscript.script(opset=_here)
def alibi_bias(input_ids: INT64, total_sequence_length: INT32, slopes: list[float]) -> FLOAT:
    """(1, H, T, S) = slopes (H, 1, 1) * (key (1, S) - query (T, 1)), queries at S-T ... S-1.

    input_ids --Shape[1]--> T          total --Cast--> S
                   Range(S - T, S) --> query (T, 1)
                   Range(0, S) ------> key (1, S)
    slopes (Constant) * (key - query) --Unsqueeze--> (1, H, T, S)
    """
    s = op.Cast(total_sequence_length, to=7)  # int64 scalar
    t = op.Squeeze(op.Shape(input_ids, start=1, end=2))
    one = op.Constant(value_int=1)
    query = op.Cast(op.Range(op.Sub(s, t), s, one), to=1)
    key = op.Cast(op.Range(op.Constant(value_int=0), s, one), to=1)
    rel = op.Sub(op.Unsqueeze(key, op.Constant(value_ints=[0])),
                 op.Unsqueeze(query, op.Constant(value_ints=[1])))  # (T, S)
    per_head = op.Unsqueeze(op.Constant(value_floats=slopes), op.Constant(value_ints=[1, 2]))
    return op.Unsqueeze(op.Mul(per_head, rel), op.Constant(value_ints=[0]))


@onnxscript.script(opset=_here)
def rotary_embedding(x: TFloat, position_ids: INT64, cos_cache: TFloat, sin_cache: TFloat,
                     num_heads: int, interleaved: bool, rotary_dim: int) -> TFloat:
    return msft.RotaryEmbedding(x, position_ids, cos_cache, sin_cache, num_heads=num_heads,
                                interleaved=interleaved, rotary_embedding_dim=rotary_dim)


# One translation for layers with and without RoPE: do_rotary is the op's per call (SmolLM3's
# NoPE layers run beside rotating ones; a model without RoPE passes no cos/sin caches at all).
@onnxscript.script(opset=_here)
def group_query_attention_float(
    query: TFloat, key: Optional[TFloat], value: Optional[TFloat], past_key: TFloat,
    past_value: TFloat, seqlens_k: INT32, total_sequence_length: INT32,
    cos_cache: Optional[TFloat], sin_cache: Optional[TFloat], attention_bias: Optional[TFloat],
    head_sink: Optional[TFloat], num_heads: int, kv_num_heads: int, scale: float,
    local_window_size: int, rotary_interleaved: bool, do_rotary: bool,
) -> tuple[TFloat, TFloat, TFloat]:
    out, present_key, present_value = msft.GroupQueryAttention(
        query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
        cos_cache, sin_cache, None, attention_bias, head_sink, num_heads=num_heads,
        kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size,
        rotary_interleaved=rotary_interleaved, do_rotary=do_rotary)
    return out, present_key, present_value


def group_query_attention(query, key, value, past_key, past_value, seqlens_k,
                          total_sequence_length, cos_cache, sin_cache, num_heads: int,
                          kv_num_heads: int, scale: float, local_window_size: int,
                          rotary_interleaved: bool, do_rotary: bool, attention_bias=None,
                          head_sink=None, k_scale=None, v_scale=None):
    """ops.group_query_attention's contract: the float cache's node, or the int8 cache's when
    the op has scales -- in a graph that may run many tokens, with RoPE inside, the If of
    kv_int8_attention.group_query_attention_int8_steps. Traced (a Python function: the scales'
    presence and the shapes pick the node)."""
    if k_scale is None:
        return group_query_attention_float(
            query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
            cos_cache, sin_cache, attention_bias, head_sink, num_heads=num_heads,
            kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size,
            rotary_interleaved=rotary_interleaved, do_rotary=do_rotary)
    if not do_rotary and key is not None and query.shape[1] != 1:  # RoPE applied before
        return group_query_attention_int8_steps_rotated(
            query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
            attention_bias, head_sink, k_scale, v_scale, num_heads=num_heads,
            kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size,
            prompt_step=PROMPT_STEP)
    if do_rotary and query.shape[1] != 1:  # a graph of many tokens: the float node for them
        common = dict(num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale,
                      local_window_size=local_window_size, rotary_interleaved=rotary_interleaved,
                      rotary_dim=2 * cos_cache.shape[-1], prompt_step=PROMPT_STEP)
        if key is None:  # packed QKV
            d = past_key.shape[-1]
            return group_query_attention_int8_steps_packed(
                query, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
                sin_cache, attention_bias, head_sink, k_scale, v_scale,
                widths=[num_heads * d, kv_num_heads * d, kv_num_heads * d], **common)
        return group_query_attention_int8_steps(
            query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
            cos_cache, sin_cache, attention_bias, head_sink, k_scale, v_scale, **common)
    return group_query_attention_int8(
        query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
        sin_cache, attention_bias, head_sink, k_scale, v_scale, num_heads=num_heads,
        kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size,
        rotary_interleaved=rotary_interleaved, do_rotary=do_rotary)


# MoE/QMoE attributes are all set: some onnxruntime-gpu releases default to GPT-OSS's clamped
# SwiGLU (alpha 1.702, beta 1, limit 7) and newer CUDA QMoE reads a missing weights_prepacked
# as "already in the CUTLASS layout". swiglu_limit 1e999 is +inf (no clamp); weights_prepacked=0
# says the weights are plain block-quantized rows that the kernel packs itself at load.
#
# The nodes always renormalise (normalize_routing_weights=1), because ONNX Runtime 1.31.1's CPU
# kernels get 0 wrong:
# - MoE copies its input only when it renormalises, then zero-fills its output. It is registered
#   MayInplace(0, 0), so when the planner gives the output the input's buffer (in our graphs it
#   does: the normed hidden states are read by no later node), the experts read zeros and the
#   layer adds nothing. A lone node fed from a graph input never runs in place, so it matched.
# - QMoE ignores 0 and renormalises anyway (a softmax over the top-k logits).
# Without renormalisation (norm_topk_prob false) the output is scaled back instead: see moe().
#
# gpt-oss's experts set alpha 1.702, beta 1 and limit 7 and have biases (fc1's interleaved like
# its rows); others silu(gate) * up: alpha 1, beta 0, no limit, no biases.
@onnxscript.script(opset=_here)
def moe_renormalized(x: TFloat, router_logits: TFloat, fc1: TFloat, fc2: TFloat,
                     fc1_bias: Optional[TFloat], fc2_bias: Optional[TFloat], k: int,
                     alpha: float, beta: float, limit: float) -> TFloat:
    return msft.MoE(x, router_logits, fc1, fc1_bias, fc2, fc2_bias, k=k,
                    activation_type="swiglu", swiglu_fusion=1, activation_alpha=alpha,
                    activation_beta=beta, swiglu_limit=limit, normalize_routing_weights=1)


@onnxscript.script(opset=_here)
def qmoe_renormalized(x: TFloat, router_logits: TFloat, fc1_q: UINT8, fc1_scales: TFloat,
                      fc2_q: UINT8, fc2_scales: TFloat, fc1_bias: Optional[TFloat],
                      fc2_bias: Optional[TFloat], fc1_zero_points: Optional[UINT8],
                      fc2_zero_points: Optional[UINT8], k: int, bits: int, block_size: int,
                      accuracy_level: int, alpha: float, beta: float, limit: float) -> TFloat:
    # inputs 8-10 are fc3's (a separate gate weight; swiglu_fusion keeps it in fc1)
    return msft.QMoE(x, router_logits, fc1_q, fc1_scales, fc1_bias, fc2_q, fc2_scales, fc2_bias,
                     None, None, None, fc1_zero_points, fc2_zero_points, k=k,
                     activation_type="swiglu", swiglu_fusion=1, activation_alpha=alpha,
                     activation_beta=beta, swiglu_limit=limit, normalize_routing_weights=1,
                     expert_weight_bits=bits, block_size=block_size, weights_prepacked=0,
                     accuracy_level=accuracy_level)


def unrenormalized(out, router_logits, k: int):
    """A renormalising MoE node's output scaled back to weights that are the softmax
    probabilities themselves: sum_i p_i y_i = S * sum_i (p_i / S) y_i, S the top-k mass.

        router_logits (N, E) --Cast fp32--Softmax--TopK k--ReduceSum--> S (N, 1)
                                                                        | CastLike
        out (N, D), renormalised -------------------------------------- Mul --> (N, D)

    S is the sum of the k largest probabilities, whichever of two tied experts the kernel
    picks. ORT's kernels also compute the softmax in fp32."""
    probs = op18.Softmax(op18.Cast(router_logits, to=ir.DataType.FLOAT), axis=-1)
    top, _ = op18.TopK(probs, op18.Constant(value_ints=[k]), axis=-1)
    mass = op18.ReduceSum(top, op18.Constant(value_ints=[-1]), keepdims=1)
    return op18.Mul(out, op18.CastLike(mass, out))


def moe(x, router_logits, fc1, fc2, k: int, normalize_routing_weights: bool, fc1_bias=None,
        fc2_bias=None, alpha: float = 1.0, beta: float = 0.0, limit: float | None = None):
    """ops.moe_ref's contract. Traced (a Python function: the flag picks the subgraph)."""
    out = moe_renormalized(x, router_logits, fc1, fc2, fc1_bias, fc2_bias, k=k, alpha=alpha,
                           beta=beta, limit=1e999 if limit is None else limit)
    return out if normalize_routing_weights else unrenormalized(out, router_logits, k)


@onnxscript.script(opset=_here)
def matmul_transposed(x: TFloat, weight: TFloat) -> TFloat:
    return msft.FusedMatMul(x, weight, transA=0, transB=1, alpha=1.0)


@onnxscript.script(opset=_here)
def matmul_nbits(x: TFloat, qweight: UINT8, scales: TFloat, zero_points: Optional[UINT8],
                 bias: Optional[TFloat], k: int, n: int, bits: int, block_size: int,
                 accuracy_level: int) -> TFloat:
    return msft.MatMulNBits(x, qweight, scales, zero_points, None, bias, K=k, N=n, bits=bits,
                            block_size=block_size, accuracy_level=accuracy_level)


@onnxscript.script(opset=_here)
def matmul_nbits_offset(x: TFloat, qweight: UINT8, scales: TFloat, zero_points: UINT8,
                        block_ones: TFloat, minimums_t: TFloat, bias: Optional[TFloat], k: int,
                        n: int, bits: int, block_size: int, accuracy_level: int) -> TFloat:
    # x --MatMulNBits(codes * scale)--> y --Add--> out
    # x --MatMul(block_ones)--> block sums --MatMul(minimums_t)-^
    y = msft.MatMulNBits(x, qweight, scales, zero_points, None, bias, K=k, N=n, bits=bits,
                         block_size=block_size, accuracy_level=accuracy_level)
    return op18.Add(y, op18.MatMul(op18.MatMul(x, block_ones), minimums_t))


@onnxscript.script(opset=_here)
def gather_nbits(qweight: UINT8, ids: INT64, scales: TFloat, k: int, bits: int,
                 block_size: int) -> TFloat:
    return msft.GatherBlockQuantized(qweight, ids, scales, bits=bits, block_size=block_size,
                                     quantize_axis=1, gather_axis=0)


def qmoe(x, router_logits, fc1_q, fc1_scales, fc2_q, fc2_scales, k: int,
         normalize_routing_weights: bool, bits: int, block_size: int, accuracy_level: int = 0,
         fc1_bias=None, fc2_bias=None, alpha: float = 1.0, beta: float = 0.0,
         limit: float | None = None, fc1_zero_points=None, fc2_zero_points=None):
    """quant.qmoe's contract. Traced, as moe()."""
    out = qmoe_renormalized(x, router_logits, fc1_q, fc1_scales, fc2_q, fc2_scales, fc1_bias,
                            fc2_bias, fc1_zero_points, fc2_zero_points, k=k, bits=bits, block_size=block_size,
                            accuracy_level=accuracy_level, alpha=alpha, beta=beta,
                            limit=1e999 if limit is None else limit)
    return out if normalize_routing_weights else unrenormalized(out, router_logits, k)


def geglu_experts_nbits(x, index, weight, gate_up_q, gate_up_scales, down_q, down_scales,
                        bits: int, block_up: int, block_down: int, accuracy_level: int):
    """quant.geglu_experts_nbits's contract: only the chosen experts run. Traced (the expert count
    is the length of the weight lists).

        chosen (N, E) int64: 1 where a row chose expert e (ScatterElements of ones at index)
        an If per expert, taken when its column of chosen has a 1: the rows that chose it
            (NonZero), gathered, MatMulNBits (D -> 2I), FastGelu(gate) * up, MatMulNBits
            (I -> D) --> (M_e, D); otherwise (0, D)
        the Ifs' outputs concatenated (P, D), by expert, then row: the pair (row r, expert e)
        sits at the rows before r that chose e plus the pairs of experts before e (two
        exclusive CumSums over chosen), so each (row, slot) of index gathers its expert's
        output --> (N, K, D), times its routing weight in fp32, summed over K

    (Not a ScatterND with reduction="add" of the pairs into (N, D): ONNX Runtime 1.31's CPU
    kernel adds duplicate indices from several threads and lost updates at 2 threads.)
    Chosen experts only: a decode step of Gemma 4 26B-A4B's expert shape (E = 128, top 8, int4,
    one layer, 2 threads) took 1.2 ms, against 15 ms for every expert densely; 512 tokens
    119 ms against 1.6 s (benchmarks/gemma4_experts.py)."""
    count = len(gate_up_q)
    d = down_q[0].shape[0]
    two_i = gate_up_q[0].shape[0]
    axis0 = op18.Constant(value_ints=[0])
    n_by_e = op18.Concat(op18.Shape(x, start=0, end=1), op18.Constant(value_ints=[count]), axis=0)
    zeros = op18.ConstantOfShape(n_by_e, value=ir.tensor(np.zeros(1, np.int64)))  # (N, E)
    chosen = op18.ScatterElements(zeros, index, op18.Expand(op18.Constant(value_int=1),
                                                            op18.Shape(index)), axis=1)
    counts = op18.ReduceSum(chosen, axis0, keepdims=0)  # (E,) rows per expert
    taken = op18.Cast(counts, to=ir.DataType.BOOL)
    conds = op18.Split(taken, axis=0, num_outputs=count) if count > 1 else [taken]
    position = op18.Add(op18.CumSum(chosen, op18.Constant(value_int=0), exclusive=1),
                        op18.CumSum(counts, op18.Constant(value_int=0), exclusive=1))  # (N, E)
    slots = op18.GatherElements(position, index, axis=1)  # (N, K): rows of the concatenation
    outs = [op18.If(conds[e], then_branch=_expert_branch(
                x, chosen, e, gate_up_q[e], gate_up_scales[e], down_q[e], down_scales[e], d,
                two_i, bits, block_up, block_down, accuracy_level),
            else_branch=_no_rows(x, d, gate_up_q[e].name))
            for e in range(count)]
    ys = op18.Gather(op18.Concat(*outs, axis=0), slots, axis=0)  # (N, K, D)
    weighted = op18.Mul(op18.Cast(ys, to=ir.DataType.FLOAT),
                        op18.Unsqueeze(weight, op18.Constant(value_ints=[2])))
    return op18.CastLike(op18.ReduceSum(weighted, op18.Constant(value_ints=[1]), keepdims=0), x)


def _expert_branch(x, chosen, e: int, gu_q, gu_s, dn_q, dn_s, d: int, two_i: int, bits: int,
                   block_up: int, block_down: int, accuracy_level: int) -> ir.Graph:
    """Expert e on the rows that chose it: (M, D) -> (M, D), a graph reading the outer scope."""
    tag = gu_q.name  # unique per layer and expert: names the branch's nodes and values
    nodes: list[ir.Node] = []

    def node(op_type: str, inputs: list, domain: str = "", **attributes) -> ir.Value:
        n = ir.node(op_type, inputs, attributes=attributes, domain=domain,
                    name=f"{tag}/{len(nodes)}_{op_type}")
        n.outputs[0].name = f"{tag}/{len(nodes)}"
        nodes.append(n)
        return n.outputs[0]

    def nbits(a, q, s, k: int, n: int, block: int) -> ir.Value:
        return node("MatMulNBits", [a, q, s], "com.microsoft", K=k, N=n, bits=bits,
                    block_size=block, accuracy_level=accuracy_level)

    column = node("Gather", [chosen, node("Constant", [], value=ir.tensor(np.array(e, np.int64)))],
                  axis=1)  # (N,)
    rows = node("Reshape", [node("NonZero", [column]),
                            node("Constant", [], value=ir.tensor(np.array([-1], np.int64)))])
    h = nbits(node("Gather", [x, rows], axis=0), gu_q, gu_s, d, two_i, block_up)  # (M, 2I)
    halves = ir.node("Split", [h], attributes={"axis": 1, "num_outputs": 2},
                     num_outputs=2, name=f"{tag}/{len(nodes)}_Split")
    for j, v in enumerate(halves.outputs):
        v.name = f"{tag}/{len(nodes)}.{j}"
    nodes.append(halves)
    gate, up = halves.outputs
    act = node("Mul", [node("FastGelu", [gate], "com.microsoft"), up])
    y = nbits(act, dn_q, dn_s, two_i // 2, d, block_down)  # (M, D)
    return ir.Graph([], [y], nodes=nodes, name=f"{tag}/chosen")


def _no_rows(x, d: int, tag: str) -> ir.Graph:
    """No row chose the expert: (0, D) in x's dtype."""
    dtype = x.dtype.numpy() if x.dtype is not None else np.float32
    n = ir.node("Constant", [], attributes={"value": ir.tensor(np.zeros((0, d), dtype))},
                name=f"{tag}/none")
    n.outputs[0].name = f"{tag}/none"
    return ir.Graph([], [n.outputs[0]], nodes=[n], name=f"{tag}/not_chosen")


# Gated DeltaNet (llm_onnx/modeling/linear_attention.py). LinearAttention maps value head h to key
# head h // (Hv / Hk) itself (the key head count is read off the key's width), takes the decay in
# log space and scales by 1/sqrt(d_k) when scale is 0; it does not L2-normalise q and k (the
# graph does, before). Its state may be bound in place: the kernel copies past to present first.
@onnxscript.script(opset=_here)
def linear_attention(q: FLOAT, k: FLOAT, v: FLOAT, past_state: FLOAT, g: FLOAT, beta: FLOAT,
                     num_key_heads: int, num_value_heads: int,
                     scale: float) -> tuple[FLOAT, FLOAT]:
    out, present = msft.LinearAttention(q, k, v, past_state, g, beta, q_num_heads=num_key_heads,
                                        kv_num_heads=num_value_heads, update_rule="gated_delta",
                                        scale=scale)
    return out, present


# epsilon always set: the kernel's default (1e-5) is not Qwen3.5's (1e-6), and on small
# activations the difference is large.
@onnxscript.script(opset=_here)
def gated_rms_norm(x: FLOAT, gate: FLOAT, weight: FLOAT, eps: float) -> FLOAT:
    return msft.GatedRMSNorm(x, weight, gate, activation="silu", epsilon=eps)


@onnxscript.script(opset=_here)
def swiglu(gate_up: TFloat) -> TFloat:
    gate, up = op18.Split(gate_up, axis=-1, num_outputs=2)
    return op18.Mul(op18.Mul(gate, op18.Sigmoid(gate)), up)  # ORT fuses x*sigmoid(x): QuickGelu


def translation_table() -> dict:
    """torch op -> ONNX translation, for torch.onnx.export(custom_translation_table=...)."""
    t = torch.ops.llm_onnx
    return {
        t.rms_norm.default: rms_norm,
        t.add_rms_norm.default: add_rms_norm,
        t.layer_norm.default: layer_norm,
        t.add_layer_norm.default: add_layer_norm,
        t.gelu.default: gelu,
        t.fast_gelu.default: fast_gelu,
        t.alibi_bias.default: alibi_bias,
        t.rotary_embedding.default: rotary_embedding,
        t.group_query_attention.default: group_query_attention,
        t.plain_attention.default: plain_attention,
        t.moe.default: moe,
        t.matmul_transposed.default: matmul_transposed,
        t.swiglu.default: swiglu,
        t.linear_attention.default: linear_attention,
        t.gated_rms_norm.default: gated_rms_norm,
        t.matmul_nbits.default: matmul_nbits,
        t.matmul_nbits_offset.default: matmul_nbits_offset,
        t.gather_nbits.default: gather_nbits,
        t.qmoe.default: qmoe,
        t.geglu_experts_nbits.default: geglu_experts_nbits,
        **kernel_experts.translations(),  # llm-onnx's own operators (llm_onnx/kernels)
        **vision_translations(),
    }


# ONNX Runtime registers these contrib ops in the default ONNX domain, not com.microsoft.
_DEFAULT_DOMAIN_OPS = {"SimplifiedLayerNormalization"}


def fix_domains(model: ir.Model) -> None:
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.domain == "com.microsoft" and node.op_type in _DEFAULT_DOMAIN_OPS:
            node.domain = ""


__all__ = ["fix_domains", "translation_table"]

"""ONNX translations of the decoder's attention over an int8 KV cache (``--kv-cache int8``): the
int8 GroupQueryAttention node, and for graphs whose steps may run many tokens an If that sends a
long step through the float node over the cache read back (custom_ops.group_query_attention
picks them). docs/notes/kv-int8-gqa.md has the kernel's contract and the measurements."""

from __future__ import annotations

from typing import Optional

import onnx
import onnx_ir as ir
import onnxscript
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat
from onnxscript.onnx_types import FLOAT, INT8, INT32, INT64

msft = onnxscript.values.Opset("com.microsoft", 1)
_here = onnxscript.values.Opset("llm_onnx.translations", 1)  # custom_ops' domain (one object)


# An int8 cache: k_scale and v_scale are inputs 12 and 13 (float32, (Hkv*D,) KV-head-major),
# K and V share one quant type on the CPU, and kv_cache_bit_width is required (it defaults to
# 0, and the node then fails at its first run). docs/notes/kv-int8-gqa.md has the contract.
@onnxscript.script(opset=_here)
def group_query_attention_int8(
    query: TFloat, key: Optional[TFloat], value: Optional[TFloat], past_key: INT8,
    past_value: INT8, seqlens_k: INT32, total_sequence_length: INT32,
    cos_cache: Optional[TFloat], sin_cache: Optional[TFloat], attention_bias: Optional[TFloat],
    head_sink: Optional[TFloat], k_scale: FLOAT, v_scale: FLOAT, num_heads: int,
    kv_num_heads: int, scale: float, local_window_size: int, rotary_interleaved: bool,
    do_rotary: bool,
) -> tuple[TFloat, INT8, INT8]:
    out, present_key, present_value = msft.GroupQueryAttention(
        query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
        cos_cache, sin_cache, None, attention_bias, head_sink, k_scale, v_scale,
        num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale,
        local_window_size=local_window_size, rotary_interleaved=rotary_interleaved,
        do_rotary=do_rotary, k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL",
        kv_cache_bit_width=8)
    return out, present_key, present_value


# The same contract for a graph whose steps may run many tokens (prefill.onnx, which also
# serves decode): a step of fewer than PROMPT_STEP tokens runs the int8 node above; a longer one
# (a prompt, a chunk) computes what that node computes -- RoPE on q and k, the new keys and
# values written as clip(rint(x * (1/s)), -128, 127), every position read back as cache * s --
# but attends with ONNX Runtime's float node, over the cache's first total - T positions read
# back and the new tokens' keys and values read back, and writes the new int8 rows with
# ScatterElements (in place: it skips the copy when present is bound to past). ONNX Runtime
# 1.31.1's and 1.32.0's int8 node attends over many new tokens 3-7x slower than its float node
# (one SmolLM2 layer, 2,048 tokens: 131 against 20 ms), which made a prompt 4.5x slower to
# prefill. Reading the past back costs what the int8 node saves on short steps: at 6,000
# positions the two are level at 16 new tokens; with 2-8 (a verify step) the float path takes
# about 1.4 ms a layer more, with 64 about 9 ms less. docs/notes/kv-int8-gqa.md has the figures.
PROMPT_STEP = 16


@onnxscript.script(opset=_here)
def int8_cache_step_positions(query: TFloat, seqlens_k: INT32,
                              total_sequence_length: INT32) -> INT64:
    """The new tokens' positions (1, T), as ops.token_positions: 0 .. T-1 in a first prompt
    (rows right-padded), else seqlens_k + 1 - T + t."""
    t = op.Shape(query, start=1, end=2)  # (1,) int64: T
    total = op.Reshape(op.Cast(total_sequence_length, to=7), op.Constant(value_ints=[1]))
    steps = op.Unsqueeze(op.Range(op.Constant(value_int=0), op.Squeeze(t),
                                  op.Constant(value_int=1)), op.Constant(value_ints=[0]))
    later = op.Add(op.Unsqueeze(op.Sub(op.Add(op.Cast(seqlens_k, to=7),
                                              op.Constant(value_int=1)), t),
                                op.Constant(value_ints=[1])), steps)
    return op.Max(op.Where(op.Equal(total, t), steps, later), op.Constant(value_int=0))


@onnxscript.script(opset=_here)
def int8_cache_attend(
    query: TFloat, key: TFloat, value: TFloat, pos: INT64, past_key: INT8, past_value: INT8,
    seqlens_k: INT32, total_sequence_length: INT32, attention_bias: Optional[TFloat],
    head_sink: Optional[TFloat], k_scale: FLOAT, v_scale: FLOAT, num_heads: int,
    kv_num_heads: int, scale: float, local_window_size: int,
) -> tuple[TFloat, INT8, INT8]:
    """A long step's attention over an int8 cache, queries and keys already rotated as the
    cache stores them, ``pos`` the new tokens' positions (int8_cache_step_positions)."""
    t = op.Shape(query, start=1, end=2)  # (1,) int64: T
    total = op.Reshape(op.Cast(total_sequence_length, to=7), op.Constant(value_ints=[1]))
    # the new keys and values rounded as the int8 node rounds them and read back, in their own
    # (B, T, Hkv*D) layout: the scales (Hkv*D,) are in that order
    lo = op.Constant(value_float=-128.0)
    hi = op.Constant(value_float=127.0)
    k8 = op.Cast(op.Clip(op.Round(op.Mul(op.Cast(key, to=1), op.Reciprocal(k_scale))), lo, hi),
                 to=3)
    v8 = op.Cast(op.Clip(op.Round(op.Mul(op.Cast(value, to=1), op.Reciprocal(v_scale))), lo,
                         hi), to=3)
    k_read = op.CastLike(op.Mul(op.Cast(k8, to=1), k_scale), query)
    v_read = op.CastLike(op.Mul(op.Cast(v8, to=1), v_scale), query)
    # the cache's first total - T positions read back, (B, Hkv, P, D)
    head = op.Shape(past_key, start=3, end=4)  # (D,)
    kv_heads = op.Shape(past_key, start=1, end=2)  # (Hkv,)
    per_channel = op.Concat(op.Constant(value_ints=[1]), kv_heads, op.Constant(value_ints=[1]),
                            head, axis=0)  # (1, Hkv, 1, D)
    zero = op.Constant(value_ints=[0])
    axis = op.Constant(value_ints=[2])
    past_len = op.Sub(total, t)
    past_k = op.CastLike(op.Mul(op.Cast(op.Slice(past_key, zero, past_len, axis), to=1),
                                op.Reshape(k_scale, per_channel)), query)
    past_v = op.CastLike(op.Mul(op.Cast(op.Slice(past_value, zero, past_len, axis), to=1),
                                op.Reshape(v_scale, per_channel)), query)
    out, _k, _v = msft.GroupQueryAttention(
        query, k_read, v_read, past_k, past_v, seqlens_k, total_sequence_length, None, None,
        None, attention_bias, head_sink, num_heads=num_heads, kv_num_heads=kv_num_heads,
        scale=scale, local_window_size=local_window_size, do_rotary=0)
    # the new int8 rows into the cache at the tokens' positions: (B, T, Hkv*D) -> (B, Hkv, T, D)
    split = op.Concat(op.Shape(key, start=0, end=2), kv_heads, head, axis=0)  # (B, T, Hkv, D)
    rows_k = op.Transpose(op.Reshape(k8, split), perm=[0, 2, 1, 3])
    rows_v = op.Transpose(op.Reshape(v8, split), perm=[0, 2, 1, 3])
    where = op.Expand(op.Unsqueeze(pos, op.Constant(value_ints=[1, 3])), op.Shape(rows_k))
    present_key = op.ScatterElements(past_key, where, rows_k, axis=2)
    present_value = op.ScatterElements(past_value, where, rows_v, axis=2)
    return out, present_key, present_value


@onnxscript.script(opset=_here)
def int8_cache_prompt_step(
    query: TFloat, key: TFloat, value: TFloat, past_key: INT8, past_value: INT8,
    seqlens_k: INT32, total_sequence_length: INT32, cos_cache: TFloat, sin_cache: TFloat,
    attention_bias: Optional[TFloat], head_sink: Optional[TFloat], k_scale: FLOAT,
    v_scale: FLOAT, num_heads: int, kv_num_heads: int, scale: float, local_window_size: int,
    rotary_interleaved: bool, rotary_dim: int,
) -> tuple[TFloat, INT8, INT8]:
    pos = int8_cache_step_positions(query, seqlens_k, total_sequence_length)
    q = msft.RotaryEmbedding(query, pos, cos_cache, sin_cache, interleaved=rotary_interleaved,
                             num_heads=num_heads, rotary_embedding_dim=rotary_dim)
    k = msft.RotaryEmbedding(key, pos, cos_cache, sin_cache, interleaved=rotary_interleaved,
                             num_heads=kv_num_heads, rotary_embedding_dim=rotary_dim)
    out, present_key, present_value = int8_cache_attend(
        q, k, value, pos, past_key, past_value, seqlens_k, total_sequence_length,
        attention_bias, head_sink, k_scale, v_scale, num_heads=num_heads,
        kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size)
    return out, present_key, present_value


# q, k, v separate; RoPE (and the keys' rotation) applied before the node: the attention
# module's form for an int8 cache whose keys are stored in the Hadamard basis, and the rotary
# outside form
@onnxscript.script(opset=_here)
def group_query_attention_int8_steps_rotated(
    query: TFloat, key: TFloat, value: TFloat, past_key: INT8, past_value: INT8,
    seqlens_k: INT32, total_sequence_length: INT32, attention_bias: Optional[TFloat],
    head_sink: Optional[TFloat], k_scale: FLOAT, v_scale: FLOAT, num_heads: int,
    kv_num_heads: int, scale: float, local_window_size: int, prompt_step: int,
) -> tuple[TFloat, INT8, INT8]:
    if op.GreaterOrEqual(op.Squeeze(op.Shape(query, start=1, end=2)),
                         op.Constant(value_int=prompt_step)):
        pos = int8_cache_step_positions(query, seqlens_k, total_sequence_length)
        out, present_key, present_value = int8_cache_attend(
            query, key, value, pos, past_key, past_value, seqlens_k, total_sequence_length,
            attention_bias, head_sink, k_scale, v_scale, num_heads=num_heads,
            kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size)
    else:
        out, present_key, present_value = group_query_attention_int8(
            query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
            None, None, attention_bias, head_sink, k_scale, v_scale, num_heads=num_heads,
            kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size,
            rotary_interleaved=False, do_rotary=False)
    return out, present_key, present_value


# q, k, v separate; RoPE inside
@onnxscript.script(opset=_here)
def group_query_attention_int8_steps(
    query: TFloat, key: TFloat, value: TFloat, past_key: INT8, past_value: INT8,
    seqlens_k: INT32, total_sequence_length: INT32, cos_cache: TFloat, sin_cache: TFloat,
    attention_bias: Optional[TFloat], head_sink: Optional[TFloat], k_scale: FLOAT,
    v_scale: FLOAT, num_heads: int, kv_num_heads: int, scale: float, local_window_size: int,
    rotary_interleaved: bool, rotary_dim: int, prompt_step: int,
) -> tuple[TFloat, INT8, INT8]:
    if op.GreaterOrEqual(op.Squeeze(op.Shape(query, start=1, end=2)),
                         op.Constant(value_int=prompt_step)):
        out, present_key, present_value = int8_cache_prompt_step(
            query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
            cos_cache, sin_cache, attention_bias, head_sink, k_scale, v_scale,
            num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale,
            local_window_size=local_window_size, rotary_interleaved=rotary_interleaved,
            rotary_dim=rotary_dim)
    else:
        out, present_key, present_value = group_query_attention_int8(
            query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
            cos_cache, sin_cache, attention_bias, head_sink, k_scale, v_scale,
            num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale,
            local_window_size=local_window_size, rotary_interleaved=rotary_interleaved,
            do_rotary=True)
    return out, present_key, present_value


# packed QKV in query (B, T, (H + 2*Hkv)*D), split only for a long step; RoPE inside. A second
# function, not a flag: a script cannot test whether an optional input is given, and splitting
# outside the If would cost every decode step a Split.
@onnxscript.script(opset=_here)
def group_query_attention_int8_steps_packed(
    query: TFloat, past_key: INT8, past_value: INT8, seqlens_k: INT32,
    total_sequence_length: INT32, cos_cache: TFloat, sin_cache: TFloat,
    attention_bias: Optional[TFloat], head_sink: Optional[TFloat], k_scale: FLOAT,
    v_scale: FLOAT, num_heads: int, kv_num_heads: int, scale: float, local_window_size: int,
    rotary_interleaved: bool, rotary_dim: int, prompt_step: int, widths: list[int],
) -> tuple[TFloat, INT8, INT8]:
    if op.GreaterOrEqual(op.Squeeze(op.Shape(query, start=1, end=2)),
                         op.Constant(value_int=prompt_step)):
        q, k, v = op.Split(query, op.Constant(value_ints=widths), axis=-1)
        out, present_key, present_value = int8_cache_prompt_step(
            q, k, v, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
            sin_cache, attention_bias, head_sink, k_scale, v_scale, num_heads=num_heads,
            kv_num_heads=kv_num_heads, scale=scale, local_window_size=local_window_size,
            rotary_interleaved=rotary_interleaved, rotary_dim=rotary_dim)
    else:
        out, present_key, present_value = group_query_attention_int8(
            query, None, None, past_key, past_value, seqlens_k, total_sequence_length,
            cos_cache, sin_cache, attention_bias, head_sink, k_scale, v_scale,
            num_heads=num_heads, kv_num_heads=kv_num_heads, scale=scale,
            local_window_size=local_window_size, rotary_interleaved=rotary_interleaved,
            do_rotary=True)
    return out, present_key, present_value


def inline_branch_calls(model: ir.Model) -> None:
    """The translations that a translation calls inside an If's branches (the int8 cache's step
    functions), inlined: the exporter inlines the functions it registered but not those, which
    would be left as calls of unknown ops."""
    from onnx_ir.passes.common import InlinePass

    nested = {f.name: f for f in (int8_cache_prompt_step, group_query_attention_int8,
                                  int8_cache_step_positions, int8_cache_attend)}
    called = {node.op_type for node in ir.traversal.RecursiveGraphIterator(model.graph)
              if node.domain == _here.domain and node.op_type in nested}
    if not called:
        return
    todo = list(called)  # and the functions those call
    while todo:
        for n in nested[todo.pop()].to_function_proto().node:
            if n.domain == _here.domain and n.op_type in nested and n.op_type not in called:
                called.add(n.op_type)
                todo.append(n.op_type)
    for name in sorted(called):
        proto = nested[name].to_function_proto()
        if msft.domain not in {o.domain for o in proto.opset_import}:  # used in branches only
            proto.opset_import.append(onnx.helper.make_opsetid(msft.domain, 1))
        function = ir.serde.deserialize_function(proto)
        # written against opset 18; its ops mean the same at the model's (the exporter's 20)
        function.opset_imports[""] = model.opset_imports[""]
        model.functions[function.identifier()] = function
    InlinePass()(model)

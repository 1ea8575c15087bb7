"""The ONNX translation of ``plain_attention`` (modeling/ops.py): GroupQueryAttention's contract
in plain ONNX ops, for the head sizes its kernel refuses and for the layers where an image's tokens
see each other both ways (``attend_until``), which the kernel cannot express."""

from __future__ import annotations

import onnx_ir as ir
import onnxscript

op18 = onnxscript.opset18


def plain_attention(query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                    positions, num_heads: int, kv_num_heads: int, scale: float,
                    local_window_size: int, attention_bias=None, head_sink=None,
                    attend_until=None):
    """GroupQueryAttention's contract (ops.attention_ref, no RoPE) in plain ONNX ops, for the
    head sizes its kernel refuses. Traced (a Python function: the shapes are Python ints here).

        key, value (B, T, Hkv*D) --> (B, Hkv, T, D) --ScatterElements at positions--> present
        present[:, :, :S] (S = total_sequence_length, not the buffer's length) = keys, values
        query (B, T, H*D) --> (B, Hkv, G*T, D): the G query heads sharing a KV head as rows
        scores = query @ keys^T * scale, (B, Hkv, G, T, S) + bias; masked where a key is past
        the query's position (or its attend_until), the row's length or the window; softmax
        (a query seeing no key: zeros, as attention_ref); @ values --> (B, T, H*D)
        head_sink (H,) (gpt-oss): a column (B, Hkv, G, T, 1) concatenated to the scores before
        the softmax and sliced off after it

    The cache is written with ScatterElements, which leaves the rest of the buffer as it is and
    skips its copy when the runtime binds present to past (one buffer, as for GQA)."""
    group = num_heads // kv_num_heads
    i64 = ir.DataType.INT64
    b_t = op18.Shape(query, start=0, end=2)  # (B, T)
    head = op18.Shape(past_key, start=3, end=4)  # (D,)

    def const(values: list[int]):
        return op18.Constant(value_ints=values)

    def heads(x, n: int):  # (B, T, n*D) -> (B, n, T, D)
        return op18.Transpose(op18.Reshape(x, op18.Concat(b_t, const([n]), head, axis=0)),
                              perm=[0, 2, 1, 3])

    k, v = heads(key, kv_num_heads), heads(value, kv_num_heads)
    where = op18.Expand(op18.Unsqueeze(positions, const([1, 3])), op18.Shape(k))
    present_key = op18.ScatterElements(past_key, where, op18.CastLike(k, past_key), axis=2)
    present_value = op18.ScatterElements(past_value, where, op18.CastLike(v, past_value), axis=2)
    total = op18.Reshape(op18.Cast(total_sequence_length, to=i64), const([1]))
    keys = op18.Cast(op18.Slice(present_key, const([0]), total, const([2])), to=1)  # (B,Hkv,S,D)
    values = op18.Cast(op18.Slice(present_value, const([0]), total, const([2])), to=1)
    # (B, T, H*D) -> (B, T, Hkv, G, D) -> (B, Hkv, G, T, D) -> (B, Hkv, G*T, D)
    q = op18.Reshape(query, op18.Concat(b_t, const([kv_num_heads, group]), head, axis=0))
    q = op18.Transpose(op18.Cast(q, to=1), perm=[0, 2, 3, 1, 4])
    q = op18.Reshape(q, op18.Concat(const([0, 0, -1]), head, axis=0))
    scores = op18.Mul(op18.MatMul(q, op18.Transpose(keys, perm=[0, 1, 3, 2])),
                      op18.Constant(value_float=scale))  # (B, Hkv, G*T, S)
    b, t = op18.Slice(b_t, const([0]), const([1])), op18.Slice(b_t, const([1]), const([2]))
    grouped = op18.Concat(b, const([kv_num_heads, group]), t, const([-1]), axis=0)
    scores = op18.Reshape(scores, grouped)  # (B, Hkv, G, T, S)
    if attention_bias is not None:  # (1, H, T, S)
        bias = op18.Reshape(attention_bias, op18.Concat(
            const([1, kv_num_heads, group]), op18.Shape(attention_bias, start=2), axis=0))
        scores = op18.Add(scores, op18.Cast(bias, to=1))
    # visible (B, T, S): key position <= query position (or attend_until: an image's tokens see
    # their whole image) and <= the row's last, within the window
    kpos = op18.Range(op18.Constant(value_int=0), op18.Squeeze(total), op18.Constant(value_int=1))
    query_pos = op18.Unsqueeze(positions, const([2]))  # (B, T, 1)
    limit = query_pos if attend_until is None else op18.Max(query_pos, op18.Unsqueeze(
        op18.Cast(attend_until, to=i64), const([2])))
    last = op18.Unsqueeze(op18.Cast(seqlens_k, to=i64), const([1, 2]))  # (B, 1, 1)
    visible = op18.And(op18.LessOrEqual(kpos, limit), op18.LessOrEqual(kpos, last))
    if local_window_size > 0:
        first = op18.Sub(query_pos, op18.Constant(value_int=local_window_size))
        visible = op18.And(visible, op18.Greater(kpos, first))
    visible = op18.Unsqueeze(visible, const([1, 2]))  # (B, 1, 1, T, S)
    scores = op18.Where(visible, scores, op18.Constant(value_float=float("-inf")))
    if head_sink is not None:  # (H,) -> (1, Hkv, G, 1, 1) -> (B, Hkv, G, T, 1)
        sink = op18.Reshape(op18.Cast(head_sink, to=1), const([1, kv_num_heads, group, 1, 1]))
        column = op18.Concat(op18.Shape(scores, start=0, end=4), const([1]), axis=0)
        scores = op18.Concat(scores, op18.Expand(sink, column), axis=-1)
        probs = op18.Softmax(scores, axis=-1)
        probs = op18.Slice(probs, const([0]), total, const([4]))  # the sink's share dropped
    else:
        probs = op18.Softmax(scores, axis=-1)
    probs = op18.Where(op18.IsNaN(probs), op18.Constant(value_float=0.0), probs)
    probs = op18.Reshape(probs, op18.Concat(b, const([kv_num_heads, -1]), op18.Shape(probs, start=4),
                                            axis=0))  # (B, Hkv, G*T, S)
    out = op18.MatMul(probs, values)  # (B, Hkv, G*T, D)
    out = op18.Reshape(out, op18.Concat(b, const([kv_num_heads, group]), t, head, axis=0))
    out = op18.Transpose(out, perm=[0, 3, 1, 2, 4])  # (B, T, Hkv, G, D)
    out = op18.Reshape(out, op18.Concat(b_t, const([-1]), axis=0))
    return op18.CastLike(out, query), present_key, present_value


__all__ = ["plain_attention"]

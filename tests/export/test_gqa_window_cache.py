"""ONNX Runtime's CPU GroupQueryAttention with ``sliding_window_cache=1``: a windowed layer's KV
buffers hold C >= W positions (W = local_window_size) instead of the whole context, and the op
evicts by itself (issue 42 asks whether this works and what it saves; no export uses it yet).

Pinned here against a numpy reference of sliding-window attention with RoPE at absolute
positions, for a prompt, single tokens and multi-token steps far past the capacity:
- the outputs equal full-length-cache attention over the last W positions;
- after a step, rows [0, L(T)) of the buffers hold positions T - L .. T - 1 in order, where
  L(T) = T for T <= C, else T - G * ceil((T - C) / G) with G = C - W + 1 (the operator's
  documented layout: compaction every G steps, never a ring);
- C < W is refused.
So a windowed layer's cache costs C positions: for gpt-oss's 128-token window at a 32k context,
a 256th of the full buffer."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.export.test_gqa_int8_cache import gqa_node_session

H, HKV, D = 4, 2, 32  # query heads, KV heads, head size
W = 6  # local_window_size: each query sees itself and the W - 1 positions before it
MAX_POS = 64  # RoPE tables (absolute positions)


def session(capacity_window: bool):
    cache = ["B", HKV, "C", D]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("query", f, ["B", "T", H * D]),
              *(helper.make_tensor_value_info(n, f, ["B", "T", HKV * D]) for n in ("key", "value")),
              *(helper.make_tensor_value_info(n, f, cache) for n in ("past_key", "past_value")),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              *(helper.make_tensor_value_info(n, f, [MAX_POS, D // 2])
                for n in ("cos_cache", "sin_cache"))]
    attrs = dict(num_heads=H, kv_num_heads=HKV, do_rotary=1, local_window_size=W)
    if capacity_window:
        attrs["sliding_window_cache"] = 1
    node = helper.make_node("GroupQueryAttention", [i.name for i in inputs],
                            ["output", "present_key", "present_value"], domain="com.microsoft",
                            **attrs)
    return gqa_node_session(node, inputs, f, cache)


def rope_tables():
    angles = np.outer(np.arange(MAX_POS), 1.0 / 10_000.0 ** (np.arange(0, D, 2) / D))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rope(x, pos):  # x (T, N, D) at absolute positions pos, rotate-half
    cos, sin = (a[pos][:, None, :] for a in rope_tables())
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def reference(q, k, v, window: int = W):
    """Every position's output over all tokens at once: causal, each query over its last
    ``window`` positions (itself included); plus the rotated keys (Hkv, N, D) and values."""
    n = q.shape[0]
    pos = np.arange(n)
    q4 = rope(q.reshape(n, H, D).astype(np.float64), pos)
    k4 = rope(k.reshape(n, HKV, D).astype(np.float64), pos)
    v4 = v.reshape(n, HKV, D).astype(np.float64)
    kf, vf = (np.repeat(x.transpose(1, 0, 2), H // HKV, axis=0) for x in (k4, v4))
    scores = np.einsum("thd,hpd->htp", q4, kf) / np.sqrt(D)
    seen = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    scores = np.where(seen[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("htp,hpd->thd", probs, vf).reshape(n, H * D)
    return out, k4.transpose(1, 0, 2), v4.transpose(1, 0, 2)


def resident(t: int, capacity: int) -> int:
    """L(T): how many of the T positions the buffers hold after a step (the operator's formula)."""
    if t <= capacity:
        return t
    g = capacity - W + 1
    return t - g * math.ceil((t - capacity) / g)


def tokens(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, H * D)).astype(np.float32),
            *(rng.standard_normal((n, HKV * D)).astype(np.float32) for _ in range(2)))


def run(sess, capacity: int, steps: list[int], qkv):
    """Batch 1: the steps' tokens one run each, present fed back as past. Returns the outputs of
    every run stacked (N, H*D) and the buffers after each run with its T."""
    q, k, v = qkv
    cos, sin = rope_tables()
    keys = np.zeros((1, HKV, capacity, D), np.float32)
    values = np.zeros_like(keys)
    outs, layouts, done = [], [], 0
    for s in steps:
        sl = slice(done, done + s)
        out, keys, values = sess.run(None, dict(
            query=q[None, sl], key=k[None, sl], value=v[None, sl], past_key=keys,
            past_value=values, seqlens_k=np.array([done + s - 1], np.int32),
            total_sequence_length=np.array(done + s, np.int32), cos_cache=cos, sin_cache=sin))
        done += s
        outs.append(out[0])
        layouts.append((done, keys[0].copy(), values[0].copy()))
    return np.concatenate(outs), layouts


@pytest.mark.parametrize("capacity", [W, W + 4])
@pytest.mark.parametrize("steps", [[5] + [1] * 30, [3, 4, 1, 9, 1, 1, 8, 6]],
                         ids=["prompt-then-tokens", "multi-token-steps"])
def test_a_window_sized_cache_attends_like_the_full_one(capacity, steps):
    n = sum(steps)
    qkv = tokens(n)
    want, keys, values = reference(*qkv)
    got, layouts = run(session(True), capacity, steps, qkv)
    assert n > 3 * capacity  # far past the capacity: evictions happened
    np.testing.assert_allclose(got, want, atol=2e-5)
    for t, k, v in layouts:
        held = resident(t, capacity)
        assert min(t, W) <= held <= min(t, capacity)
        np.testing.assert_allclose(k[:, :held], keys[:, t - held:t], atol=2e-5)
        np.testing.assert_allclose(v[:, :held], values[:, t - held:t], atol=2e-5)
    # the same window over a full-length cache agrees; attention over the whole causal past
    # (what a cache that silently kept everything would give) is far from it
    full, _ = run(session(False), n, steps, qkv)
    np.testing.assert_allclose(full, want, atol=2e-5)
    assert np.abs(got - reference(*qkv, window=n)[0]).max() > 1e-2


def test_a_capacity_below_the_window_is_refused():
    with pytest.raises(Exception, match="(?i)window|capacity|invalid"):
        run(session(True), W - 2, [3, 1], tokens(4))

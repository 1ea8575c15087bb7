"""What ONNX Runtime's CPU GroupQueryAttention computes with an int8 KV cache, checked against a
numpy reference (groundwork for `llm-onnx export --kv-cache int8`; docs/notes/kv-int8-gqa.md).

    PYTHONPATH=. .venv/bin/python benchmarks/kv_int8_probe.py            # checks, then timings
    PYTHONPATH=. .venv/bin/python benchmarks/kv_int8_probe.py --no-timing

Each check builds one GroupQueryAttention node with onnx.helper (fp32 query/key/value, an int8
cache (B, Hkv, max_len, D), ``k_scale``/``v_scale`` as graph inputs so that any layout can be fed)
and runs a prompt, single-token steps and a chunk as the project's runtime does: one max-length
buffer per cache bound as both past and present through IOBinding ("bound"), and also passed as a
plain input with the present read back ("plain"). Each step is compared with ``reference``: the
output (max |diff|) and the int8 present (positions that differ; every position past a row's
length must be left as it was).

The contract found (ONNX Runtime 1.31.1, CPU):
    present[b, h, p, d] = clip(rint(k[b, h, p, d] * (1 / s[h, d])), -128, 127)   (int8)
    keys/values read back as present * s (symmetric: no zero point)
with k the key after RoPE, rint rounding half to even, 1 / s computed in float32 (a zero scale
quantizes with 1 / s = 1 and reads back as 0), s one float (PER_TENSOR, any shape of 1 element)
or Hkv * D floats (PER_CHANNEL, any shape of that size: only the element count is checked;
element h * D + d scales channel d of KV head h). The same scales serve prompt and decode: new
keys are quantized with them in place, past ones are never requantized. ``kv_cache_bit_width=8``
is required and ``k_quant_type`` must equal ``v_quant_type`` on the CPU.

Timing (only while /tmp/QUIET is absent: the machine is shared): one decode step, B=1, 32 query
heads, 8 KV heads, D=128, the cache bound in place, int8 (per channel, per tensor) against fp32,
contexts 2k/8k/32k, 1 thread and ONNX Runtime's default, median of a few runs, and the cache
bytes of one layer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

QUIET = Path("/tmp/QUIET")
NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
         "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale",
         "v_scale"]


@dataclass(frozen=True)
class Case:
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    max_len: int = 48  # the cache's positions (the capacity C with windowed_cache)
    quant: str = "PER_CHANNEL"  # PER_TENSOR, PER_CHANNEL, or NONE (a float cache)
    rotary: bool = True
    window: int = -1  # local_window_size
    sink: bool = False  # a head_sink input (gpt-oss's attention sinks)
    windowed_cache: bool = False  # sliding_window_cache=1: max_len is then the capacity C
    bit_width: int | None = 8  # kv_cache_bit_width (None: the attribute left out)
    v_quant: str | None = None  # v_quant_type when it differs from quant
    dtype: int = TensorProto.FLOAT  # query/key/value dtype

    @property
    def cache_dtype(self):
        return np.float32 if self.quant == "NONE" else np.int8


def gqa_model(case: Case, scale_shape: tuple[int, ...] | None = None,
              scale_values: tuple[np.ndarray, np.ndarray] | None = None) -> bytes:
    """One GroupQueryAttention node. Scales are graph inputs of ``scale_shape`` (None: dynamic),
    or initializers when ``scale_values`` is given."""
    d, kv_hidden = case.head_dim, case.kv_heads * case.head_dim
    cache_type = TensorProto.FLOAT if case.quant == "NONE" else TensorProto.INT8
    cache_shape = ["B", case.kv_heads, "L", d]
    io = [helper.make_tensor_value_info("query", case.dtype, ["B", "T", case.heads * d]),
          helper.make_tensor_value_info("key", case.dtype, ["B", "T", kv_hidden]),
          helper.make_tensor_value_info("value", case.dtype, ["B", "T", kv_hidden]),
          helper.make_tensor_value_info("past_key", cache_type, cache_shape),
          helper.make_tensor_value_info("past_value", cache_type, cache_shape),
          helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
          helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    inputs = NAMES[:7]
    inits = []
    if case.rotary:
        io += [helper.make_tensor_value_info(n, case.dtype, ["M", d // 2])
               for n in ("cos_cache", "sin_cache")]
        inputs += ["cos_cache", "sin_cache"]
    if case.sink:
        io.append(helper.make_tensor_value_info("head_sink", case.dtype, [case.heads]))
        inputs += [""] * (11 - len(inputs)) + ["head_sink"]
    if case.quant != "NONE":
        inputs += [""] * (12 - len(inputs)) + ["k_scale", "v_scale"]
        if scale_values is not None:
            inits = [onnx.numpy_helper.from_array(a.astype(np.float32), n)
                     for n, a in zip(("k_scale", "v_scale"), scale_values)]
        else:
            io += [helper.make_tensor_value_info(n, TensorProto.FLOAT, scale_shape)
                   for n in ("k_scale", "v_scale")]
    attrs = dict(num_heads=case.heads, kv_num_heads=case.kv_heads, do_rotary=int(case.rotary),
                 local_window_size=case.window)
    if case.windowed_cache:
        attrs["sliding_window_cache"] = 1
    if case.quant != "NONE":
        attrs.update(k_quant_type=case.quant, v_quant_type=case.v_quant or case.quant)
        if case.bit_width is not None:
            attrs["kv_cache_bit_width"] = case.bit_width
    node = helper.make_node("GroupQueryAttention", inputs,
                            ["output", "present_key", "present_value"], domain="com.microsoft",
                            **attrs)
    outs = [helper.make_tensor_value_info("output", case.dtype, None),
            helper.make_tensor_value_info("present_key", cache_type, cache_shape),
            helper.make_tensor_value_info("present_value", cache_type, cache_shape)]
    graph = helper.make_graph([node], "gqa", io, outs, initializer=inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def session(model: bytes, threads: int = 1) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


# --- the reference ---------------------------------------------------------------------------

def quantize(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Symmetric int8 as the kernel writes it: x * (1/s) in float32, rounded half to even,
    clipped to [-128, 127]; a zero scale quantizes with 1/s = 1. ``scale`` broadcasts to x."""
    scale = np.asarray(scale, np.float32)
    inv = np.where(scale == 0, np.float32(1), np.float32(1) / np.where(scale == 0, 1, scale))
    q = np.rint(x.astype(np.float32) * inv.astype(np.float32))
    return np.clip(q, -128, 127).astype(np.int8)


def cache_scale(scale: np.ndarray, kv_heads: int, head_dim: int) -> np.ndarray:
    """k_scale / v_scale as the kernel reads them, shaped to broadcast over (B, Hkv, L, D):
    one number, or element h * D + d for channel d of KV head h (the input's shape aside)."""
    flat = np.asarray(scale, np.float32).reshape(-1)
    if flat.size == 1:
        return flat.reshape(1, 1, 1, 1)
    return flat.reshape(1, kv_heads, 1, head_dim)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of x (B, T, N, D) at positions (B, T); cos/sin (max_len, D/2)."""
    half = cos.shape[-1]
    c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], axis=-1)


def positions(seqlens: np.ndarray, total: int, t: int) -> np.ndarray:
    """(B, T) positions of the new tokens: 0..T-1 for a first prompt (total == T), else the T
    positions that end at seqlens_k (GroupQueryAttention's convention, model/ops.py)."""
    if total == t:
        return np.broadcast_to(np.arange(t), (len(seqlens), t))
    return seqlens[:, None] + 1 - t + np.arange(t)[None, :]


def reference(case: Case, q, k, v, past_k, past_v, seqlens, total, ks, vs, cos=None, sin=None,
              sink=None):
    """GroupQueryAttention over an int8 cache, in float64 but for the quantization itself.

    q (B, T, H*D), k/v (B, T, Hkv*D) float32; past_k/v (B, Hkv, L, D) int8 and ks/vs as fed,
    or a float cache and ks = vs = None (no quantization: the float baseline); sink (H,): one
    more logit per head in the softmax, its share dropped. Returns output (B, T, H*D) and the
    present caches (copies of past with the new rows)."""
    b, t, _ = q.shape
    d, h, hkv = case.head_dim, case.heads, case.kv_heads
    pos = positions(seqlens, total, t)
    q4, k4 = q.reshape(b, t, h, d), k.reshape(b, t, hkv, d)
    if case.rotary:
        q4, k4 = rope(q4, cos, sin, pos), rope(k4, cos, sin, pos)
    quantized = ks is not None
    k_scale = cache_scale(ks, hkv, d) if quantized else np.float32(1)
    v_scale = cache_scale(vs, hkv, d) if quantized else np.float32(1)
    store = quantize if quantized else (lambda x, _: x.astype(past_k.dtype))
    present_k, present_v = past_k.copy(), past_v.copy()
    rows = np.arange(b)[:, None]
    new_k = store(k4.transpose(0, 2, 1, 3), k_scale)  # (B, Hkv, T, D)
    new_v = store(v.reshape(b, t, hkv, d).transpose(0, 2, 1, 3), v_scale)
    present_k[rows, :, pos] = new_k.transpose(0, 2, 1, 3)  # (B, T, Hkv, D) into (B, Hkv, L, D)
    present_v[rows, :, pos] = new_v.transpose(0, 2, 1, 3)
    keys = np.repeat(present_k.astype(np.float64) * k_scale, h // hkv, axis=1)  # (B, H, L, D)
    values = np.repeat(present_v.astype(np.float64) * v_scale, h // hkv, axis=1)
    scale = 1 / np.sqrt(d)
    scores = np.einsum("bthd,bhpd->bhtp", q4.astype(np.float64), keys) * scale
    kpos = np.arange(past_k.shape[2])
    visible = (kpos[None, None] <= pos[:, :, None]) & (kpos[None, None] <= seqlens[:, None, None])
    if case.window > 0:
        visible &= kpos[None, None] > pos[:, :, None] - case.window
    scores = np.where(visible[:, None], scores, -np.inf)
    if sink is not None:
        column = np.broadcast_to(np.asarray(sink, np.float64)[None, :, None, None], (b, h, t, 1))
        scores = np.concatenate([scores, column], axis=-1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    probs = probs[..., :past_k.shape[2]]
    out = np.einsum("bhtp,bhpd->bthd", probs, values).reshape(b, t, h * d)
    return out, present_k, present_v


# --- running a case step by step -------------------------------------------------------------

class Cache:
    """A case's key and value buffers (B, Hkv, L, D) and its session, run over rows
    [start, start + b) of them: "bound" binds those rows as both past and present in place, as
    runtime/core/kv_cache.py does; "plain" feeds them as inputs and copies the present back."""

    def __init__(self, sess: ort.InferenceSession, case: Case, batch: int, mode: str,
                 fixed: dict[str, np.ndarray], fill: int = 0) -> None:
        shape = (batch, case.kv_heads, case.max_len, case.head_dim)
        self.keys = np.full(shape, fill, case.cache_dtype)
        self.values = np.full(shape, fill, case.cache_dtype)
        self.sess, self.case, self.mode, self.fixed = sess, case, mode, fixed
        self.present_len = case.max_len  # what the last plain run returned

    def step(self, q, k, v, seqlens: np.ndarray, total: int, start: int = 0) -> np.ndarray:
        b = q.shape[0]
        feed = dict(query=q, key=k, value=v, seqlens_k=np.asarray(seqlens, np.int32),
                    total_sequence_length=np.array(total, np.int32), **self.fixed)
        if self.mode == "plain":
            feed.update(past_key=self.keys[start:start + b],
                        past_value=self.values[start:start + b])
            out, pk, pv = self.sess.run(None, feed)
            self.present_len = pk.shape[2]
            self.keys[start:start + b], self.values[start:start + b] = pk, pv
            return out
        binding = self.sess.io_binding()
        for name, arr in feed.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        binding.bind_output("output")  # first: copy_outputs_to_cpu follows the binding order
        row_bytes = self.keys[0].nbytes
        shape = [b, *self.keys.shape[1:]]
        for buf, past, present in ((self.keys, "past_key", "present_key"),
                                   (self.values, "past_value", "present_value")):
            ptr = buf.ctypes.data + start * row_bytes
            binding.bind_input(past, "cpu", 0, buf.dtype, shape, ptr)
            binding.bind_output(present, "cpu", 0, buf.dtype, shape, ptr)
        self.sess.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]


def rope_tables(length: int, head_dim: int, theta: float = 10_000.0):
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    angles = np.outer(np.arange(length), inv)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def make_tokens(case: Case, rng: np.random.Generator, batch: int, count: int, outliers: int = 4):
    """q, k, v (B, count, ...) float32. Keys have a few outlier channels per KV head (8x), as
    real models' keys do: what separates per-tensor from per-channel scales."""
    d = case.head_dim
    q = rng.standard_normal((batch, count, case.heads * d)).astype(np.float32)
    k = rng.standard_normal((batch, count, case.kv_heads, d)).astype(np.float32)
    k[..., rng.choice(d, outliers, replace=False)] *= 8
    v = rng.standard_normal((batch, count, case.kv_heads * d)).astype(np.float32)
    return q, k.reshape(batch, count, -1), v


def calibrate(case: Case, k: np.ndarray, v: np.ndarray, cos, sin, margin: float = 1.0):
    """Symmetric scales from the data each cache will hold (keys after RoPE): amax / 127 per
    tensor or per (KV head, channel) -- the flat Hkv * D layout the kernel reads."""
    b, n, _ = k.shape
    k4 = k.reshape(b, n, case.kv_heads, case.head_dim)
    if case.rotary:
        k4 = rope(k4, cos, sin, np.broadcast_to(np.arange(n), (b, n)))
    v4 = v.reshape(b, n, case.kv_heads, case.head_dim)
    if case.quant == "PER_TENSOR":
        return (np.array([np.abs(k4).max() * margin / 127], np.float32),
                np.array([np.abs(v4).max() * margin / 127], np.float32))
    return (np.abs(k4).max(axis=(0, 1)).reshape(-1).astype(np.float32) * margin / 127,
            np.abs(v4).max(axis=(0, 1)).reshape(-1).astype(np.float32) * margin / 127)


# A script of steps, (start row, rows, new tokens) each: a prompt, single tokens, a chunk over
# the past (batch 1), then two rows of different lengths decoding together.
ONE_ROW = [(0, 1, 7), (0, 1, 1), (0, 1, 1), (0, 1, 1), (0, 1, 3), (0, 1, 1), (0, 1, 1)]
TWO_ROWS = [(0, 1, 5), (1, 1, 9), (0, 2, 1), (0, 2, 1), (0, 2, 1)]


@dataclass
class Result:
    out_err: float = 0.0  # max |ORT - reference| over outputs
    present_diff: int = 0  # int8 elements of the present that differ from the reference
    present_max: int = 0  # by how much at most (int8 steps)
    # positions past each row's length: "kept" as they were, or "zeroed" (or "changed")
    rest: str = "kept"
    quant_err: float = 0.0  # max |ORT - float-cache attention| / max |float-cache attention|
    present_len: int = 0

    def merge(self, other: Result) -> None:
        self.out_err = max(self.out_err, other.out_err)
        self.present_diff += other.present_diff
        self.present_max = max(self.present_max, other.present_max)
        if other.rest != self.rest:
            self.rest = "changed" if "changed" in (self.rest, other.rest) else other.rest
        self.quant_err = max(self.quant_err, other.quant_err)


def run_script(case: Case, mode: str, script=ONE_ROW, seed: int = 0, threads: int = 1,
               scales=None, fed_scales=None, margin: float = 1.0,
               initializers: bool = False) -> Result:
    """Run ``script`` through ORT and the reference (and a float-cache reference) side by side.
    ``scales``: the scales the reference reads (default: calibrated); ``fed_scales``: what ORT
    is fed (default: the same), to show what a wrong layout does; ``initializers``: the scales
    are constants of the graph rather than inputs (as an export would write them)."""
    rng = np.random.default_rng(seed)
    batch = max(s + r for s, r, _ in script)
    count = max(sum(t for s, r, t in script if s <= row < s + r) for row in range(batch))
    q_all, k_all, v_all = make_tokens(case, rng, batch, count)
    cos, sin = rope_tables(max(case.max_len, count) + 1, case.head_dim)
    fp16 = case.dtype == TensorProto.FLOAT16
    if fp16:  # the reference reads the fp16 inputs exactly (RoPE is then done in fp32)
        q_all, k_all, v_all, cos, sin = (a.astype(np.float16).astype(np.float32)
                                         for a in (q_all, k_all, v_all, cos, sin))
    feed_type = np.float16 if fp16 else np.float32
    if case.quant == "NONE":
        ks = vs = None
    else:
        ks, vs = scales if scales is not None else calibrate(case, k_all, v_all, cos, sin, margin)
    fed = fed_scales if fed_scales is not None else (ks, vs)
    fixed = dict(cos_cache=cos.astype(feed_type), sin_cache=sin.astype(feed_type)) \
        if case.rotary else {}
    sink = np.random.default_rng(seed + 1).standard_normal(case.heads).astype(np.float32) \
        if case.sink else None
    if case.sink:
        fixed["head_sink"] = sink.astype(feed_type)
    if case.quant != "NONE" and not initializers:
        fixed.update(k_scale=fed[0], v_scale=fed[1])
    model = gqa_model(case, scale_values=fed if initializers else None)
    sentinel = 77
    ort_cache = Cache(session(model, threads), case, batch, mode, fixed, sentinel)
    ref_k = np.full_like(ort_cache.keys, sentinel)
    ref_v = np.full_like(ort_cache.values, sentinel)
    flt_k = np.zeros(ref_k.shape, np.float32)
    flt_v = np.zeros(ref_v.shape, np.float32)
    float_case = replace(case, quant="NONE")
    lengths = np.zeros(batch, np.int64)
    result = Result()
    for start, rows, t in script:
        sl = slice(start, start + rows)
        n0 = lengths[sl]
        pick = lambda a: np.stack([a[r, n:n + t] for r, n in zip(range(start, start + rows), n0)])
        q, k, v = pick(q_all), pick(k_all), pick(v_all)
        seqlens = n0 + t - 1
        total = int(seqlens.max()) + 1
        out = ort_cache.step(*(a.astype(feed_type) for a in (q, k, v)), seqlens, total, start)
        ro, ref_k[sl], ref_v[sl] = reference(case, q, k, v, ref_k[sl], ref_v[sl], seqlens, total,
                                             ks, vs, cos, sin, sink)
        fo, flt_k[sl], flt_v[sl] = reference(float_case, q, k, v, flt_k[sl], flt_v[sl], seqlens,
                                             total, None, None, cos, sin, sink)
        lengths[sl] += t
        out = out.astype(np.float32)
        step = Result(out_err=float(np.abs(out - ro).max()),
                      quant_err=float(np.abs(out - fo).max() / np.abs(fo).max()))
        for got, want in ((ort_cache.keys, ref_k), (ort_cache.values, ref_v)):
            valid = np.arange(case.max_len)[None, :] < lengths[:, None]  # (B, L)
            mask = valid[:, None, :, None]
            same = got == want if got.dtype == np.int8 else np.isclose(got, want, atol=1e-5)
            step.present_diff += int((~same & mask).sum())
            if got.dtype == np.int8:
                gap = np.abs(got.astype(np.int16) - want) * mask
                step.present_max = max(step.present_max, int(gap.max()))
            if not (same | mask).all():
                step.rest = "zeroed" if (same | mask | (got == 0)).all() else "changed"
        result.merge(step)
    result.present_len = ort_cache.present_len
    return result


def resident(total: int, capacity: int, window: int) -> int:
    """sliding_window_cache=1: how many positions rows [0, L) hold after ``total`` tokens (the
    op's documented L(T): compaction reclaims G = C - W + 1 positions at once)."""
    if total <= capacity:
        return total
    gap = capacity - window + 1
    return total - gap * -(-(total - capacity) // gap)


def run_windowed(quant: str, window: int, capacity: int, count: int, seed: int = 0):
    """A window-sized cache (sliding_window_cache=1, capacity C >= W) bound in place, against the
    reference over a full-length cache: outputs, and rows [0, L) of the present against the
    last L positions of the full one. Returns (max output error, int8 elements that differ)."""
    case = Case(quant=quant, window=window, windowed_cache=True, max_len=capacity)
    full = replace(case, windowed_cache=False, max_len=count)
    rng = np.random.default_rng(seed)
    q_all, k_all, v_all = make_tokens(case, rng, 1, count)
    cos, sin = rope_tables(count + 1, case.head_dim)
    ks, vs = calibrate(case, k_all, v_all, cos, sin)
    fixed = dict(cos_cache=cos, sin_cache=sin, k_scale=ks, v_scale=vs)
    ort_cache = Cache(session(gqa_model(case)), case, 1, "bound", fixed)
    ref_k = np.zeros((1, case.kv_heads, count, case.head_dim), np.int8)
    ref_v = np.zeros_like(ref_k)
    steps = [3] + [1] * (count - 3 - 3) + [3]  # a prompt, single tokens, a 3-token chunk
    n, err, diff = 0, 0.0, 0
    for t in steps:
        q, k, v = (a[:, n:n + t] for a in (q_all, k_all, v_all))
        seqlens = np.array([n + t - 1])
        out = ort_cache.step(q, k, v, seqlens, n + t)
        ro, ref_k, ref_v = reference(full, q, k, v, ref_k, ref_v, seqlens, n + t, ks, vs, cos, sin)
        n += t
        rows = resident(n, capacity, window)
        err = max(err, float(np.abs(out - ro).max()))
        diff += int((ort_cache.keys[:, :, :rows] != ref_k[:, :, n - rows:n]).sum())
        diff += int((ort_cache.values[:, :, :rows] != ref_v[:, :, n - rows:n]).sum())
    return err, diff


def refusal(case: Case, scale_shape=None, scale_dtype=np.float32, cache_dtype=None) -> str:
    """Build ``case``, run one prompt; ONNX Runtime's message if it refuses, else "runs"."""
    d = case.head_dim
    try:
        model = onnx.load_from_string(gqa_model(case))
        if scale_dtype != np.float32:
            for vi in model.graph.input:
                if vi.name in ("k_scale", "v_scale"):
                    vi.type.tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(
                        np.dtype(scale_dtype))
        sess = session(model.SerializeToString())
        fdt = np.float16 if case.dtype == TensorProto.FLOAT16 else np.float32
        rng = np.random.default_rng(0)
        n = case.kv_heads * d if case.quant == "PER_CHANNEL" else 1
        scale = np.full(scale_shape if scale_shape is not None else (n,), 0.05, scale_dtype)
        cache = np.zeros((1, case.kv_heads, case.max_len, d), cache_dtype or case.cache_dtype)
        cos, sin = rope_tables(case.max_len, d)
        feed = dict(query=rng.standard_normal((1, 3, case.heads * d)).astype(fdt),
                    key=rng.standard_normal((1, 3, case.kv_heads * d)).astype(fdt),
                    value=rng.standard_normal((1, 3, case.kv_heads * d)).astype(fdt),
                    past_key=cache, past_value=cache.copy(), seqlens_k=np.array([2], np.int32),
                    total_sequence_length=np.array(3, np.int32), k_scale=scale, v_scale=scale)
        if case.rotary:
            feed.update(cos_cache=cos.astype(fdt), sin_cache=sin.astype(fdt))
        quiet = ort.RunOptions()
        quiet.log_severity_level = 4
        sess.run(None, feed, quiet)
        return "runs"
    except Exception as e:  # ORT's own message is the finding
        text = str(e).replace("\n", " ")
        for marker in ("Status Message: ", "] : ", "error: "):
            if marker in text:
                text = text.rsplit(marker, 1)[1]
        return f"refused: {text.strip()[:150]}"


def pinned_rounding() -> tuple[list[int], list[int], list[int]]:
    """Keys of one token through a PER_TENSOR cache (no RoPE): what int8 the kernel writes for
    ties and out-of-range values, and for values where x * (1/s) and x / s round apart.
    Returns (written, expected by x * (1/s) half-even, expected by x / s half away from 0)."""
    case = Case(quant="PER_TENSOR", heads=1, kv_heads=1, head_dim=16, max_len=2, rotary=False)
    keys = np.zeros(16, np.float32)
    # s = 0.5: ties 0.5, 1.5, -0.5, -1.5, 2.5 and clipping; then s = 0.1 (1/s is inexact)
    keys[:8] = [0.25, 0.75, -0.25, -0.75, 1.25, 100.0, -100.0, 63.75]
    special = np.array([-7.2500005, -3.2500002, 1.55, 1.9499999], np.float32)  # see below
    written, expected, divided = [], [], []
    for scale, values in ((0.5, keys), (0.1, np.pad(special, (0, 12)))):
        s = np.array([scale], np.float32)
        sess = session(gqa_model(case))
        cache = np.zeros((1, 1, 2, 16), np.int8)
        k = values.reshape(1, 1, 16)
        _, present, _ = sess.run(None, dict(
            query=k, key=k, value=k, past_key=cache, past_value=cache.copy(),
            seqlens_k=np.array([0], np.int32), total_sequence_length=np.array(1, np.int32),
            k_scale=s, v_scale=s))
        used = 8 if scale == 0.5 else 4
        written += present[0, 0, 0, :used].tolist()
        expected += quantize(values, s)[:used].tolist()
        x = values[:used].astype(np.float32) / s  # x / s, rounded half away from zero
        divided += np.clip(np.sign(x) * np.floor(np.abs(x) + 0.5), -128, 127).astype(int).tolist()
    return written, expected, divided


def zero_scale() -> tuple[bool, float]:
    """A PER_TENSOR scale of 0: (the cache holds clip(rint(x)), max |output|)."""
    case = Case(quant="PER_TENSOR", heads=2, kv_heads=1, head_dim=16, max_len=4, rotary=False)
    rng = np.random.default_rng(0)
    k = (rng.standard_normal((1, 3, 16)) * 40).astype(np.float32)
    cache = np.zeros((1, 1, 4, 16), np.int8)
    zero = np.zeros(1, np.float32)
    out, present, _ = session(gqa_model(case)).run(None, dict(
        query=np.tile(k, 2), key=k, value=k, past_key=cache, past_value=cache.copy(),
        seqlens_k=np.array([2], np.int32), total_sequence_length=np.array(3, np.int32),
        k_scale=zero, v_scale=zero))
    raw = np.clip(np.rint(k[0]), -128, 127).astype(np.int8)
    return bool((present[0, 0, :3] == raw).all()), float(np.abs(out).max())


# --- timing ------------------------------------------------------------------------------------

def time_decode(context: int, quant: str, runs: int = 9, threads: int = 0) -> float:
    """Median ms of one decode step (B=1, 32 heads over 8 KV heads, D=128, RoPE) at ``context``
    positions, the cache bound in place and reused between runs as the runtime's decode binding
    is (each run writes the same last position again)."""
    case = Case(heads=32, kv_heads=8, head_dim=128, max_len=context, quant=quant)
    rng = np.random.default_rng(0)
    shape = (1, case.kv_heads, context, case.head_dim)
    if quant == "NONE":
        caches = [rng.standard_normal(shape, np.float32) for _ in range(2)]
    else:
        caches = [rng.integers(-127, 128, shape, dtype=np.int8) for _ in range(2)]
    cos, sin = rope_tables(context, case.head_dim)
    feed = dict(query=rng.standard_normal((1, 1, 32 * 128), np.float32),
                key=rng.standard_normal((1, 1, 8 * 128), np.float32),
                value=rng.standard_normal((1, 1, 8 * 128), np.float32),
                seqlens_k=np.array([context - 1], np.int32),
                total_sequence_length=np.array(context, np.int32), cos_cache=cos, sin_cache=sin)
    if quant != "NONE":
        n = 8 * 128 if quant == "PER_CHANNEL" else 1
        feed.update(k_scale=np.full(n, 0.02, np.float32), v_scale=np.full(n, 0.02, np.float32))
    sess = session(gqa_model(case), threads)
    binding = sess.io_binding()
    for name, arr in feed.items():
        binding.bind_cpu_input(name, arr)
    for buf, past, present in zip(caches, ("past_key", "past_value"),
                                  ("present_key", "present_value")):
        binding.bind_input(past, "cpu", 0, buf.dtype, list(shape), buf.ctypes.data)
        binding.bind_output(present, "cpu", 0, buf.dtype, list(shape), buf.ctypes.data)
    out = np.empty((1, 1, 32 * 128), np.float32)
    binding.bind_output("output", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    times = []
    for i in range(runs + 2):  # two warm-up runs
        start = time.perf_counter()
        sess.run_with_iobinding(binding)
        if i >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def cache_bytes(context: int, itemsize: int, kv_heads: int = 8, head_dim: int = 128) -> int:
    """Keys and values of one layer for one row."""
    return 2 * kv_heads * context * head_dim * itemsize


# --- the report --------------------------------------------------------------------------------

def report_checks() -> None:
    print("== exactness: ORT vs the numpy reference (same int8 scales), and what int8 costs ==")
    print("quant        D    RoPE  cache  script    out max|diff|  present diff  beyond    "
          "int8 vs fp32 cache")
    for quant in ("PER_TENSOR", "PER_CHANNEL"):
        for d in (64, 128):
            for rotary in (False, True):
                for mode in ("bound", "plain"):
                    for name, script in (("1 row", ONE_ROW), ("2 rows", TWO_ROWS)):
                        r = run_script(Case(quant=quant, head_dim=d, rotary=rotary), mode, script)
                        print(f"{quant:<12} {d:<4} {'yes' if rotary else 'no':<5} {mode:<6} "
                              f"{name:<9} {r.out_err:13.1e}  {r.present_diff:12d}  {r.rest:<8}"
                              f"  {r.quant_err:8.2%} of max|out|")
    print("\n== kernel paths (PER_CHANNEL, D=64, RoPE, bound) ==")
    base = Case()
    paths = [("flash (default)", base, ONE_ROW, 1, {}),
             ("no flash: ORT_GQA_DISABLE_FLASH_ATTENTION=1", base, ONE_ROW, 1,
              {"ORT_GQA_DISABLE_FLASH_ATTENTION": "1"}),
             ("a one-token first prompt (total 1: the non-flash kernel)", base,
              [(0, 1, 1)] + [(0, 1, 1)] * 3, 1, {}),
             ("flash decoding: 8 threads, 1000-token prompt, B*H < threads",
              replace(base, max_len=1010), [(0, 1, 1000), (0, 1, 1), (0, 1, 1)], 8, {}),
             ("scales as initializers (constants of the graph)", base, ONE_ROW, 1, None),
             ("head_sink (gpt-oss's sinks: the non-flash quantized kernel)",
              replace(base, sink=True), ONE_ROW, 1, {}),
             ("head_sink, two rows", replace(base, sink=True), TWO_ROWS, 1, {}),
             ("local_window_size=4 over a full-length cache", replace(base, window=4), ONE_ROW,
              1, {}),
             ("local_window_size=4, two rows", replace(base, window=4), TWO_ROWS, 1, {})]
    for label, case, script, threads, env in paths:
        os.environ.update(env or {})
        try:
            r = run_script(case, "bound", script, threads=threads, initializers=env is None)
        finally:
            for key in env or {}:
                del os.environ[key]
        print(f"{label:<62} out {r.out_err:.1e}  present diff {r.present_diff}  rest {r.rest}")
    for quant in ("PER_TENSOR", "PER_CHANNEL"):
        for capacity in (4, 7):
            err, diff = run_windowed(quant, 4, capacity, 24)
            print(f"sliding_window_cache=1, W=4, C={capacity}, {quant:<11}, 24 tokens      "
                  f"out {err:.1e}  rows [0, L) diff {diff}")

    print("\n== scale layouts (PER_CHANNEL, Hkv=2, D=64; reference reads element h*D + d) ==")
    case = Case(rotary=False)
    rng = np.random.default_rng(0)
    q, k, v = make_tokens(case, rng, 1, 16)
    ks, vs = calibrate(case, k, v, None, None)
    for label, shape in (("(Hkv*D,)", (128,)), ("(Hkv, D)", (2, 64)),
                         ("(1, Hkv, 1, D)", (1, 2, 1, 64)), ("(Hkv, 1, D)", (2, 1, 64))):
        fed = (ks.reshape(shape), vs.reshape(shape))
        r = run_script(case, "bound", scales=(ks, vs), fed_scales=fed)
        print(f"fed {label:<16} out {r.out_err:.1e}  present diff {r.present_diff}")
    swapped = (ks.reshape(2, 64).T.copy(), vs.reshape(2, 64).T.copy())  # (D, Hkv)
    r = run_script(case, "bound", scales=(ks, vs), fed_scales=swapped)
    print(f"fed (D, Hkv) (wrong) vs the right layout: out {r.out_err:.2f}  present diff "
          f"{r.present_diff}")
    flat = tuple(a.reshape(-1) for a in swapped)
    r = run_script(case, "bound", scales=flat, fed_scales=swapped)
    print(f"fed (D, Hkv) vs a reference reading it flat:  out {r.out_err:.1e}  present diff "
          f"{r.present_diff}")
    tensor = Case(quant="PER_TENSOR", rotary=False)
    for label, shape in (("(1,)", (1,)), ("() scalar", ()), ("(1, 1, 1, 1)", (1, 1, 1, 1))):
        s = (np.full(shape, 0.05, np.float32), np.full(shape, 0.04, np.float32))
        r = run_script(tensor, "bound", scales=s, fed_scales=s)
        print(f"PER_TENSOR fed {label:<13} out {r.out_err:.1e}  present diff {r.present_diff}")

    print("\n== rounding, clipping, zero scale ==")
    written, expected, divided = pinned_rounding()
    print(f"written                      {written}")
    for label, want in (("clip(rint(x * (1/s))), even", expected),
                        ("x / s, half away from zero", divided)):
        print(f"{label:<28} {want}  {'MATCH' if written == want else 'DIFFER'}")
    raw, out = zero_scale()
    print(f"scale 0: cache holds clip(rint(x)): {raw}; output max|.| {out}")
    for rotary in (False, True):
        r = run_script(Case(dtype=TensorProto.FLOAT16, rotary=rotary), "bound")
        print(f"fp16 query/key/value, int8 cache, RoPE {'yes' if rotary else 'no ':<3}: out "
              f"{r.out_err:.1e}  present diff {r.present_diff} (at most {r.present_max} step; "
              f"{2 * 2 * 14 * 64} written)")

    print("\n== what is refused ==")
    for label, args in (("no kv_cache_bit_width", dict(case=Case(bit_width=None))),
                        ("k PER_CHANNEL, v PER_TENSOR", dict(case=Case(v_quant="PER_TENSOR"))),
                        ("PER_CHANNEL scale of D elements", dict(case=Case(), scale_shape=(64,))),
                        ("float16 scales", dict(case=Case(), scale_dtype=np.float16)),
                        ("kv_cache_bit_width=4 over an int8 (B, Hkv, L, D) cache",
                         dict(case=Case(bit_width=4)))):
        print(f"{label:<55} {refusal(**args)}")


def report_timing(runs: int = 15) -> None:
    print("\n== one decode step, B=1, 32 q heads / 8 KV heads, D=128, RoPE, bound in place ==")
    print(f"median of {runs} runs; 1 thread, then ONNX Runtime's default ({os.cpu_count()} cores: "
          f"noisy when other jobs hold them); load average before: {os.getloadavg()[0]:.1f}")
    print("threads  context   fp32 ms   int8/channel ms   int8/tensor ms   channel/fp32   "
          "fp32 cache/layer   int8 cache/layer")
    for threads in (1, 0):
        for context in (2048, 8192, 32768):
            if QUIET.exists():
                print(f"{threads or 'default':<8} {context:<8}  skipped: {QUIET} exists")
                continue
            f32, channel, tensor = (time_decode(context, quant, runs, threads)
                                    for quant in ("NONE", "PER_CHANNEL", "PER_TENSOR"))
            print(f"{threads or 'default':<8} {context:<8} {f32:8.3f}  {channel:14.3f}  "
                  f"{tensor:15.3f}   {channel / f32:11.2f}   "
                  f"{cache_bytes(context, 4) / 2**20:10.1f} MiB   "
                  f"{cache_bytes(context, 1) / 2**20:10.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-timing", action="store_true", help="the checks only")
    args = parser.parse_args()
    ort.set_default_logger_severity(4)  # refusals are reported from their exceptions
    print(f"onnxruntime {ort.__version__}, CPU provider")
    report_checks()
    if not args.no_timing:
        report_timing()


if __name__ == "__main__":
    main()

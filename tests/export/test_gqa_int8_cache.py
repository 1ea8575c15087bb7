"""ONNX Runtime's CPU GroupQueryAttention over an int8 KV cache keeps the contract that an
int8-cache export will rely on (docs/notes/kv-int8-gqa.md; benchmarks/kv_int8_probe.py measures
more):

    cache = clip(rint(x * (1 / s)), -128, 127)  (int8, x = key after RoPE or value; half to even)
    x' = cache * s                                (symmetric: no zero point)

s: one float (PER_TENSOR) or Hkv * D floats (PER_CHANNEL), element h * D + d for channel d of KV
head h, whatever the input's shape; new keys are quantized with the given scales into the buffer
bound as both past and present, the rest of the buffer is left alone. A numpy reference here
checks it, and a wrong scale layout is shown to miss it by far."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

H, HKV, D, L = 4, 2, 64, 16  # query heads, KV heads, head size, cache positions
SENTINEL = 77  # what the buffer holds before anything is written


def gqa_session(quant: str, bit_width: int | None = 8, v_quant: str | None = None,
                rope: bool = True):
    """One GroupQueryAttention node: fp32 query/key/value, RoPE (or none: queries and keys
    arrive rotated, as an int8-cache export's attention module hands them), an int8 cache,
    scales as inputs."""
    cache = ["B", HKV, "L", D]
    inputs = [helper.make_tensor_value_info("query", TensorProto.FLOAT, ["B", "T", H * D]),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "T", HKV * D])
                for n in ("key", "value")),
              *(helper.make_tensor_value_info(n, TensorProto.INT8, cache)
                for n in ("past_key", "past_value")),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, [L, D // 2])
                for n in ("cos_cache", "sin_cache")),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                for n in ("k_scale", "v_scale"))]
    attrs = dict(num_heads=H, kv_num_heads=HKV, do_rotary=int(rope), k_quant_type=quant,
                 v_quant_type=v_quant or quant)
    if bit_width is not None:
        attrs["kv_cache_bit_width"] = bit_width
    if not rope:  # no cos/sin inputs at all
        inputs = inputs[:7] + inputs[9:]
    names = [i.name for i in inputs]
    if not rope:
        names = names[:7] + ["", ""] + names[7:]
    node = helper.make_node("GroupQueryAttention", names[:9] + ["", "", ""] + names[9:],
                            ["output", "present_key", "present_value"], domain="com.microsoft",
                            **attrs)
    return gqa_node_session(node, inputs, TensorProto.INT8, cache)


def gqa_node_session(node, inputs, cache_type, cache_shape):
    """A session of one GroupQueryAttention ``node`` (outputs: output, present_key,
    present_value of ``cache_type``), one thread, ONNX Runtime's logging off."""
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, None),
               *(helper.make_tensor_value_info(n, cache_type, cache_shape)
                 for n in ("present_key", "present_value"))]
    model = helper.make_model(helper.make_graph([node], "gqa", inputs, outputs), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 21),
                                             helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def rope_tables():
    angles = np.outer(np.arange(L), 1.0 / 10_000.0 ** (np.arange(0, D, 2) / D))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def quantize(x, scale):
    return np.clip(np.rint(x * (np.float32(1) / scale)), -128, 127).astype(np.int8)


def per_head(scale):
    """k_scale / v_scale read as the kernel reads them, shaped to broadcast over (Hkv, L, D)."""
    flat = np.asarray(scale, np.float32).reshape(-1)
    return flat.reshape(1, 1, 1) if flat.size == 1 else flat.reshape(HKV, 1, D)


def reference(q, k, v, keys, values, past: int, ks, vs):
    """Batch 1: q (T, H*D), k/v (T, Hkv*D) at positions past..past+T-1 over int8 keys/values
    (Hkv, L, D), updated in place. Returns the output (T, H*D)."""
    t = q.shape[0]
    pos = np.arange(past, past + t)
    cos, sin = (a[pos][:, None, :] for a in rope_tables())

    def rope(x):  # (T, N, D), rotate-half
        x1, x2 = x[..., :D // 2], x[..., D // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    q4, k4 = rope(q.reshape(t, H, D)), rope(k.reshape(t, HKV, D))
    keys[:, pos] = quantize(k4.transpose(1, 0, 2), per_head(ks))
    values[:, pos] = quantize(v.reshape(t, HKV, D).transpose(1, 0, 2), per_head(vs))
    kf = np.repeat(keys * per_head(ks).astype(np.float64), H // HKV, axis=0)  # (H, L, D)
    vf = np.repeat(values * per_head(vs).astype(np.float64), H // HKV, axis=0)
    scores = np.einsum("thd,hpd->htp", q4, kf) / np.sqrt(D)
    scores = np.where(np.arange(L)[None, None] <= pos[None, :, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("htp,hpd->thd", probs, vf).reshape(t, H * D)


def run_bound(sess, keys, values, q, k, v, past: int, ks, vs, packed: bool = False):
    """One step with the (1, Hkv, L, D) buffers bound as both past and present, as the runtime's
    KVCache binds them (runtime/core/kv_cache.py); the RoPE tables where the session takes them."""
    t = q.shape[0]
    cos, sin = rope_tables()
    binding = sess.io_binding()
    binding.bind_output("output")
    qkv = dict(query=np.concatenate([q, k, v], axis=-1)[None]) if packed else dict(
        query=q[None], key=k[None], value=v[None])
    feed = dict(**qkv,
                seqlens_k=np.array([past + t - 1], np.int32),
                total_sequence_length=np.array(past + t, np.int32), k_scale=ks, v_scale=vs)
    if "cos_cache" in {i.name for i in sess.get_inputs()}:
        feed.update(cos_cache=cos, sin_cache=sin)
    for name, arr in feed.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(arr))
    for buf, past_name, present in ((keys, "past_key", "present_key"),
                                    (values, "past_value", "present_value")):
        binding.bind_input(past_name, "cpu", 0, np.int8, list(buf.shape), buf.ctypes.data)
        binding.bind_output(present, "cpu", 0, np.int8, list(buf.shape), buf.ctypes.data)
    sess.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0][0]


def tokens(count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((count, H * D)).astype(np.float32)
    k = rng.standard_normal((count, HKV, D)).astype(np.float32)
    k[..., [3, 40]] *= 8  # outlier channels, as real keys have
    v = rng.standard_normal((count, HKV * D)).astype(np.float32)
    return q, k.reshape(count, -1), v


def calibrated(quant: str, k, v):
    """amax / 127 over the data (keys without RoPE: the rotation keeps each pair's norm, so this
    bounds the rotated keys' amax by at most sqrt(2); a few may clip, which the contract covers)."""
    if quant == "PER_TENSOR":
        return (np.array([np.abs(k).max() / 127], np.float32),
                np.array([np.abs(v).max() / 127], np.float32))
    return (np.abs(k).max(0).astype(np.float32) / 127, np.abs(v).max(0).astype(np.float32) / 127)


def run_steps(quant: str, fed=None, steps=(5, 1, 1)):
    """A prompt then single tokens, through ORT (buffers bound in place) and the reference (which
    reads the calibrated scales; ORT is fed ``fed`` or the same). Returns the worst output
    difference, ORT's and the reference's buffers."""
    q, k, v = tokens(sum(steps))
    ks, vs = calibrated(quant, k, v)
    sess = gqa_session(quant)
    ort_k, ort_v, ref_k, ref_v = (np.full((HKV, L, D), SENTINEL, np.int8) for _ in range(4))
    worst, n = 0.0, 0
    for t in steps:
        sl = slice(n, n + t)
        got = run_bound(sess, ort_k[None], ort_v[None], q[sl], k[sl], v[sl], n,
                        *(fed or (ks, vs)))
        want = reference(q[sl], k[sl], v[sl], ref_k, ref_v, n, ks, vs)
        worst = max(worst, float(np.abs(got - want).max()))
        n += t
    return worst, (ort_k, ort_v), (ref_k, ref_v)


@pytest.mark.parametrize("quant", ["PER_TENSOR", "PER_CHANNEL"])
def test_the_cache_is_written_in_place_as_the_reference_quantizes_it(quant):
    worst, got, want = run_steps(quant)
    assert worst < 1e-5
    for g, w in zip(got, want):  # every position: written ones exactly, the rest untouched
        np.testing.assert_array_equal(g, w)
    assert (got[0][:, 7:] == SENTINEL).all()


def test_per_channel_scales_are_read_flat_as_kv_head_then_channel():
    q, k, v = tokens(7)
    ks, vs = calibrated("PER_CHANNEL", k, v)
    for shape in [(1, HKV, 1, D), (HKV, D)]:  # any shape of Hkv * D elements, read flat
        worst, got, want = run_steps("PER_CHANNEL", fed=(ks.reshape(shape), vs.reshape(shape)))
        assert worst < 1e-5 and all((g == w).all() for g, w in zip(got, want))
    # (D, Hkv): the same numbers, the other order -- the reference (and the model) disagree
    swapped = tuple(a.reshape(HKV, D).T.copy() for a in (ks, vs))
    worst, got, want = run_steps("PER_CHANNEL", fed=swapped)
    assert worst > 0.05 and (got[0] != want[0]).mean() > 0.1
    with pytest.raises(Exception, match="k_scale shape mismatch"):
        run_steps("PER_CHANNEL", fed=(ks[:D], vs[:D]))


def test_rounding_is_half_to_even_of_x_times_one_over_s_clipped_to_int8():
    x = np.zeros(HKV * D, np.float32)  # one token at position 0, where RoPE changes nothing
    x[:8] = [0.25, 0.75, -0.25, 1.25, 100.0, -100.0, 1.55, 1.9499999]
    scale = np.ones(HKV * D, np.float32)
    scale[:8] = [0.5] * 6 + [0.1] * 2  # 1.55 * (1 / 0.1f) rounds to 16, 1.55 / 0.1f to 15
    keys, values = np.zeros((1, HKV, L, D), np.int8), np.zeros((1, HKV, L, D), np.int8)
    run_bound(gqa_session("PER_CHANNEL"), keys, values, np.zeros((1, H * D), np.float32),
              x[None], x[None], 0, scale, scale)
    assert keys[0, 0, 0, :8].tolist() == [0, 2, 0, 2, 127, -128, 16, 20]
    np.testing.assert_array_equal(keys[0, :, 0].reshape(-1), quantize(x, scale))  # the reference
    np.testing.assert_array_equal(values, keys)


@pytest.mark.parametrize("attrs, message", [
    (dict(bit_width=None), "kv_cache_bit_width must be 4 or 8"),
    (dict(v_quant="PER_TENSOR"), "requires k_quant_type == v_quant_type"),
])
def test_what_the_export_must_set(attrs, message):
    with pytest.raises(Exception, match=message):
        sess = gqa_session("PER_CHANNEL", **attrs)
        q, k, v = tokens(3)
        run_bound(sess, *(np.zeros((1, HKV, L, D), np.int8) for _ in range(2)), q, k, v, 0,
                  *calibrated("PER_CHANNEL", k, v))


def translation_session(packed: bool = False, prompt_step: int = 2, rope: bool = True):
    """The export's translation of the int8-cache op in a graph of many tokens
    (kv_int8_attention.group_query_attention_int8_steps, its packed-QKV form, or without RoPE
    its _rotated form: the int8 node for fewer than ``prompt_step`` new tokens; for more, the
    float node over what the int8 node reads back, then an int8 write), as a one-node model
    calling it as a local function, inlined as the export inlines it (the call, then the calls
    in its branches and theirs: inline_branch_calls)."""
    import onnx_ir as ir
    from onnx_ir.passes.common import InlinePass

    from llm_onnx.export import kv_int8_attention

    fn = (kv_int8_attention.group_query_attention_int8_steps_packed if packed
          else kv_int8_attention.group_query_attention_int8_steps if rope
          else kv_int8_attention.group_query_attention_int8_steps_rotated).to_function_proto()
    cache = ["B", HKV, "L", D]
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache", "", "", "k_scale", "v_scale"]
    width = (H + 2 * HKV) * D if packed else H * D
    inputs = [helper.make_tensor_value_info("query", TensorProto.FLOAT, ["B", "T", width]),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", "T", HKV * D])
                for n in (() if packed else ("key", "value"))),
              *(helper.make_tensor_value_info(n, TensorProto.INT8, cache)
                for n in ("past_key", "past_value")),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, [L, D // 2])
                for n in ("cos_cache", "sin_cache")),
              *(helper.make_tensor_value_info(n, TensorProto.FLOAT, [HKV * D])
                for n in ("k_scale", "v_scale"))]
    attrs = dict(num_heads=H, kv_num_heads=HKV, scale=D ** -0.5, local_window_size=-1,
                 rotary_interleaved=0, rotary_dim=D, prompt_step=prompt_step)
    if packed:
        names = names[:1] + names[3:]
        attrs["widths"] = [H * D, HKV * D, HKV * D]
    if not rope:
        names = names[:7] + names[9:]
        inputs = [i for i in inputs if i.name not in ("cos_cache", "sin_cache")]
        del attrs["rotary_interleaved"], attrs["rotary_dim"]
    node = helper.make_node(fn.name, names, ["output", "present_key", "present_value"],
                            domain=fn.domain, **attrs)
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, None),
               *(helper.make_tensor_value_info(n, TensorProto.INT8, cache)
                 for n in ("present_key", "present_value"))]
    model = ir.serde.deserialize_model(helper.make_model(
        helper.make_graph([node], "translation", inputs, outputs), ir_version=10,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1),
                       helper.make_opsetid(fn.domain, 1)], functions=[fn]))
    InlinePass()(model)
    kv_int8_attention.inline_branch_calls(model)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    return ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


STEPS = (5, 1, 3, 1)  # a prompt, a token, a chunk over the past (a verify step), a token


@pytest.mark.parametrize("packed, rope", [(False, True), (True, True), (False, False)],
                         ids=["rope-inside", "packed-rope-inside", "rotated-before"])
def test_the_decoders_eager_op_equals_the_kernel_and_the_export(packed, rope):
    """llm_onnx's torch op (ops.group_query_attention with k_scale/v_scale, the reference of an
    int8-cache export's parity gate) against the bare kernel and against the export's translation
    for graphs of several tokens (its float node for them), each bound in place: a prompt, single
    tokens and a chunk over the past, per-channel scales, RoPE inside, or queries and keys
    rotated before the node (the Hadamard basis: an int8-cache export's form where the head size
    is a power of two); the same outputs and the same cache bytes at every step."""
    import torch

    from llm_onnx.modeling import ops

    q, k, v = tokens(sum(STEPS))
    ks, vs = calibrated("PER_CHANNEL", k, v)
    kernel, translation = gqa_session("PER_CHANNEL", rope=rope), translation_session(packed,
                                                                                      rope=rope)
    ker_k, ker_v, tr_k, tr_v = (np.zeros((1, HKV, L, D), np.int8) for _ in range(4))
    pk, pv = (torch.zeros((1, HKV, L, D), dtype=torch.int8) for _ in range(2))
    cos, sin = (torch.from_numpy(a) for a in rope_tables()) if rope else (None, None)
    n = 0
    for t in STEPS:
        sl = slice(n, n + t)
        by_kernel = run_bound(kernel, ker_k, ker_v, q[sl], k[sl], v[sl], n, ks, vs)
        by_translation = run_bound(translation, tr_k, tr_v, q[sl], k[sl], v[sl], n, ks, vs,
                                   packed=packed)
        out, pk, pv = ops.group_query_attention(
            *(torch.from_numpy(a[sl])[None] for a in (q, k, v)), pk, pv,
            torch.tensor([n + t - 1], dtype=torch.int32), torch.tensor(n + t, dtype=torch.int32),
            cos, sin, H, HKV, D ** -0.5, -1, False, None, None, torch.from_numpy(ks),
            torch.from_numpy(vs))
        assert float(np.abs(out[0].numpy() - by_kernel).max()) < 1e-5
        assert float(np.abs(by_translation - by_kernel).max()) < 1e-5
        for got in (pk.numpy(), tr_k):
            np.testing.assert_array_equal(got, ker_k)
        for got in (pv.numpy(), tr_v):
            np.testing.assert_array_equal(got, ker_v)
        n += t
    assert (ker_k[0, :, :n] != 0).mean() > 0.5  # written, mostly not zero
    assert (tr_k[0, :, n:] == 0).all()  # and nothing past the tokens

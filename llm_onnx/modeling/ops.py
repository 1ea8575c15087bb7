"""Custom torch ops of the decoder, with their reference math in plain torch.

Each op has the exact contract of the ONNX Runtime kernel it is exported to (see
``llm_onnx/export/custom_ops.py``), so the eager implementation here *is* the specification that
the parity tests hold ONNX Runtime to:

  llm_onnx::rms_norm              -> SimplifiedLayerNormalization
  llm_onnx::add_rms_norm          -> com.microsoft.SkipSimplifiedLayerNormalization
  llm_onnx::layer_norm            -> LayerNormalization
  llm_onnx::add_layer_norm        -> com.microsoft.SkipLayerNormalization
  llm_onnx::gelu                  -> com.microsoft.Gelu (exact, erf)
  llm_onnx::fast_gelu             -> com.microsoft.FastGelu (tanh approximation)
  llm_onnx::rotary_embedding      -> com.microsoft.RotaryEmbedding (unfused RoPE only: by
                                     default RoPE runs inside GroupQueryAttention, do_rotary=1)
  llm_onnx::alibi_bias            -> a few shape ops (Range, Sub, Mul) feeding attention_bias
  llm_onnx::group_query_attention -> com.microsoft.GroupQueryAttention (with k_scale/v_scale:
                                     its int8 cache, PER_CHANNEL)
  llm_onnx::plain_attention       -> ScatterElements into the cache, MatMul, Softmax (the shapes
                                     GroupQueryAttention refuses: attention_form)
  llm_onnx::moe                   -> com.microsoft.MoE (SwiGLU experts)
  llm_onnx::matmul_transposed     -> com.microsoft.FusedMatMul (transB=1: weights stay (out, in))
  llm_onnx::swiglu                -> Split, Sigmoid, Mul (ONNX Runtime fuses x*sigmoid(x))

The quantized ops (matmul_nbits -> MatMulNBits, gather_nbits -> GatherBlockQuantized,
qmoe -> QMoE) exist only in exported graphs and live in ``llm_onnx/export/quant.py``.

Positions and the KV cache follow GroupQueryAttention's conventions: ``seqlens_k[b]`` is the
number of valid tokens of row b (past + new) minus one, ``total_sequence_length`` is the batch's
maximum of those counts, and the cache is one buffer of shape (B, Hkv, P, D) with P >= total.
A call where T == total is a first prompt (rows right-padded, positions 0..T-1); otherwise the T
new tokens of row b sit at positions seqlens_k[b] + 1 - T ... seqlens_k[b].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

# ----------------------------------------------------------------------------- reference math


def token_positions(seqlens_k: Tensor, total_sequence_length: Tensor, seq_len: int) -> Tensor:
    """(B, T) int64 absolute positions of the T new tokens of each row (GQA's convention)."""
    ar = torch.arange(seq_len, device=seqlens_k.device, dtype=torch.int64)  # (T,)
    later = seqlens_k.to(torch.int64)[:, None] + 1 - seq_len + ar[None, :]  # (B, T)
    first = total_sequence_length.to(torch.int64) == seq_len
    return torch.where(first, ar[None, :].expand_as(later), later).clamp_min(0)


def device_positions(input_ids: Tensor, seqlens_k: Tensor) -> tuple[Tensor, Tensor]:
    """(positions (B, T) int64, last (B,) int64): the new tokens' absolute positions and the index
    of each row's last new token, computed from ``seqlens_k`` and the values of ``input_ids`` only.

    The same numbers as ``token_positions`` and ``seqlens_k - (total - T)`` when
    total_sequence_length is max(seqlens_k) + 1 (how the runtime calls the graphs), but nothing
    here reads total_sequence_length or a host-side shape: on a GPU, host values reaching these
    device computations would make ONNX Runtime insert host-to-device copies, which rule out CUDA
    graphs and which a captured graph would freeze. T comes from a sum over a row of ones, and
    the one arange takes its length as a host input (ONNX Range reads its limits on the host)."""
    t = input_ids.shape[1]
    t_dev = (input_ids[:1] * 0 + 1).to(torch.int32).sum(dim=1).to(torch.int64)  # (1,) on device
    lengths = seqlens_k.to(torch.int64)
    longest = lengths.max()  # total - 1
    ar = torch.arange(t, device=input_ids.device, dtype=torch.int64)  # (T,)
    later = lengths[:, None] + 1 - t_dev + ar[None, :]  # (B, T)
    first = (longest + 1) == t_dev  # a first prompt: rows right-padded, positions 0 .. T-1
    positions = torch.where(first, ar[None, :].expand_as(later), later).clamp_min(0)
    last = (t_dev - 1 - (longest - lengths)).clamp_min(0)  # (B,)
    return positions, last


def rms_norm_ref(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm, statistics in fp32; output in the dtype of ``weight`` (ORT's V type)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(weight.dtype)


def layer_norm_ref(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm, statistics in fp32; output in the dtype of ``weight``."""
    y = F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)
    return y.to(weight.dtype)


def gelu_ref(x: Tensor, approximate: str) -> Tensor:
    """GELU in fp32: "none" is the exact erf form (Falcon's "gelu"), "tanh" the tanh approximation
    (GPT-2's "gelu_new", BLOOM's BloomGelu)."""
    return F.gelu(x.float(), approximate=approximate).to(x.dtype)


def alibi_slopes(num_heads: int) -> list[float]:
    """Per-head ALiBi slopes, as transformers' BLOOM computes them (in float32): a geometric series
    2^(-8/n), 2^(-16/n), ... for the largest power of two n <= H, then every other slope of the
    series for 2n for the remaining heads."""
    cpu = torch.device("cpu")  # real numbers even while a meta-device model is built
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32, device=cpu)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32, device=cpu))
    if closest != num_heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32,
                             device=cpu)
        remaining = min(closest, num_heads - closest)
        powers = torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32, device=cpu)
        slopes = torch.cat([slopes, torch.pow(extra, powers)])
    return slopes.tolist()


def rotate(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, interleaved: bool) -> Tensor:
    """Rotary embedding of x (B, T, N, D) at positions (B, T); cos/sin caches (M, R/2), R <= D.

    Non-interleaved is Llama/Qwen's rotate-half: pairs (i, i + R/2). Dimensions past R pass through.
    """
    half = cos.shape[-1]
    rot = 2 * half
    c = cos[positions][:, :, None, :].to(torch.float32)  # (B, T, 1, R/2)
    s = sin[positions][:, :, None, :].to(torch.float32)
    xr, x_pass = x[..., :rot].float(), x[..., rot:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((out.to(x.dtype), x_pass), dim=-1)


def quantize_kv(x: Tensor, scale: Tensor) -> Tensor:
    """GroupQueryAttention's int8 cache write: clip(rint(x * (1/s)), -128, 127), per channel.

    x (..., Hkv, D); scale (Hkv*D,) float32, element h * D + d scaling channel d of KV head h
    (PER_CHANNEL). 1/s is taken in float32 first, then multiplied (not x / s: 1.55 with s = 0.1
    stores 16, not 15), rounded half to even; a zero scale quantizes with 1/s = 1 (measured on
    ONNX Runtime 1.31.1: docs/notes/kv-int8-gqa.md)."""
    s = scale.float().reshape(x.shape[-2:])  # (Hkv, D)
    inv = torch.where(s == 0, torch.ones_like(s), torch.reciprocal(s))
    return torch.round(x.float() * inv).clamp(-128, 127).to(torch.int8)


def dequantize_kv(cache: Tensor, scale: Tensor) -> Tensor:
    """An int8 cache (B, Hkv, P, D) read back as float32: cache * s per channel."""
    b, h, p, d = cache.shape
    return cache.float() * scale.float().reshape(1, h, 1, d)


def attention_ref(
    query: Tensor, key: Tensor, value: Tensor, past_key: Tensor, past_value: Tensor,
    seqlens_k: Tensor, total_sequence_length: Tensor, cos_cache: Tensor | None,
    sin_cache: Tensor | None, num_heads: int, kv_num_heads: int, scale: float,
    local_window_size: int, rotary_interleaved: bool, attention_bias: Tensor | None = None,
    head_sink: Tensor | None = None, k_scale: Tensor | None = None,
    v_scale: Tensor | None = None, attend_until: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """GroupQueryAttention: optional RoPE, write new K/V into the cache, causal GQA softmax.

    query (B, T, H*D), key/value (B, T, Hkv*D), past_key/value (B, Hkv, P, D).
    Returns output (B, T, H*D) and the updated caches (B, Hkv, P, D).
    ``local_window_size`` w > 0 lets a query at position p see the w keys p - w + 1 ... p (itself
    included; measured against ONNX Runtime's kernel). ``attention_bias`` (B or 1, H or 1, T, S),
    S = total_sequence_length, is added to the scaled scores of key positions 0 ... S - 1.
    ``head_sink`` (H,): gpt-oss's sinks, one more logit in each head's softmax whose share is
    dropped (the kernel's head_sink input). ``k_scale``/``v_scale`` (Hkv*D,) float32: the cache
    is int8, the new keys (after RoPE) and values written as ``quantize_kv`` and every key and
    value read back as ``dequantize_kv`` (the kernel's k_scale/v_scale, PER_CHANNEL).
    ``attend_until`` (B, T) int64: the last key position each new token sees, if past its own
    (Gemma: an image's tokens see the whole image; zeros: causal; the window still counts back
    from the token's own position). Only plain_attention passes it: GroupQueryAttention cannot.
    """
    b, t, _ = query.shape
    d = past_key.shape[-1]
    p = past_key.shape[2]
    pos = token_positions(seqlens_k, total_sequence_length, t)  # (B, T)
    q = query.reshape(b, t, num_heads, d)
    k = key.reshape(b, t, kv_num_heads, d)
    v = value.reshape(b, t, kv_num_heads, d)
    if cos_cache is not None and sin_cache is not None:
        q = rotate(q, cos_cache, sin_cache, pos, rotary_interleaved)
        k = rotate(k, cos_cache, sin_cache, pos, rotary_interleaved)
    rows = torch.arange(b, device=query.device)[:, None].expand(b, t)
    present_key = past_key.clone()
    present_value = past_value.clone()
    quantized = k_scale is not None and v_scale is not None
    if quantized:  # int8 cache: what the kernel stores
        k, v = quantize_kv(k, k_scale), quantize_kv(v, v_scale)
    present_key[rows, :, pos] = k.to(past_key.dtype)  # (B, T, Hkv, D) into (B, Hkv, P, D)
    present_value[rows, :, pos] = v.to(past_value.dtype)

    group = num_heads // kv_num_heads
    if quantized:
        keys = dequantize_kv(present_key, k_scale).repeat_interleave(group, dim=1)  # (B,H,P,D)
        values = dequantize_kv(present_value, v_scale).repeat_interleave(group, dim=1)
    else:
        keys = present_key.float().repeat_interleave(group, dim=1)  # (B, H, P, D)
        values = present_value.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("bthd,bhpd->bhtp", q.float(), keys) * scale  # (B, H, T, P)
    if attention_bias is not None:
        s = attention_bias.shape[-1]
        scores = torch.cat([scores[..., :s] + attention_bias.float(), scores[..., s:]], dim=-1)
    kpos = torch.arange(p, device=query.device)
    limit = pos if attend_until is None else torch.maximum(pos, attend_until.to(torch.int64))
    visible = (kpos[None, None, :] <= limit[:, :, None]) & (
        kpos[None, None, :] <= seqlens_k.to(torch.int64)[:, None, None])  # (B, T, P)
    if local_window_size > 0:
        visible &= kpos[None, None, :] > pos[:, :, None] - local_window_size
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    if head_sink is not None:  # gpt-oss: softmax over [scores, sink], the sink's share dropped
        sink = head_sink.float()[None, :, None, None].expand(b, -1, t, 1)
        scores = torch.cat([scores, sink], dim=-1)
    # A padding query of a short row may see no key at all: zeros, not NaN, for its output.
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if head_sink is not None:
        probs = probs[..., :p]
    out = torch.einsum("bhtp,bhpd->bthd", probs, values).reshape(b, t, num_heads * d)
    return out.to(query.dtype), present_key, present_value


def swiglu_ref(gate: Tensor, up: Tensor, alpha: float = 1.0, beta: float = 0.0,
               limit: float | None = None) -> Tensor:
    """ONNX Runtime's fused SwiGLU in fp32: gate clamped to at most ``limit``, up to +-limit,
    then gate * sigmoid(alpha * gate) * (up + beta); (1, 0, None) is silu(gate) * up and
    gpt-oss's experts are (1.702, 1, 7)."""
    gate, up = gate.float(), up.float()
    if (alpha, beta, limit) == (1.0, 0.0, None):
        return F.silu(gate) * up
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + beta)


def moe_ref(x: Tensor, router_logits: Tensor, fc1: Tensor | Sequence[Tensor],
            fc2: Tensor | Sequence[Tensor], k: int, normalize_routing_weights: bool,
            observe: Callable[[int, Tensor, Tensor, Tensor], None] | None = None,
            fc1_bias: Tensor | None = None, fc2_bias: Tensor | None = None,
            activation: tuple[float, float, float | None] = (1.0, 0.0, None)) -> Tensor:
    """Sparse MoE with SwiGLU experts, ORT's MoE contract.

    x (N, D); router_logits (N, E) raw; fc1 (E, 2I, D) with gate/up rows interleaved
    (g0, u0, g1, u1, ...); fc2 (E, D, I). Softmax in fp32 -> top-k -> optional renormalisation.
    fc1 and fc2 may also be sequences of per-expert tensors, read only for the experts some
    token chooses (the calibration streams them from the checkpoint). ``observe(e, xe, weight,
    act)``, when given, sees each chosen expert's inputs (n, D), their routing weights (n,) and
    down's input (n, I). ``fc1_bias`` (E, 2I) (interleaved like fc1's rows) and ``fc2_bias``
    (E, D): gpt-oss's expert biases; ``activation``: (alpha, beta, limit) of ``swiglu_ref``.
    """
    probs = torch.softmax(router_logits.float(), dim=-1)  # (N, E)
    top_w, top_i = torch.topk(probs, k, dim=-1)  # (N, K)
    if normalize_routing_weights:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(len(fc1)):
        weight = (top_w * (top_i == e)).sum(-1)  # (N,) zero where e is not chosen
        chosen = weight > 0
        if not bool(chosen.any()):
            continue
        xe = x[chosen]
        h = xe @ fc1[e].t()  # (n, 2I)
        if fc1_bias is not None:
            h = h + fc1_bias[e].to(h.dtype)
        gate, up = h[:, 0::2], h[:, 1::2]
        act = swiglu_ref(gate, up, *activation).to(x.dtype)  # (n, I)
        y = act @ fc2[e].t()  # (n, D)
        if fc2_bias is not None:
            y = y + fc2_bias[e].to(y.dtype)
        if observe is not None:
            observe(e, xe, weight[chosen], act)
        out[chosen] += weight[chosen, None] * y.float()
    return out.to(x.dtype)


# ----------------------------------------------------------------------------- custom ops


@torch.library.custom_op("llm_onnx::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return rms_norm_ref(x, weight, eps)


@rms_norm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape, dtype=weight.dtype)


@torch.library.custom_op("llm_onnx::add_rms_norm", mutates_args=())
def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(RMSNorm(x + residual), x + residual): the fused residual add and norm of a block."""
    total = x + residual
    return rms_norm_ref(total, weight, eps), total


@add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape, dtype=weight.dtype), torch.empty_like(x)


@torch.library.custom_op("llm_onnx::layer_norm", mutates_args=())
def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    return layer_norm_ref(x, weight, bias, eps)


@layer_norm.register_fake
def _(x, weight, bias, eps):
    return x.new_empty(x.shape, dtype=weight.dtype)


@torch.library.custom_op("llm_onnx::add_layer_norm", mutates_args=())
def add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Tensor,
                   eps: float) -> tuple[Tensor, Tensor]:
    """(LayerNorm(x + residual), x + residual)."""
    total = x + residual
    return layer_norm_ref(total, weight, bias, eps), total


@add_layer_norm.register_fake
def _(x, residual, weight, bias, eps):
    return x.new_empty(x.shape, dtype=weight.dtype), torch.empty_like(x)


@torch.library.custom_op("llm_onnx::gelu", mutates_args=())
def gelu(x: Tensor) -> Tensor:
    return gelu_ref(x, "none")


@gelu.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("llm_onnx::fast_gelu", mutates_args=())
def fast_gelu(x: Tensor) -> Tensor:
    return gelu_ref(x, "tanh")


@fast_gelu.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("llm_onnx::alibi_bias", mutates_args=())
def alibi_bias(input_ids: Tensor, total_sequence_length: Tensor, slopes: list[float]) -> Tensor:
    """ALiBi as GroupQueryAttention's attention_bias: (1, H, T, S), S = total_sequence_length,
    slope_h * (key - query) with the T queries at positions S - T ... S - 1.

    Exact when every row ends at S (a first prompt, or batch 1); a shorter row of a ragged decode
    batch gets its bias shifted by a constant per row, which softmax ignores. BLOOM itself adds
    slope_h * key, the same up to that constant; relative distances keep the values near the
    diagonal small, which fp16 needs.
    """
    t, s = input_ids.shape[1], int(total_sequence_length)
    keys = torch.arange(s, dtype=torch.float32)  # (S,)
    queries = torch.arange(s - t, s, dtype=torch.float32)  # (T,)
    rel = keys[None, :] - queries[:, None]  # (T, S)
    return (torch.tensor(slopes, dtype=torch.float32)[:, None, None] * rel)[None]  # (1, H, T, S)


@alibi_bias.register_fake
def _(input_ids, total_sequence_length, slopes):
    s = torch.library.get_ctx().new_dynamic_size()  # the value of total_sequence_length
    return input_ids.new_empty((1, len(slopes), input_ids.shape[1], s), dtype=torch.float32)


def rotary_embedding(x: Tensor, position_ids: Tensor, cos_cache: Tensor, sin_cache: Tensor,
                     num_heads: int, interleaved: bool) -> Tensor:
    """RoPE on x (B, T, N*D) at position_ids (B, T), rotating the first R = 2 * cos_cache's
    width dimensions of each head (R < D: partial rotary, Phi-4-mini), which the ONNX op is told
    (``rotary_embedding_dim``; without it ONNX Runtime expects R = D)."""
    return _rotary_embedding(x, position_ids, cos_cache, sin_cache, num_heads, interleaved,
                             2 * cos_cache.shape[-1])


@torch.library.custom_op("llm_onnx::rotary_embedding", mutates_args=())
def _rotary_embedding(x: Tensor, position_ids: Tensor, cos_cache: Tensor, sin_cache: Tensor,
                      num_heads: int, interleaved: bool, rotary_dim: int) -> Tensor:
    b, t, width = x.shape
    y = rotate(x.reshape(b, t, num_heads, width // num_heads), cos_cache, sin_cache,
               position_ids, interleaved)
    return y.reshape(b, t, width)


@_rotary_embedding.register_fake
def _(x, position_ids, cos_cache, sin_cache, num_heads, interleaved, rotary_dim):
    return torch.empty_like(x)


def group_query_attention(
    query: Tensor, key: Tensor | None, value: Tensor | None, past_key: Tensor, past_value: Tensor,
    seqlens_k: Tensor, total_sequence_length: Tensor, cos_cache: Tensor | None,
    sin_cache: Tensor | None, num_heads: int, kv_num_heads: int, scale: float,
    local_window_size: int, rotary_interleaved: bool, attention_bias: Tensor | None = None,
    head_sink: Tensor | None = None, k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """GroupQueryAttention (see attention_ref). ``key``/``value`` None: ``query`` is packed QKV
    (B, T, H*D + 2*Hkv*D). ``cos_cache``/``sin_cache`` given: RoPE is applied inside (do_rotary;
    the op is told per call, so layers with and without RoPE share one graph: SmolLM3).
    ``attention_bias`` (1, H, T, S): added to the scores (ALiBi). ``head_sink`` (H,): gpt-oss's
    sinks. ``k_scale``/``v_scale`` (Hkv*D,) float32: an int8 cache (past_key/past_value int8)."""
    return _group_query_attention(query, key, value, past_key, past_value, seqlens_k,
                                  total_sequence_length, cos_cache, sin_cache, num_heads,
                                  kv_num_heads, scale, local_window_size, rotary_interleaved,
                                  cos_cache is not None, attention_bias, head_sink, k_scale,
                                  v_scale)


@torch.library.custom_op("llm_onnx::group_query_attention", mutates_args=())
def _group_query_attention(
    query: Tensor, key: Tensor | None, value: Tensor | None, past_key: Tensor, past_value: Tensor,
    seqlens_k: Tensor, total_sequence_length: Tensor, cos_cache: Tensor | None,
    sin_cache: Tensor | None, num_heads: int, kv_num_heads: int, scale: float,
    local_window_size: int, rotary_interleaved: bool, do_rotary: bool,
    attention_bias: Tensor | None = None, head_sink: Tensor | None = None,
    k_scale: Tensor | None = None, v_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    if key is None or value is None:
        d = past_key.shape[-1]
        query, key, value = query.split([num_heads * d, kv_num_heads * d, kv_num_heads * d], dim=-1)
    if not do_rotary:
        cos_cache = sin_cache = None
    return attention_ref(query, key, value, past_key, past_value, seqlens_k, total_sequence_length,
                         cos_cache, sin_cache, num_heads, kv_num_heads, scale, local_window_size,
                         rotary_interleaved, attention_bias, head_sink, k_scale, v_scale)


@_group_query_attention.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
      sin_cache, num_heads, kv_num_heads, *args):
    b, t, _ = query.shape
    out = query.new_empty((b, t, num_heads * past_key.shape[-1]))
    return out, torch.empty_like(past_key), torch.empty_like(past_value)


@torch.library.custom_op("llm_onnx::plain_attention", mutates_args=())
def plain_attention(
    query: Tensor, key: Tensor, value: Tensor, past_key: Tensor, past_value: Tensor,
    seqlens_k: Tensor, total_sequence_length: Tensor, positions: Tensor, num_heads: int,
    kv_num_heads: int, scale: float, local_window_size: int,
    attention_bias: Tensor | None = None, head_sink: Tensor | None = None,
    attend_until: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The attention of shapes GroupQueryAttention refuses (a head size that is not a multiple
    of 16), in plain ONNX ops over the same in-place cache: GroupQueryAttention's contract
    (attention_ref) without RoPE, which the caller applies. ``positions`` (B, T) are the new
    tokens' positions (``device_positions``); ``attend_until`` (B, T): see attention_ref."""
    return attention_ref(query, key, value, past_key, past_value, seqlens_k,
                         total_sequence_length, None, None, num_heads, kv_num_heads, scale,
                         local_window_size, False, attention_bias, head_sink,
                         attend_until=attend_until)


@plain_attention.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_sequence_length, positions,
      num_heads, *args):
    b, t, _ = query.shape
    out = query.new_empty((b, t, num_heads * past_key.shape[-1]))
    return out, torch.empty_like(past_key), torch.empty_like(past_value)


@torch.library.custom_op("llm_onnx::moe", mutates_args=())
def moe(x: Tensor, router_logits: Tensor, fc1: Tensor, fc2: Tensor, k: int,
        normalize_routing_weights: bool, fc1_bias: Tensor | None = None,
        fc2_bias: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0,
        limit: float | None = None) -> Tensor:
    """moe_ref; the biases and (alpha, beta, limit) are gpt-oss's (MoE's fc*_experts_bias,
    activation_alpha, activation_beta, swiglu_limit)."""
    return moe_ref(x, router_logits, fc1, fc2, k, normalize_routing_weights, None, fc1_bias,
                   fc2_bias, (alpha, beta, limit))


@moe.register_fake
def _(x, router_logits, fc1, fc2, k, normalize_routing_weights, *args, **kwargs):
    return torch.empty_like(x)


@torch.library.custom_op("llm_onnx::matmul_transposed", mutates_args=())
def matmul_transposed(x: Tensor, weight: Tensor) -> Tensor:
    """x @ weight^T with weight (N, K) in Hugging Face layout (FusedMatMul transB=1)."""
    return x @ weight.t()


@matmul_transposed.register_fake
def _(x, weight):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("llm_onnx::swiglu", mutates_args=())
def swiglu(gate_up: Tensor) -> Tensor:
    """silu(gate) * up for a fused projection whose last dimension is [gate | up]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@swiglu.register_fake
def _(gate_up):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))

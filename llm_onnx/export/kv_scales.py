"""An int8 KV cache's scales (``--kv-cache int8``), recorded in the calibration run
(calibrate.py) while the float model runs the calibration text one layer at a time.

Per layer, one scale per KV head and channel, (Hkv*D,) KV-head-major, as GroupQueryAttention's
PER_CHANNEL k_scale/v_scale read them. Values: the channel's largest |v| over the calibration
tokens / 127. Keys are quantized after the kernel's RoPE, whose rotation of pair (d, d + R/2)
(rotate-half, rotary_interleaved 0) keeps the pair's norm, so each of the two channels gets the
largest sqrt(k_d^2 + k_{d+R/2}^2) of the keys before RoPE: it bounds the rotated key at every
position, also those the calibration text never reached (onnxruntime-genai's builder widens its
key scales the same way). Channels past the rotary width R, and layers without RoPE, take their
|k|. A channel the text never moved gets a floor instead of 0.

The amax of a short calibration text is too small for other text: on SmolLM2-135M, teacher-forced
over 2k tokens of this repository's docs, values past their calibrated amax were clipped (0.2-0.5%
of them, holding most of the error) and the mean KL to the float cache was 5.9e-3. The scales
therefore keep headroom: keys x1.25, values x2 (KL 2.3e-3; x1/x1.5 2.8e-3, x1.5/x2 2.9e-3; scales
taken from the evaluated text itself, the best a static scale can do, 6.9e-4). Measured
2026-11-25 with benchmarks/kv_int8_fidelity.py; docs/notes/kv-int8-gqa.md has the table.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from llm_onnx.model.config import ModelConfig

KV_QMAX = 127  # an amax value stores 127 (onnxruntime-genai divides by 128: it stores 128,
# saturated to 127)
KV_FLOOR = 1e-4  # a channel's smallest scale, relative to the layer's largest
KEY_HEADROOM, VALUE_HEADROOM = 1.25, 2.0  # the calibrated amax times these (see above)
# What the manifest's kv_cache.scales says of them
DESCRIPTION = (f"per layer, KV head and channel (k_scale, v_scale: float32 (Hkv*D,)), the "
               f"amax over the calibration tokens (keys by RoPE's pair envelope) times "
               f"{KEY_HEADROOM:g} for keys and {VALUE_HEADROOM:g} for values, / {KV_QMAX}")


def kv_scale(x: Tensor, rotary: int, headroom: float = 1.0) -> Tensor:
    """PER_CHANNEL scales (Hkv*D,) float32 from the keys or values of the calibration tokens,
    x (N, Hkv, D), before RoPE: amax / 127 of each channel, where a key's first ``rotary``
    channels take RoPE's pair envelope sqrt(x_d^2 + x_{d+R/2}^2) (rotate-half pairs, R =
    ``rotary``; 0 for values and layers without RoPE), times ``headroom``. Each scale is floored at KV_FLOOR times
    the largest (1e-12 when all are 0), so 1/s stays finite."""
    a = x.double().abs()
    if rotary:
        half = rotary // 2
        pair = (a[..., :half] ** 2 + a[..., half:rotary] ** 2).sqrt()
        a = torch.cat([pair, pair, a[..., rotary:]], dim=-1)
    amax = torch.nan_to_num(a.amax(0), nan=0.0, posinf=float(torch.finfo(torch.float32).max))
    s = (amax * headroom / KV_QMAX).float().reshape(-1)
    return s.clamp_min(max(float(s.max()) * KV_FLOOR, 1e-12))


Seen = list[tuple[Tensor, Tensor]]


def watch_layer(layer: nn.Module, cfg: ModelConfig, i: int) -> Seen | None:
    """What layer ``i``'s attention hands its kernel in the next run, keys before RoPE and
    values (B, T, Hkv*D) each, collected into the returned list (None for a linear-attention or
    a KV-shared layer: no cache of its own)."""
    if layer.linear or cfg.is_kv_shared(i):
        return None
    seen: Seen = []
    layer.self_attn.observe = lambda k, v: seen.append((k, v))
    return seen


def layer_scales(layer: nn.Module, prefix: str, seen: Seen | None,
                 cos: Tensor | None) -> dict[str, Tensor]:
    """The layer's k_scale and v_scale from what ``watch_layer`` saw (then unwatched; nothing
    when it watched nothing); ``cos``: the RoPE table the layer used (half the rotary width
    wide), None without RoPE."""
    if not seen:
        return {}
    attn = layer.self_attn
    attn.observe = None
    rotary = 2 * cos.shape[-1] if attn.rope and cos is not None else 0
    shape = (-1, attn.kv_heads, attn.head_dim)
    k = torch.cat([k.reshape(shape) for k, _ in seen])
    v = torch.cat([v.reshape(shape) for _, v in seen])
    return {f"{prefix}self_attn.k_scale": kv_scale(k, rotary, KEY_HEADROOM),
            f"{prefix}self_attn.v_scale": kv_scale(v, 0, VALUE_HEADROOM)}


__all__ = ["DESCRIPTION", "KEY_HEADROOM", "KV_FLOOR", "KV_QMAX", "VALUE_HEADROOM", "kv_scale", "layer_scales", "watch_layer"]

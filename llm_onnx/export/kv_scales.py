"""An int8 KV cache's scales (``--kv-cache int8``), recorded in the calibration run
(calibrate.py) while the float model runs the calibration text one layer at a time.

Per layer, one scale per KV head and channel, (Hkv*D,) KV-head-major, as GroupQueryAttention's
PER_CHANNEL k_scale/v_scale read them, of what the cache stores:

- Layers of a power-of-two head size store keys and values in the Hadamard basis (attention.hadamard;
  values rotated in the weights, kv_rotation.py, so the calibration already sees them rotated;
  keys rotated after RoPE by the attention module). A rotated key's channel mixes every rotary
  pair, each turning with the position at its own frequency, so its range depends on where in
  the context a token sits: each calibration key is rotated to SAMPLED_POSITIONS positions drawn
  uniformly from the whole context and the scale is the largest |H RoPE(k)| seen. Values: their
  largest |v|. Headroom: keys x1.0, values x1.1.
- Other layers keep the channels as they are: values by their largest |v|; keys, quantized after
  the kernel's RoPE, whose rotation of pair (d, d + R/2) (rotate-half) keeps the pair's norm, by
  the largest sqrt(k_d^2 + k_{d+R/2}^2) of the keys before RoPE, which bounds the rotated key at
  every position (onnxruntime-genai's builder widens its key scales the same way); channels past
  the rotary width R, and layers without RoPE, by their |k|. Headroom: keys x1.25, values x2.

Why: on SmolLM2-135M, teacher-forced over 2k tokens of this repository's docs, the unrotated
cache's KL to the float cache was 5.9e-3 with the calibrated amax and 2.3e-3 with the headroom
(values past their calibrated amax were clipped: the short calibration text underestimates loud
channels); in the Hadamard basis, calibrated on the longer built-in text (calibration_text.py),
8.6e-4 (9.7e-4 exported for 8,192 positions; 1.0e-3 on a held-out text where the old form gave
2.7e-3). docs/notes/kv-int8-gqa.md has the tables. A channel the text never moved gets a floor
instead of 0.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from llm_onnx.modeling import ops
from llm_onnx.modeling.attention import hadamard, rotates_keys
from llm_onnx.modeling.config import ModelConfig

KV_QMAX = 127  # an amax value stores 127 (onnxruntime-genai divides by 128: it stores 128,
# saturated to 127)
KV_FLOOR = 1e-4  # a channel's smallest scale, relative to the layer's largest
KEY_HEADROOM, VALUE_HEADROOM = 1.25, 2.0  # the calibrated amax times these (see above)
ROTATED_KEY_HEADROOM, ROTATED_VALUE_HEADROOM = 1.0, 1.1  # in the Hadamard basis
SAMPLED_POSITIONS = 32  # positions each calibration key is rotated to
# What the manifest's kv_cache.scales says of them
DESCRIPTION = (f"per layer, KV head and channel (k_scale, v_scale: float32 (Hkv*D,)): "
               f"layers of a power-of-two head size store keys (after RoPE) and values in the "
               f"Hadamard basis, scales the amax over the calibration tokens (keys rotated to "
               f"{SAMPLED_POSITIONS} random positions each) times {ROTATED_KEY_HEADROOM:g} for "
               f"keys and {ROTATED_VALUE_HEADROOM:g} for values; other layers the amax (keys by "
               f"RoPE's pair envelope) times {KEY_HEADROOM:g} and {VALUE_HEADROOM:g}; / {KV_QMAX}")


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


def rotated_key_scale(k: Tensor, rope: tuple[Tensor, Tensor] | None, headroom: float,
                      samples: int = SAMPLED_POSITIONS) -> Tensor:
    """PER_CHANNEL scales (Hkv*D,) float32 of keys stored in the Hadamard basis after RoPE, from
    the calibration tokens' keys before RoPE, k (N, Hkv, D): each rotated by RoPE to ``samples``
    positions drawn uniformly (seeded) from the table's rows (``rope``: (cos, sin), None without
    RoPE), then by H; their amax / 127 times ``headroom``, floored as kv_scale floors."""
    n, heads, d = k.shape
    h = hadamard(d).double()
    g = torch.Generator().manual_seed(0)
    amax = torch.zeros(heads, d, dtype=torch.float64)
    for _ in range(samples if rope is not None else 1):
        x = k.float()[None]  # (1, N, Hkv, D)
        if rope is not None:
            pos = torch.randint(0, rope[0].shape[0], (1, n), generator=g)
            x = ops.rotate(x, rope[0], rope[1], pos, False)
        amax = torch.maximum(amax, (x[0].double() @ h).abs().amax(0))
    s = (torch.nan_to_num(amax, nan=0.0) * headroom / KV_QMAX).float().reshape(-1)
    return s.clamp_min(max(float(s.max()) * KV_FLOOR, 1e-12))


def layer_scales(layer: nn.Module, prefix: str, seen: Seen | None,
                 rope: tuple[Tensor, Tensor] | None, values_rotated: bool) -> dict[str, Tensor]:
    """The layer's k_scale and v_scale from what ``watch_layer`` saw (then unwatched; nothing
    when it watched nothing); ``rope``: the (cos, sin) tables the layer used (half the rotary
    width wide, as many rows as the export's context), None without RoPE; ``values_rotated``:
    kv_rotation.rotates_values, the values seen are in the Hadamard basis."""
    if not seen:
        return {}
    attn = layer.self_attn
    attn.observe = None
    spec = attn.spec
    rope = rope if spec.rope != "none" and rope is not None and rope[0] is not None else None
    shape = (-1, spec.kv_heads, spec.head_dim)
    k = torch.cat([k.reshape(shape) for k, _ in seen])
    v = torch.cat([v.reshape(shape) for _, v in seen])
    rotary = 2 * rope[0].shape[-1] if rope is not None else 0
    return {f"{prefix}self_attn.k_scale":
            rotated_key_scale(k, rope, ROTATED_KEY_HEADROOM) if rotates_keys(spec.head_dim)
            else kv_scale(k, rotary, KEY_HEADROOM),
            f"{prefix}self_attn.v_scale":
            kv_scale(v, 0, ROTATED_VALUE_HEADROOM if values_rotated else VALUE_HEADROOM)}


__all__ = ["DESCRIPTION", "KEY_HEADROOM", "KV_FLOOR", "KV_QMAX", "ROTATED_KEY_HEADROOM",
           "ROTATED_VALUE_HEADROOM", "SAMPLED_POSITIONS", "VALUE_HEADROOM", "kv_scale",
           "layer_scales", "rotated_key_scale", "watch_layer"]

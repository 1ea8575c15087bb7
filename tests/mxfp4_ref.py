"""A numpy reference of OCP's MXFP4 (microscaling, v1.0) as gpt-oss's checkpoints and llama.cpp's
GGUF files store it, written from the spec, independent of llm_onnx/checkpoints/mxfp4.py:

- an e2m1 code: bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa; exponent 0 is
  subnormal (0 or 0.5), else 2^(e - 1) * (1 + m / 2);
- an e8m0 scale: 2^(s - 127), 255 NaN;
- Hugging Face's blocks (..., G, 16): byte j of a block holds values 2j (low nibble) and 2j + 1;
- GGML's MXFP4 block (17 bytes): the scale byte, then byte j holds values j (low nibble) and
  j + 16 (llama.cpp's converter re-packs gpt-oss's bytes so).

Also a quantizer (the scale that brings the block's largest magnitude to at most 6, each value
to its nearest code), to make MXFP4 checkpoints of tiny models.
"""

from __future__ import annotations

import math

import numpy as np


def e2m1(code: int) -> float:
    sign = -1.0 if code & 0b1000 else 1.0
    exponent, mantissa = (code >> 1) & 0b11, code & 1
    if exponent == 0:
        return sign * 0.5 * mantissa
    return sign * 2.0 ** (exponent - 1) * (1 + mantissa / 2)


def e8m0(scale: int) -> float:
    return math.nan if scale == 255 else math.ldexp(1.0, scale - 127)


def decode_hf(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """(..., G, 16) uint8, (..., G) uint8 -> (..., G * 32) float64, element by element."""
    out = np.empty((*blocks.shape[:-1], 32), np.float64)
    for index in np.ndindex(*blocks.shape[:-1]):
        s = e8m0(int(scales[index]))
        for j, byte in enumerate(blocks[index]):
            out[index + (2 * j,)] = e2m1(int(byte) & 0x0F) * s
            out[index + (2 * j + 1,)] = e2m1(int(byte) >> 4) * s
    return out.reshape(*blocks.shape[:-2], -1)


CODES = np.array([e2m1(c) for c in range(16)])


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., K) floats -> HF blocks (..., K/32, 16) and scales (..., K/32), round to nearest."""
    blocks = w.reshape(*w.shape[:-1], -1, 32).astype(np.float64)
    top = np.abs(blocks).max(-1)
    with np.errstate(divide="ignore"):
        exp = np.where(top > 0, np.ceil(np.log2(np.maximum(top, 1e-300) / 6.0)), 0)
    scales = np.clip(exp + 127, 0, 254).astype(np.uint8)
    unit = np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None]
    codes = np.abs(blocks[..., None] / unit[..., None] - CODES).argmin(-1).astype(np.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.astype(np.uint8), scales


def hf_to_ggml(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """HF blocks (..., G, 16) and scales (..., G) -> GGML MXFP4 bytes (..., G * 17): per block the
    scale, then value j in byte j's low nibble and value j + 16 in its high nibble."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], -1).reshape(*blocks.shape[:-2], -1)

"""Rotary position embedding tables (cos/sin caches), including Llama 3's frequency scaling.

The rotation itself is ``ops.rotate``; these caches are what ORT's RotaryEmbedding and
GroupQueryAttention take: (max_positions, rotary_dim / 2).
"""

from __future__ import annotations

import math

import torch

from llm_onnx.model.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """(rotary_dim / 2,) float64 inverse frequencies, scaled as rope_scaling says."""
    dim = cfg.rotary_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth ramp between.
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv


def rope_cache(cfg: ModelConfig, max_positions: int, dtype: torch.dtype = torch.float32,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin caches of shape (max_positions, rotary_dim / 2), computed in float64."""
    inv = inverse_frequencies(cfg)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)

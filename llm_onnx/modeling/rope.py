"""Rotary position embedding tables (cos/sin caches), including Llama 3's frequency scaling,
YaRN (Qwen3's long context) and Phi-3's LongRoPE.

The rotation itself is ``ops.rotate``; these caches are what ORT's RotaryEmbedding and
GroupQueryAttention take: (max_positions, rotary_dim / 2).

LongRoPE (Phi-3, Phi-4-mini) divides each inverse frequency by its own factor, from one of two
lists: ``short_factor`` for sequences within ``original_max_position_embeddings``,
``long_factor`` beyond. transformers picks the list on every forward by the current length; a
table cannot follow that, so the rule here is by the table's length: tables longer than the
original context use the long factors at every position, others the short ones
(docs/architectures.md). Both lists come with an attention factor that scales cos and sin.
"""

from __future__ import annotations

import math

import torch

from llm_onnx.modeling.config import ModelConfig, longrope_attention_factor


def _scaling(cfg: ModelConfig) -> tuple[str, dict]:
    scaling = cfg.rope_scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default")), scaling


def uses_long_factors(cfg: ModelConfig, max_positions: int) -> bool:
    """LongRoPE: whether tables of ``max_positions`` rows take the long factors."""
    kind, scaling = _scaling(cfg)
    return kind == "longrope" and max_positions > int(scaling["original_max_position_embeddings"])


def attention_factor(cfg: ModelConfig) -> float:
    """What cos and sin are multiplied by: LongRoPE's ``attention_factor``, else
    sqrt(1 + ln(factor) / ln(original context)) with ``factor`` = max_position_embeddings /
    original (transformers' default); 1 for every other kind of RoPE."""
    kind, scaling = _scaling(cfg)
    if kind == "yarn":
        return _yarn(cfg)[1]
    if kind != "longrope":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    original = int(scaling["original_max_position_embeddings"])
    factor = float(scaling.get("factor") or cfg.max_position_embeddings / original)
    return longrope_attention_factor(factor, original)


def inverse_frequencies(cfg: ModelConfig, max_positions: int | None = None) -> torch.Tensor:
    """(rotary_dim / 2,) float64 inverse frequencies, scaled as rope_scaling says (LongRoPE's
    factors chosen for tables of ``max_positions`` rows, default the config's context)."""
    dim = cfg.rotary_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    kind, scaling = _scaling(cfg)
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
    elif kind == "yarn":
        # Qwen3's long context: frequencies above a ramp kept, below it divided by `factor`
        # (NTK-by-parts), cos and sin scaled by an attention factor.
        inv = _yarn(cfg)[0]
    elif kind == "proportional":
        # Gemma 4's full layers: the first partial_rotary_factor * D / 2 frequencies of a base
        # over the whole head (exponents 2j / D, not 2j / R), the rest zero: pairs (j, j + D/2)
        # past them turn by nothing. So the tables span the whole head, as GroupQueryAttention
        # takes them, and cos = 1, sin = 0 there.
        angles = int(float(scaling.get("partial_rotary_factor", 1.0)) * dim // 2)
        inv = torch.where(torch.arange(dim // 2) < angles, inv, torch.zeros_like(inv))
        inv = inv / float(scaling.get("factor", 1.0))
    elif kind == "longrope":
        # Phi-3: one factor per frequency, from the short or the long list (module docstring).
        long = uses_long_factors(cfg, max_positions or cfg.max_position_embeddings)
        factors = scaling["long_factor" if long else "short_factor"]
        inv = inv / torch.tensor(factors, dtype=torch.float64)
    return inv


def rope_cache(cfg: ModelConfig, max_positions: int, dtype: torch.dtype = torch.float32,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin caches of shape (max_positions, rotary_dim / 2), computed in float64 (times
    LongRoPE's attention factor, which transformers applies to cos and sin too)."""
    inv = inverse_frequencies(cfg, max_positions)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv[None, :]
    scale = attention_factor(cfg)
    return (torch.cos(angles) * scale).to(dtype), (torch.sin(angles) * scale).to(dtype)


def sinusoidal_table(rows: int, dim: int, zero_row: int | None = None) -> torch.Tensor:
    """Fixed sinusoidal position embeddings (rows, dim), float32, in tensor2tensor's layout as
    fairseq and XGLM use it: row n = [sin(n f_0), ..., sin(n f_{h-1}), cos(n f_0), ...] with
    f_i = 10000^(-i / (h - 1)), h = dim / 2 (an odd dim gets a zero last column). Row
    ``zero_row`` (XGLM's padding_idx) is all zeros."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / (half - 1)))
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * freqs[None, :]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1, dtype=torch.float64)], dim=1)
    if zero_row is not None:
        table[zero_row] = 0.0
    return table.float()


def _yarn(cfg: ModelConfig) -> tuple[torch.Tensor, float]:
    """YaRN's (inverse frequencies (rotary_dim / 2,) float64, attention factor), with
    transformers' defaults: ``original_max_position_embeddings`` the config's context,
    ``factor`` the context over the original, beta_fast 32, beta_slow 1, the correction range
    truncated to whole dimensions, and an attention factor of 0.1 ln(factor) + 1 (or the ratio
    of two such terms with DeepSeek's ``mscale`` and ``mscale_all_dim``)."""
    _, scaling = _scaling(cfg)
    dim, base = cfg.rotary_dim, cfg.rope_theta
    original = int(scaling.get("original_max_position_embeddings") or cfg.max_position_embeddings)
    factor = float(scaling.get("factor") or cfg.max_position_embeddings / original)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:  # the dimension turning `rotations` times
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    keep = 1 - ramp  # 1: the original frequency, 0: divided by factor
    return extrapolation / factor * (1 - keep) + extrapolation * keep, float(attention)

"""Position tables computed, never loaded: RoPE's cos / sin caches (global, and Gemma 3's local
ones) and XGLM's fixed sinusoidal table."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.rope import rope_cache, sinusoidal_table


def local_rope(cfg: ModelConfig) -> ModelConfig:
    """The config whose RoPE tables Gemma 3's sliding layers take: the local base, unscaled."""
    assert cfg.positions.rope_local_theta is not None
    return cfg.replace(rope_theta=cfg.positions.rope_local_theta, rope_scaling=None)


def global_rope(cfg: ModelConfig) -> ModelConfig:
    """The config whose RoPE tables the full (or only) layers take: Gemma 4's full layers
    rotate heads of their own size (global_head_dim)."""
    head_dim = cfg.attention.global_head_dim
    if head_dim is None or head_dim == cfg.head_dim:
        return cfg
    return cfg.replace(head_dim=head_dim)


class RotaryCache(nn.Module):
    """cos/sin tables shared by all layers: (max_positions, rotary_dim / 2). Computed, never
    loaded: on the meta device they are placeholders until ``materialize()``."""

    def __init__(self, cfg: ModelConfig, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg, self.max_positions, self.table_dtype = cfg, max_positions, dtype
        cos, sin = rope_cache(cfg, max_positions, dtype)  # meta tensors under torch.device("meta")
        self.register_buffer("cos_cache", cos, persistent=False)
        self.register_buffer("sin_cache", sin, persistent=False)

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The real cos and sin tables (on the CPU, whatever device the module is on)."""
        with torch.device("cpu"):
            return rope_cache(self.cfg, self.max_positions, self.table_dtype)

    def materialize(self) -> None:
        self.cos_cache, self.sin_cache = self.tables()


class SinusoidalPositions(nn.Module):
    """XGLM's fixed position table, read like a learned one, row ``zero_row`` zeroed; computed,
    never loaded (on the meta device a placeholder until ``materialize()``)."""

    def __init__(self, rows: int, dim: int, zero_row: int | None = None) -> None:
        super().__init__()
        self.rows, self.dim, self.zero_row = rows, dim, zero_row
        self.register_buffer("weight", sinusoidal_table(rows, dim, zero_row), persistent=False)

    def table(self) -> Tensor:
        with torch.device("cpu"):
            return sinusoidal_table(self.rows, self.dim, self.zero_row)

    def materialize(self) -> None:
        self.weight = self.table()

    def forward(self, positions: Tensor) -> Tensor:
        return F.embedding(positions, self.weight)

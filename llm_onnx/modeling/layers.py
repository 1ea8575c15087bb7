"""The decoder's basic layers: Linear in Hugging Face's (out, in) layout, and RMSNorm and
LayerNorm with fp32 statistics whose ``add`` fuses the residual sum before them; and what every
part is built or called with (Fusion, MixerInputs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llm_onnx.modeling import ops
from llm_onnx.modeling.config import ModelConfig


@dataclass(frozen=True)
class Fusion:
    """Which computations run fused. Same math either way; the parity tests run both.

    rotary: RoPE inside GroupQueryAttention (else a separate RotaryEmbedding op);
    qkv: q, k and v projections as one matmul; gate_up: the MLP's gate and up as one matmul;
    plain_attention: attention in plain ONNX ops instead of GroupQueryAttention (for the head
    sizes its kernel refuses: see attention_form), RoPE then always a separate op.
    """

    rotary: bool = True
    qkv: bool = False
    gate_up: bool = False
    plain_attention: bool = False


@dataclass
class MixerInputs:
    """What a layer's token mixer reads besides its input: each row's last valid index
    (``seqlens_k``) and the batch's total length (GroupQueryAttention's conventions), the new
    tokens' positions, the RoPE tables this layer takes (None without RoPE), ALiBi's bias and
    the tokens each row really runs (``valid``: linear-attention layers advance their state
    over those only), and the last key each new token sees where that is not its own position
    (``attend_until``, Gemma's images: ops.attention_ref)."""

    seqlens_k: Tensor
    total: Tensor
    positions: Tensor
    cos: Tensor | None = None
    sin: Tensor | None = None
    bias: Tensor | None = None
    valid: Tensor | None = None
    attend_until: Tensor | None = None


class Linear(nn.Module):
    """y = x W^T + b with Hugging Face's (out, in) weight layout."""

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = n_in, n_out
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=dtype), requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(n_out, dtype=dtype), requires_grad=False)
                     if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """RMSNorm with fp32 statistics and an fp32 weight; ``add`` fuses the residual sum before it."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width), requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(x + residual), x + residual)."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with fp32 statistics, weight and bias; ``add`` fuses the residual sum before it."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(width), requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)

    def add(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(x + residual), x + residual)."""
        return ops.add_layer_norm(x, residual, self.weight, self.bias, self.eps)


def make_norm(cfg: ModelConfig, width: int) -> RMSNorm | LayerNorm:
    """The norm ``cfg.norm`` names, over ``width`` channels."""
    if cfg.norm.norm_type == "layer":  # GPT-2, BLOOM, Falcon
        return LayerNorm(width, cfg.norm.layer_norm_epsilon)
    return RMSNorm(width, cfg.rms_norm_eps)

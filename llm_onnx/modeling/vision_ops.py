"""Custom torch ops of the vision tower and of a decoder that takes images, with their
reference math (the contract of the ONNX Runtime kernels they are exported to, see
``llm_onnx/export/vision_translations.py``):

  llm_onnx::full_attention  -> com.microsoft.MultiHeadAttention (no mask: every patch of one
                               image sees every other; ONNX Runtime's CPU kernel runs it as
                               flash attention, so a 4,096-patch image never holds the
                               4,096 x 4,096 score matrix)
  llm_onnx::scatter_rows    -> ScatterND over the (B*T, D) rows of a (B, T, D) tensor (the
                               image embeddings into the token embeddings; DeepStack's
                               features added to the hidden states)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


@torch.library.custom_op("llm_onnx::full_attention", mutates_args=())
def full_attention(query: Tensor, key: Tensor, value: Tensor, num_heads: int,
                   scale: float) -> Tensor:
    """Unmasked multi-head attention: q, k, v (1, N, H*D) -> (1, N, H*D), softmax in float32."""
    b, n, width = query.shape
    d = width // num_heads

    def heads(x: Tensor) -> Tensor:
        return x.reshape(b, n, num_heads, d).transpose(1, 2).float()  # (1, H, N, D)

    out = F.scaled_dot_product_attention(heads(query), heads(key), heads(value), scale=scale)
    return out.transpose(1, 2).reshape(b, n, width).to(query.dtype)


@full_attention.register_fake
def _(query, key, value, num_heads, scale):
    return torch.empty_like(query)


@torch.library.custom_op("llm_onnx::scatter_rows", mutates_args=())
def scatter_rows(x: Tensor, index: Tensor, rows: Tensor, add: bool) -> Tensor:
    """x (B, T, D) with its flattened rows ``index`` (M,) replaced by (``add``: increased by)
    ``rows`` (M, D), cast to x's dtype. M may be 0 (a prompt without images)."""
    b, t, d = x.shape
    flat = x.reshape(b * t, d).clone()
    rows = rows.to(x.dtype)
    if add:
        flat.index_add_(0, index, rows)
    else:
        flat[index] = rows
    return flat.reshape(b, t, d)


@scatter_rows.register_fake
def _(x, index, rows, add):
    return torch.empty_like(x)


__all__ = ["full_attention", "scatter_rows"]

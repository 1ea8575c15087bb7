"""An int8 KV cache's values in the Hadamard basis (``--kv-cache int8``), folded into the weights.

GroupQueryAttention's int8 cache has one static scale per channel of each KV head. A head's
values have a few loud channels, whose scales are coarse and whose range the calibration text
underestimates; in the basis of the normalised Hadamard matrix H (attention.hadamard: symmetric,
H @ H = I) every channel mixes all of the head's, so the channels' ranges even out and the static
scales hold on text the calibration never saw. The change of basis costs nothing at run time:

    v' = H v                    each KV head's rows of v_proj (and its bias) times H
    out' = sum_j p_j v'_j = H out   the attention output, per query head, in the same basis
    o_proj(out) = (W_o H)(H out)    each query head's columns of o_proj times H

so the float model is unchanged (to rounding) and the cache stores H v. Keys cannot be rotated in
the weights (RoPE sits between k_proj and the cache, and does not commute with H): the attention
module rotates queries and keys after RoPE instead (modeling/attention.py, ``rotate_keys``).

Measured on SmolLM2-135M, teacher-forced over 2,048 tokens of this repository's docs in torch:
docs/notes/kv-int8-gqa.md.
"""

from __future__ import annotations

import re

import torch

from llm_onnx.checkpoints.sources import TensorSource
from llm_onnx.modeling.attention import hadamard, rotates_keys
from llm_onnx.modeling.config import ModelConfig

_NAME = re.compile(r"model\.layers\.(\d+)\.self_attn\.(v_proj\.weight|v_proj\.bias|o_proj\.weight)$")


def rotates_values(cfg: ModelConfig, i: int) -> bool:
    """Whether layer ``i``'s values are stored rotated: a layer with its own cache, a
    power-of-two head size, and values that reach the cache and o_proj straight (not Gemma 4's
    normed or key-equal values, not Qwen3.5's gated output, which is multiplied per channel)."""
    return (not cfg.is_linear_layer(i) and not cfg.is_kv_shared(i)
            and rotates_keys(cfg.layer_head_dim(i))
            and not cfg.attention.value_norm and not cfg.attention.attention_output_gate
            and not cfg.layer_k_eq_v(i))


class RotatedValues:
    """``inner``'s tensors with each rotating layer's v_proj rows and o_proj columns in the
    Hadamard basis, per head (see the module's docstring); everything else as it is."""

    def __init__(self, inner: TensorSource, cfg: ModelConfig) -> None:
        self.inner, self.cfg = inner, cfg

    def names(self) -> list[str]:
        return self.inner.names()

    def shape(self, name: str):
        return self.inner.shape(name)

    def describe(self, name: str) -> str:
        return self.inner.describe(name)

    def get(self, name: str) -> torch.Tensor:
        t = self.inner.get(name)
        m = _NAME.search(name)
        if m is None or not rotates_values(self.cfg, int(m.group(1))):
            return t
        d = self.cfg.layer_head_dim(int(m.group(1)))
        h = hadamard(d).double()
        w = t.double()
        if m.group(2) == "o_proj.weight":  # (hidden, H*D): each query head's D columns @ H
            out = (w.reshape(w.shape[0], -1, d) @ h).reshape(w.shape)
        else:  # v_proj (Hkv*D, hidden) or its bias (Hkv*D,): H @ each KV head's D rows
            out = torch.einsum("ij,hj...->hi...", h, w.reshape(-1, d, *w.shape[1:]))
        # float32 at least: the rotated weights of a bfloat16 checkpoint are not bfloat16 values
        return out.reshape(t.shape).to(torch.promote_types(t.dtype, torch.float32))


def rotated_values(source: TensorSource, cfg: ModelConfig) -> TensorSource:
    """``source`` as an int8 cache's export reads it: RotatedValues where some layer rotates."""
    if any(rotates_values(cfg, i) for i in range(cfg.num_hidden_layers)):
        return RotatedValues(source, cfg)
    return source


__all__ = ["RotatedValues", "rotated_values", "rotates_values"]

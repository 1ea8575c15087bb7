"""Gemma 4's vision side: its tower and the embedder into the text width, as transformers'
``Gemma4Model.get_image_features`` computes them, one image at a time:

    pixel_values (N, P*P*3) in [0, 1], pixel_position_ids (N, 2) (x, y) of each patch
      --patch_embedder: input_proj(2 * (pixels - 0.5)) + table[0][x] + table[1][y] ---> h
    h --encoder.layers (Gemma's sandwich of four RMSNorms):
          h += post_attention_layernorm(self_attn(input_layernorm(h)))
          h += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
        self_attn: q and k RMSNorm per head (weights), v RMSNorm (none); 2-D RoPE (x turns
        the first half of each head, y the second); scores unscaled; full attention
        mlp: down(gelu_tanh(gate(x)) * up(x)); with use_clipped_linears every projection
        clamps its input and output to stored bounds
      --pool: each k x k block of patches averaged into one token (k = pooling_kernel_size),
        tokens row by row; times sqrt(hidden); with standardize (t - std_bias) * std_scale
      --embed_vision: RMSNorm (no weight), embedding_projection
      --> image_embeds (N / k², out_hidden_size)

The tower takes the image's own patches only: the first ``num_patches`` rows of the
processor's padded arrays (runtime/media/gemma4.py), whose sides are multiples of k. Padding
rows would be attended to; transformers masks them, and both then give the same tokens. The
pooling and RoPE are computed from the position values, so the graph's only dynamic axis is N.
Module attributes copy transformers' names (``model.vision_tower.*``, ``model.embed_vision.*``),
so the tensors load by name, unchanged. The residual stream, norms and softmax are float32;
projections run in ``dtype``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from llm_onnx.modeling import ops, vision_ops
from llm_onnx.modeling.gemma_vision_config import Gemma4VisionConfig
from llm_onnx.modeling.layers import Linear, RMSNorm


def _rms(x: Tensor, eps: float) -> Tensor:
    """A weightless RMSNorm over the last axis, float32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class ClippableLinear(nn.Module):
    """A bias-free projection (``.linear``); with clipping, its input and output clamped to the
    stored scalars ``input_min`` ... ``output_max``."""

    def __init__(self, n_in: int, n_out: int, clipped: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.clipped = clipped
        self.linear = Linear(n_in, n_out, False, dtype)
        if clipped:
            for name in ("input_min", "input_max", "output_min", "output_max"):
                setattr(self, name, nn.Parameter(torch.empty((), dtype=torch.float32),
                                                 requires_grad=False))

    def forward(self, x: Tensor) -> Tensor:
        if self.clipped:
            x = torch.clamp(x, self.input_min.to(x.dtype), self.input_max.to(x.dtype))
        y = self.linear(x)
        if self.clipped:
            y = torch.clamp(y, self.output_min.to(y.dtype), self.output_max.to(y.dtype))
        return y


class PatchEmbedder(nn.Module):
    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_proj = Linear(cfg.patch_width, cfg.hidden_size, False, dtype)
        # (2, rows, hidden): a table for x, one for y
        self.position_embedding_table = nn.Parameter(
            torch.empty(2, cfg.position_embedding_size, cfg.hidden_size), requires_grad=False)

    def forward(self, pixels: Tensor, positions: Tensor) -> Tensor:
        """(N, P*P*3), (N, 2) -> (N, hidden) float32."""
        x = (2 * (pixels.float() - 0.5)).to(self.input_proj.weight.dtype)
        table = self.position_embedding_table.float()
        return self.input_proj(x).float() + table[0][positions[:, 0]] + table[1][positions[:, 1]]


def rope_2d(x: Tensor, order: Tensor, cos: Tensor, sin: Tensor, heads: int) -> Tensor:
    """x (N, heads*D): the first half of each head rotated (rotate-half within it) by the x
    angles, the second by the y ones; cos, sin (2, N, D/4). Each half is RotaryEmbedding over
    heads of D/2 whose every patch has its own row of the tables (``order``: 0 .. N-1)."""
    n = x.shape[0]
    halves = x.reshape(n, heads, 2, -1)  # (N, H, 2, D/2)
    out = [ops.rotary_embedding(halves[:, :, j].reshape(1, n, -1), order, cos[j], sin[j],
                                heads, False).reshape(n, heads, 1, -1) for j in range(2)]
    return torch.cat(out, dim=2).reshape(n, -1)


class VisionAttention(nn.Module):
    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                    cfg.num_key_value_heads, cfg.head_dim)
        self.eps = cfg.rms_norm_eps
        d, clip = cfg.hidden_size, cfg.use_clipped_linears
        self.q_proj = ClippableLinear(d, self.heads * self.head_dim, clip, dtype)
        self.k_proj = ClippableLinear(d, self.kv_heads * self.head_dim, clip, dtype)
        self.v_proj = ClippableLinear(d, self.kv_heads * self.head_dim, clip, dtype)
        self.o_proj = ClippableLinear(self.heads * self.head_dim, d, clip, dtype)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, order: Tensor) -> Tensor:
        """x (N, hidden) -> (N, hidden)."""
        n, dt = x.shape[0], x.dtype
        q = self.q_norm(self.q_proj(x).reshape(n, self.heads, -1)).reshape(n, -1)
        k = self.k_norm(self.k_proj(x).reshape(n, self.kv_heads, -1)).reshape(n, -1)
        v = _rms(self.v_proj(x).reshape(n, self.kv_heads, -1), self.eps)  # (N, Hkv, D)
        q = rope_2d(q.to(dt), order, cos.to(dt), sin.to(dt), self.heads)
        k = rope_2d(k.to(dt), order, cos.to(dt), sin.to(dt), self.kv_heads)
        group = self.heads // self.kv_heads
        if group > 1:  # every query head of a group reads its KV head
            k = k.reshape(n, self.kv_heads, 1, -1).expand(-1, -1, group, -1)
            v = v.reshape(n, self.kv_heads, 1, -1).expand(-1, -1, group, -1)
        k, v = k.reshape(1, n, -1), v.reshape(1, n, -1).to(dt)
        out = vision_ops.full_attention(q[None], k, v, self.heads, 1.0)  # Gemma: unscaled
        return self.o_proj(out.reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.act = cfg.hidden_activation
        d, i, clip = cfg.hidden_size, cfg.intermediate_size, cfg.use_clipped_linears
        self.gate_proj = ClippableLinear(d, i, clip, dtype)
        self.up_proj = ClippableLinear(d, i, clip, dtype)
        self.down_proj = ClippableLinear(i, d, clip, dtype)

    def forward(self, x: Tensor) -> Tensor:
        gate = self.gate_proj(x)
        act = ops.gelu(gate) if self.act == "gelu" else ops.fast_gelu(gate)
        return self.down_proj(act * self.up_proj(x))


class VisionLayer(nn.Module):
    """Gemma's sandwich: a norm before and after the attention and the MLP."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.self_attn = VisionAttention(cfg, dtype)
        self.mlp = VisionMLP(cfg, dtype)
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.pre_feedforward_layernorm = RMSNorm(d, eps)
        self.post_feedforward_layernorm = RMSNorm(d, eps)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, order: Tensor) -> Tensor:
        a = self.self_attn(self.input_layernorm(h).to(self.dtype), cos, sin, order)
        h = h + self.post_attention_layernorm(a.float())
        m = self.mlp(self.pre_feedforward_layernorm(h).to(self.dtype))
        return h + self.post_feedforward_layernorm(m.float())


class _Layers(nn.Module):
    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.layers = nn.ModuleList(VisionLayer(cfg, dtype) for _ in range(cfg.num_hidden_layers))


class Gemma4VisionTower(nn.Module):
    """transformers' ``model.vision_tower`` (see the module docstring)."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = cfg
        self.patch_embedder = PatchEmbedder(cfg, dtype)
        self.encoder = _Layers(cfg, dtype)
        if cfg.standardize:
            self.std_bias = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)
            self.std_scale = nn.Parameter(torch.empty(cfg.hidden_size), requires_grad=False)

    def rope_tables(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin (2, N, D/4) float32: row 0 the x angles, row 1 the y angles."""
        quarter = self.config.head_dim // 4
        exponent = torch.arange(quarter, device=positions.device, dtype=torch.float32) / quarter
        inv = 1.0 / self.config.rope_theta ** exponent  # (D/4,)
        angles = positions.t().float()[:, :, None] * inv  # (2, N, D/4)
        return angles.cos(), angles.sin()

    def pool(self, h: Tensor, positions: Tensor) -> Tensor:
        """(N, hidden) -> (N / k², hidden): the mean of each k x k block of patches, blocks
        row by row (a one-hot matrix from the positions: no shape depends on their values)."""
        k = self.config.pooling_kernel_size
        columns = positions[:, 0].max() + 1  # the image's width in patches
        block = positions[:, 0] // k + (columns // k) * (positions[:, 1] // k)  # (N,)
        tokens = torch.arange(h.shape[0] // (k * k), device=h.device, dtype=block.dtype)
        weights = (block[None, :] == tokens[:, None]).float() / (k * k)  # (N / k², N)
        return weights @ h.float()

    def forward(self, pixel_values: Tensor, pixel_position_ids: Tensor) -> Tensor:
        cfg = self.config
        h = self.patch_embedder(pixel_values, pixel_position_ids)
        cos, sin = self.rope_tables(pixel_position_ids)
        order = torch.arange(h.shape[0], device=h.device, dtype=torch.int64)[None]  # (1, N)
        for layer in self.encoder.layers:
            h = layer(h, cos, sin, order)
        h = self.pool(h, pixel_position_ids) * cfg.hidden_size ** 0.5
        if cfg.standardize:
            h = (h - self.std_bias.float()) * self.std_scale.float()
        return h  # (N / k², hidden) float32


class MultimodalEmbedder(nn.Module):
    """transformers' ``model.embed_vision``: RMSNorm without a weight, then a projection."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps, self.dtype = cfg.rms_norm_eps, dtype
        self.embedding_projection = Linear(cfg.hidden_size, cfg.out_hidden_size, False, dtype)

    def forward(self, x: Tensor) -> Tensor:  # (the projection's dtype: quantized, it has no weight)
        return self.embedding_projection(_rms(x, self.eps).to(self.dtype)).float()


class _Holder(nn.Module):
    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.vision_tower = Gemma4VisionTower(cfg, dtype)
        self.embed_vision = MultimodalEmbedder(cfg, dtype)


class Gemma4VisionEncoder(nn.Module):
    """The vision graph's root: pixel_values (N, P*P*3) float32 in [0, 1] and
    pixel_position_ids (N, 2) int64 of one image -> image_embeds (N / k², out_hidden_size)
    float32. The modules sit under ``model.`` (the checkpoints' names)."""

    def __init__(self, cfg: Gemma4VisionConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Holder(cfg, dtype)

    def forward(self, pixel_values: Tensor, pixel_position_ids: Tensor) -> Tensor:
        m = self.model
        return m.embed_vision(m.vision_tower(pixel_values, pixel_position_ids))


__all__ = ["Gemma4VisionEncoder", "rope_2d"]

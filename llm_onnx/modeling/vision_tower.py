"""The Qwen vision tower (Qwen3-VL, Qwen3.5, Qwen3.6): one image's patches in, its soft
tokens' embeddings out (and, for Qwen3-VL, DeepStack's features), as transformers'
``Qwen3VLVisionModel`` / ``Qwen3_5VisionModel`` compute them.

    pixel_values (N, C*T*P*P) --patch_embed (a linear map: the checkpoint's Conv3d)--+
    position_index, position_weight (N, 4) --pos_embed rows, blended bilinearly-----+--> h
    h --blocks: h += attn(norm1(h)) with 2-D RoPE (rotary_cos, rotary_sin: (N, D/2));
                h += mlp(norm2(h))
      --merger: norm, each merge² consecutive patches' features as one row, fc1, GELU, fc2
      --> image_embeds (N / merge², out_hidden_size)
    after block deepstack_visual_indexes[j]: deepstack_merger_list[j] (its norm over the
    concatenated row) --> deepstack_embeds[j]

What transformers computes from ``grid_thw`` inside the model (each patch's (row, column), the
bilinear taps into the learned position grid, the RoPE angles, the attention's per-image
segments) is computed by the caller, one image at a time, and given as inputs: the graph then
has no data-dependent shapes and its attention is plain full attention over one image
(runtime/core/vision.py computes them in numpy; ``patch_inputs`` here in torch, for the tests
and the parity gate).

Module attributes copy transformers' names, so ``model.visual.*`` tensors load by name; the
export's root (``VisionEncoder``) holds the tower under ``model.visual``. The residual stream,
norms and attention softmax are float32; projections run in ``dtype``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from llm_onnx.modeling import ops, vision_ops
from llm_onnx.modeling.layers import LayerNorm, Linear
from llm_onnx.modeling.vision_config import VisionConfig


def _act(name: str, x: Tensor) -> Tensor:
    return ops.gelu(x) if name == "gelu" else ops.fast_gelu(x)  # the tanh approximation


class PatchEmbed(nn.Module):
    """transformers' Conv3d with kernel = stride = one patch: a linear map of the flattened
    patch (its weight read as (hidden, C*T*P*P))."""

    def __init__(self, cfg: VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.proj = Linear(cfg.patch_width, cfg.hidden_size, True, dtype)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.proj(pixels.to(self.proj.weight.dtype)).float()


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, 3 * cfg.hidden_size, True, dtype)
        self.proj = Linear(cfg.hidden_size, cfg.hidden_size, True, dtype)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, order: Tensor) -> Tensor:
        """x (N, hidden) -> (N, hidden); ``order`` (1, N): 0 .. N-1 (each patch's row of cos and
        sin, which rotate the whole head: height angles, then width angles)."""
        n = x.shape[0]
        width = self.heads * self.head_dim
        qkv = self.qkv(x)[None]  # (1, N, 3*H*D), rows q | k | v
        q, k, v = qkv[..., :width], qkv[..., width:2 * width], qkv[..., 2 * width:]
        q = ops.rotary_embedding(q, order, cos.to(q.dtype), sin.to(q.dtype), self.heads, False)
        k = ops.rotary_embedding(k, order, cos.to(k.dtype), sin.to(k.dtype), self.heads, False)
        out = vision_ops.full_attention(q, k, v, self.heads, self.head_dim ** -0.5)
        return self.proj(out.reshape(n, width))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.act = cfg.hidden_act
        self.linear_fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, True, dtype)
        self.linear_fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, True, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(_act(self.act, self.linear_fc1(x)))


class VisionBlock(nn.Module):
    """Pre-norm LayerNorm block: h += attn(norm1(h)); h += mlp(norm2(h))."""

    def __init__(self, cfg: VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.norm1 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.norm2 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.attn = VisionAttention(cfg, dtype)
        self.mlp = VisionMLP(cfg, dtype)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, order: Tensor) -> Tensor:
        h = h + self.attn(self.norm1(h).to(self.dtype), cos, sin, order).float()
        return h + self.mlp(self.norm2(h).to(self.dtype)).float()


class PatchMerger(nn.Module):
    """merge² neighbouring patches (consecutive rows) -> one token: LayerNorm (per patch, or,
    ``postshuffle``, over the concatenated row: DeepStack's mergers), fc1, GELU (exact), fc2."""

    def __init__(self, cfg: VisionConfig, dtype: torch.dtype, postshuffle: bool) -> None:
        super().__init__()
        self.dtype, self.postshuffle = dtype, postshuffle
        self.width = cfg.hidden_size * cfg.merge_unit
        self.norm = LayerNorm(self.width if postshuffle else cfg.hidden_size, 1e-6)
        self.linear_fc1 = Linear(self.width, self.width, True, dtype)
        self.linear_fc2 = Linear(self.width, cfg.out_hidden_size, True, dtype)

    def forward(self, h: Tensor) -> Tensor:
        x = self.norm(h.reshape(-1, self.width)) if self.postshuffle else \
            self.norm(h).reshape(-1, self.width)  # (N / merge², merge² * hidden)
        return self.linear_fc2(ops.gelu(self.linear_fc1(x.to(self.dtype)))).float()


class QwenVisionTower(nn.Module):
    """transformers' ``model.visual`` (see the module docstring for the forward)."""

    def __init__(self, cfg: VisionConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        self.patch_embed = PatchEmbed(cfg, dtype)
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size,
                                      dtype=torch.float32)
        self.pos_embed.weight.requires_grad_(False)
        self.blocks = nn.ModuleList(VisionBlock(cfg, dtype) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg, dtype, postshuffle=False)
        self.deepstack_merger_list = nn.ModuleList(
            PatchMerger(cfg, dtype, postshuffle=True) for _ in cfg.deepstack_visual_indexes)

    def forward(self, pixel_values: Tensor, position_index: Tensor, position_weight: Tensor,
                rotary_cos: Tensor, rotary_sin: Tensor) -> tuple[Tensor, ...]:
        h = self.patch_embed(pixel_values)  # (N, hidden) float32
        table = self.pos_embed(position_index).float()  # (N, 4, hidden)
        h = h + (table * position_weight[:, :, None]).sum(1)
        order = torch.arange(h.shape[0], device=h.device, dtype=torch.int64)[None]  # (1, N)
        deepstack = []
        for i, block in enumerate(self.blocks):
            h = block(h, rotary_cos, rotary_sin, order)
            if i in self.config.deepstack_visual_indexes:
                j = self.config.deepstack_visual_indexes.index(i)
                deepstack.append(self.deepstack_merger_list[j](h))
        embeds = self.merger(h)
        if not deepstack:
            return (embeds,)
        return embeds, torch.stack(deepstack)  # (K, N / merge², out)


class _Holder(nn.Module):
    def __init__(self, visual: QwenVisionTower) -> None:
        super().__init__()
        self.visual = visual


class VisionEncoder(nn.Module):
    """The vision graph's root: the tower under ``model.visual`` (the checkpoints' names)."""

    def __init__(self, cfg: VisionConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Holder(QwenVisionTower(cfg, dtype))

    @property
    def tower(self) -> QwenVisionTower:
        return self.model.visual

    def forward(self, pixel_values: Tensor, position_index: Tensor, position_weight: Tensor,
                rotary_cos: Tensor, rotary_sin: Tensor) -> tuple[Tensor, ...]:
        return self.model.visual(pixel_values, position_index, position_weight, rotary_cos,
                                 rotary_sin)


# ----------------------------------------------------------------------------- its inputs


def patch_inputs(cfg: VisionConfig, grid_thw: tuple[int, int, int],
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(position_index, position_weight, rotary_cos, rotary_sin) of one image whose patch grid
    is ``grid_thw``, as transformers' vision_utils computes them (float32): the patches in the
    processor's order (each merge × merge group consecutive, groups row by row)."""
    t, h, w = grid_thw
    m = cfg.spatial_merge_size
    rows = torch.arange(h).reshape(h // m, m, 1, 1).expand(h // m, m, w // m, m)
    cols = torch.arange(w).reshape(1, 1, w // m, m).expand(h // m, m, w // m, m)
    rows = rows.permute(0, 2, 1, 3).reshape(-1).repeat(t)  # (N,) block order
    cols = cols.permute(0, 2, 1, 3).reshape(-1).repeat(t)
    side = cfg.grid_side

    def taps(index: Tensor, size: int) -> tuple[Tensor, Tensor]:
        src = index.float() * (side - 1) / max(size - 1, 1)  # align_corners=True
        floor = torch.floor(src)
        offsets = torch.arange(2)
        tap = (floor.long()[:, None] + offsets).clamp(0, side - 1)
        return tap, (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)

    (ht, hw), (wt, ww) = taps(rows, h), taps(cols, w)
    index = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
    weight = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
    spatial = cfg.head_dim // 2  # height and width each turn a quarter of the head
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
    angles = torch.cat([rows[:, None].float() * inv, cols[:, None].float() * inv], dim=-1)
    return index, weight, angles.cos(), angles.sin()


__all__ = ["QwenVisionTower", "VisionEncoder", "patch_inputs"]

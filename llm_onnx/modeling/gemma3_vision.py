"""Gemma 3's vision side: SigLIP and the multimodal projector, as transformers'
``Gemma3Model.get_image_features`` computes them. Images in, soft tokens' embeddings out:

    pixel_values (I, C, S, S) --cut into (S/P)² patches, each (C*P*P,) channel-major
        --patch_embedding (a linear map: the checkpoint's Conv2d) + position_embedding ----> h
    h --encoder.layers: h += self_attn(layer_norm1(h)) (full attention over one image);
                        h += mlp(layer_norm2(h)) (fc1, GELU (tanh), fc2)
      --post_layernorm --> (I, N, hidden)
    multi_modal_projector: the (S/P) x (S/P) grid average-pooled by k x k to
        mm_tokens_per_image tokens, RMSNorm (mm_soft_emb_norm), @ mm_input_projection_weight
      --> image_embeds (I * mm_tokens_per_image, out_hidden_size), image by image

Every image has the same size (the processor resizes to image_size), so the graph's only
dynamic axis is the number of images I; nothing depends on the pixels' values. Module
attributes copy transformers' names (``model.vision_tower.*``,
``model.multi_modal_projector.*``), so the tensors load by name; two change layout on reading
(checkpoints/vision.py): the Conv2d's weight is flattened to (hidden, C*P*P) and the
projector's norm weight w is stored as 1 + w (Gemma's RMSNorm multiplies by 1 + w).
The residual stream, norms and softmax are float32; projections run in ``dtype``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from llm_onnx.modeling import ops, vision_ops
from llm_onnx.modeling.gemma_vision_config import Gemma3VisionConfig
from llm_onnx.modeling.layers import LayerNorm, Linear, RMSNorm


def _act(name: str, x: Tensor) -> Tensor:
    return ops.gelu(x) if name == "gelu" else ops.fast_gelu(x)  # the tanh approximation


class SiglipEmbeddings(nn.Module):
    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embedding = Linear(cfg.patch_width, cfg.hidden_size, True, dtype)
        self.position_embedding = nn.Embedding(cfg.num_patches, cfg.hidden_size,
                                               dtype=torch.float32)
        self.position_embedding.weight.requires_grad_(False)

    def forward(self, pixels: Tensor) -> Tensor:
        """(I, C, S, S) -> (I, N, hidden) float32, patches row by row."""
        c, p, g = self.cfg.num_channels, self.cfg.patch_size, self.cfg.patches_per_side
        x = pixels.reshape(-1, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5)  # (I, g, g, C, P, P)
        x = x.reshape(-1, g * g, c * p * p)  # (I, N, C*P*P), as the Conv2d's weight flattens
        h = self.patch_embedding(x.to(self.patch_embedding.weight.dtype)).float()
        return h + self.position_embedding.weight.float()  # (N, hidden) broadcast over I


class SiglipAttention(nn.Module):
    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        d = cfg.hidden_size
        self.k_proj = Linear(d, d, True, dtype)
        self.v_proj = Linear(d, d, True, dtype)
        self.q_proj = Linear(d, d, True, dtype)
        self.out_proj = Linear(d, d, True, dtype)

    def forward(self, x: Tensor) -> Tensor:
        """x (I, N, hidden) -> (I, N, hidden): every patch of an image sees every other."""
        out = vision_ops.full_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x),
                                        self.heads, self.head_dim ** -0.5)
        return self.out_proj(out)


class SiglipMLP(nn.Module):
    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.act = cfg.hidden_act
        self.fc1 = Linear(cfg.hidden_size, cfg.intermediate_size, True, dtype)
        self.fc2 = Linear(cfg.intermediate_size, cfg.hidden_size, True, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(_act(self.act, self.fc1(x)))


class SiglipEncoderLayer(nn.Module):
    """Pre-norm LayerNorm block: h += attn(norm1(h)); h += mlp(norm2(h))."""

    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.layer_norm1 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.self_attn = SiglipAttention(cfg, dtype)
        self.layer_norm2 = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.mlp = SiglipMLP(cfg, dtype)

    def forward(self, h: Tensor) -> Tensor:
        h = h + self.self_attn(self.layer_norm1(h).to(self.dtype)).float()
        return h + self.mlp(self.layer_norm2(h).to(self.dtype)).float()


class _Layers(nn.Module):
    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(cfg, dtype)
                                    for _ in range(cfg.num_hidden_layers))


class SiglipVisionTower(nn.Module):
    """transformers' ``model.vision_tower`` (SigLIP without its pooling head)."""

    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.embeddings = SiglipEmbeddings(cfg, dtype)
        self.encoder = _Layers(cfg, dtype)
        self.post_layernorm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, pixel_values: Tensor) -> Tensor:
        h = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            h = layer(h)
        return self.post_layernorm(h)  # (I, N, hidden) float32


class Gemma3Projector(nn.Module):
    """transformers' ``model.multi_modal_projector``: average pooling to the soft-token grid,
    RMSNorm (its weight stored as 1 + w), projection to the text width."""

    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg = cfg
        # (vision hidden, text hidden): multiplied from the right, as transformers does
        self.mm_input_projection_weight = nn.Parameter(
            torch.empty(cfg.hidden_size, cfg.out_hidden_size, dtype=dtype), requires_grad=False)
        self.mm_soft_emb_norm = RMSNorm(cfg.hidden_size, cfg.layer_norm_eps)

    def forward(self, h: Tensor) -> Tensor:
        """(I, N, hidden) -> (I, tokens, out_hidden_size) float32."""
        cfg = self.cfg
        t, k = cfg.tokens_per_side, cfg.pool_kernel
        grid = h.reshape(-1, t, k, t, k, cfg.hidden_size)  # patch (row, col) = (a*k+i, b*k+j)
        pooled = grid.mean(dim=(2, 4)).reshape(-1, t * t, cfg.hidden_size)  # AvgPool2d(k, k)
        normed = self.mm_soft_emb_norm(pooled)
        w = self.mm_input_projection_weight
        return torch.matmul(normed.to(w.dtype), w).float()


class _Holder(nn.Module):
    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.vision_tower = SiglipVisionTower(cfg, dtype)
        self.multi_modal_projector = Gemma3Projector(cfg, dtype)


class Gemma3VisionEncoder(nn.Module):
    """The vision graph's root: pixel_values (I, C, S, S) float32, normalised as the processor
    leaves them -> image_embeds (I * mm_tokens_per_image, out_hidden_size) float32, image by
    image. The modules sit under ``model.`` (the checkpoints' names)."""

    def __init__(self, cfg: Gemma3VisionConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Holder(cfg, dtype)

    def forward(self, pixel_values: Tensor) -> Tensor:
        m = self.model
        out = m.multi_modal_projector(m.vision_tower(pixel_values))
        return out.reshape(-1, self.config.out_hidden_size)


__all__ = ["Gemma3VisionEncoder"]

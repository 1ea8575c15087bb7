"""What a decoder that takes images does besides a text decoder (``Decoder(cfg, vision=...)``):

- the image embeddings replace the token embeddings at the image positions
  (``image_token_index``: each embedding's index among the B*T new tokens, row-major);
- multimodal RoPE (Qwen): each token has three positions (time, height, width; ``position_ids``
  (3, B, T)), and each rotary frequency turns by one of them (``mrope_tables``), so RoPE runs
  as its own op over per-token tables rather than inside GroupQueryAttention;
- DeepStack (Qwen3-VL): features of the vision tower's middle blocks are added to the hidden
  states at the image positions after each of the first K layers;
- an image's tokens see each other both ways (Gemma 3, Gemma 4's sliding layers: transformers'
  token_type_ids mask): ``attend_until`` (B, T) gives each new token the last key position it
  sees: its own for text, the last of its image's run of tokens for an image token
  (``image_attend_until``). Only prefill needs it: a later token sees the image causally.

A prompt without images passes empty ``image_embeds`` (0, D), ``image_token_index`` (0,) and
``deepstack_embeds`` (K, 0, D): the scatters then change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from llm_onnx.modeling import vision_ops
from llm_onnx.modeling.vision_config import VisionConfig


@dataclass
class ImageInputs:
    """The decoder's image inputs of one run (see the module docstring)."""

    position_ids: Tensor | None  # (3, B, T) int64 (Qwen's multimodal RoPE)
    image_embeds: Tensor  # (M, D) float32
    image_token_index: Tensor  # (M,) int64
    deepstack_embeds: Tensor | None = None  # (K, M, D) float32 (Qwen3-VL)
    attend_until: Tensor | None = None  # (B, T) int64 (Gemma)

    def place(self, embedded: Tensor) -> Tensor:
        """The token embeddings (B, T, D) with the image embeddings in place."""
        return vision_ops.scatter_rows(embedded, self.image_token_index, self.image_embeds,
                                       False)

    def deepstack(self, hidden: Tensor, layer: int) -> Tensor:
        """``hidden`` (B, T, D) after decoder layer ``layer``, plus DeepStack's features of that
        layer at the image positions (unchanged past the K layers that take them)."""
        ds = self.deepstack_embeds
        if ds is None or layer >= ds.shape[0]:
            return hidden
        return vision_ops.scatter_rows(hidden, self.image_token_index, ds[layer], True)


def mrope_tables(cos_cache: Tensor, sin_cache: Tensor, position_ids: Tensor,
                 section: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token RoPE tables of multimodal RoPE, interleaved as Qwen3-VL and Qwen3.5 do it:
    frequency j turns by the height position where j % 3 == 1 and j < 3 * section[1], by the
    width position where j % 3 == 2 and j < 3 * section[2], else by the time position.

    cos_cache, sin_cache: (max_positions, R/2); position_ids (3, B, T). Returns cos and sin
    (B*T, R/2) and each token's row in them, (B, T): what RotaryEmbedding takes as its cache
    and position ids."""
    _, b, t = position_ids.shape
    half = cos_cache.shape[-1]
    j = torch.arange(half, device=position_ids.device, dtype=torch.int64)
    by_h = ((j % 3) == 1) & (j < 3 * section[1])
    by_w = ((j % 3) == 2) & (j < 3 * section[2])

    def table(cache: Tensor) -> Tensor:
        rows = cache[position_ids]  # (3, B, T, R/2)
        return torch.where(by_h, rows[1], torch.where(by_w, rows[2], rows[0])).reshape(
            b * t, half)

    order = torch.arange(b * t, device=position_ids.device, dtype=torch.int64).reshape(b, t)
    return table(cos_cache), table(sin_cache), order


def image_attend_until(is_image: Tensor, positions: Tensor) -> Tensor:
    """``attend_until`` (B, T) int64 of new tokens at ``positions`` (B, T), ``is_image`` (B, T)
    marking image tokens: a token's own position, or for an image token the position of the
    last token of its run of consecutive image tokens (one image; transformers' blocks). A run
    cut by the end of the T tokens ends there: a prefill must not split an image."""
    b, t = is_image.shape
    index = torch.arange(t, device=is_image.device, dtype=torch.int64).expand(b, t)
    # the first text index at or after each index (T past the end), by a reversed running min
    text_at = torch.where(is_image, torch.full_like(index, t), index)
    run_end = text_at.flip(-1).cummin(-1).values.flip(-1)  # (B, T)
    last = torch.where(is_image, run_end - 1, index)
    return positions.to(torch.int64) + (last - index)


def text_positions(past: int, length: int, batch: int = 1, offset: int = 0) -> Tensor:
    """(3, B, T) positions of text tokens at cache indices past .. past + T - 1 (plus
    ``offset``: after an image, text positions run behind the cache index)."""
    row = torch.arange(past, past + length, dtype=torch.int64) + offset
    return row.reshape(1, 1, length).expand(3, batch, length).contiguous()


def no_images(vision: VisionConfig, width: int) -> dict[str, Tensor]:
    """Empty image inputs (a prompt without images), as keyword arguments of the forward."""
    out = {"image_embeds": torch.zeros(0, width), "image_token_index": torch.zeros(
        0, dtype=torch.int64)}
    if vision.deepstack_layers:
        out["deepstack_embeds"] = torch.zeros(vision.deepstack_layers, 0, width)
    return out


__all__ = ["ImageInputs", "image_attend_until", "mrope_tables", "no_images", "text_positions"]

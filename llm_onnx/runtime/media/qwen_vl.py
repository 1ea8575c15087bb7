"""Qwen's image processor (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, Qwen3.6: transformers'
``Qwen2VLImageProcessorPil``, which ``AutoImageProcessor`` picks for all of them).

- resize (``smart_resize``): to the nearest multiple of patch × merge (32 for Qwen3-VL/3.5,
  28 for Qwen2-VL) on each side, then, if the area is past ``max_pixels`` (or short of
  ``min_pixels``), scaled by the square root of the ratio and rounded down (up) to multiples
  again; an aspect ratio past 200 is refused. Bicubic by default.
- rescale by 1/255, normalise by the config's mean and std (CLIP's by default; 0.5 for
  Qwen3-VL and Qwen3.5).
- patches: (grid_h · grid_w, 3 · temporal · patch · patch) float32, each 2 × 2 group of
  neighbouring patches (one soft token after the merger) consecutive, groups in row-major
  order; a still image is its own second frame (the temporal patch repeats it).
- tokens: grid_h · grid_w / merge², placed at ``<|image_pad|>`` ids, with three position rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from llm_onnx.errors import MediaError
from llm_onnx.runtime.media.fields import Fields
from llm_onnx.runtime.media.image import RGBImage
from llm_onnx.runtime.media.pixels import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    ProcessedImage,
    rescale_normalize,
    resize,
)
from llm_onnx.runtime.media.prompt import ImageTokenLayout

MAX_ASPECT_RATIO = 200


@dataclass(frozen=True, kw_only=True)
class QwenVLImageProcessor:
    """Settings as transformers names them; the defaults are ``Qwen2VLImageProcessorPil``'s."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    resample: int = 3  # bicubic
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    family = "qwen_vl"
    image_processor_type = "Qwen2VLImageProcessor"

    @classmethod
    def from_fields(cls, fields: Fields, processor: Mapping[str, Any]) -> QwenVLImageProcessor:
        d = cls()
        fields.flag("do_convert_rgb", True, must_be=True)
        fields.flag("do_resize", True, must_be=True)
        # `size` holds the pixel bounds; top-level min_pixels / max_pixels override it
        size = fields.size("size", {"shortest_edge": d.min_pixels, "longest_edge": d.max_pixels},
                           keys=("shortest_edge", "longest_edge"))
        return cls(patch_size=fields.integer("patch_size", d.patch_size),
                   temporal_patch_size=fields.integer("temporal_patch_size",
                                                      d.temporal_patch_size),
                   merge_size=fields.integer("merge_size", d.merge_size),
                   min_pixels=fields.integer("min_pixels", size["shortest_edge"]),
                   max_pixels=fields.integer("max_pixels", size["longest_edge"]),
                   resample=fields.resample("resample", d.resample),
                   do_rescale=fields.flag("do_rescale", d.do_rescale),
                   rescale_factor=fields.number("rescale_factor", d.rescale_factor),
                   do_normalize=fields.flag("do_normalize", d.do_normalize),
                   image_mean=fields.channels("image_mean", d.image_mean),
                   image_std=fields.channels("image_std", d.image_std))

    def to_dict(self) -> dict[str, Any]:
        """The settings as a preprocessor_config.json that transformers reads back."""
        return {"image_processor_type": self.image_processor_type, **asdict(self)}

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after ``smart_resize``."""
        if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
            raise MediaError(f"a {width}×{height} image: the aspect ratio "
                             f"{max(height, width) / min(height, width):.0f} is past "
                             f"{MAX_ASPECT_RATIO}, the most this family's processor takes; "
                             "crop or pad the image.")
        factor = self.patch_size * self.merge_size
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def num_tokens(self, height: int, width: int) -> int:
        """The soft tokens a ``height`` × ``width`` image becomes."""
        h, w = self.target_size(height, width)
        return (h // self.patch_size) * (w // self.patch_size) // self.merge_size ** 2

    def __call__(self, image: RGBImage) -> ProcessedImage:
        h, w = self.target_size(image.height, image.width)
        x = rescale_normalize(resize(image.pixels, h, w, self.resample),
                              do_rescale=self.do_rescale, rescale_factor=self.rescale_factor,
                              do_normalize=self.do_normalize, mean=self.image_mean,
                              std=self.image_std)  # (C, H, W)
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        gh, gw = h // p, w // p
        patches = x.reshape(3, gh // m, m, p, gw // m, m, p)
        patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, p, p)
        # a still image is both frames of the temporal patch: (..., C, t, p, p)
        patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], t, p, p))
        return ProcessedImage(pixel_values=np.ascontiguousarray(
                                  patches.reshape(gh * gw, 3 * t * p * p)),
                              num_tokens=gh * gw // m ** 2, size=(h, w), image=image,
                              grid_thw=(1, gh, gw), token_grid=(1, gh // m, gw // m))

    def token_layout(self, encode: Callable[[str], Sequence[int]],
                     tokens: Mapping[str, str] | None = None) -> ImageTokenLayout:
        """The prompt's image block: ``<|image_pad|>`` × N (the chat template writes the
        ``<|vision_start|>`` / ``<|vision_end|>`` around it). ``tokens`` may rename
        ``image_token`` (tokenizer_config.json's name for it)."""
        pad = (tokens or {}).get("image_token", "<|image_pad|>")
        return ImageTokenLayout.build(encode, placeholder=pad, image_token=pad, mrope=True)

"""Gemma 4's image processor (transformers' ``Gemma4ImageProcessorPil``): variable resolution
within a patch budget.

- resize: keep the aspect ratio, scale the area to ``max_soft_tokens`` × pooling² patches of
  patch² pixels, round each side down to a multiple of pooling × patch (48); a side that
  rounds to 0 becomes 48 and the other ``floor(long / short)`` × 48, capped at
  ``max_soft_tokens`` × 48. Images already of that size are not resampled. Bicubic.
- rescale by 1/255; no normalisation (the encoder takes pixels in [0, 1]).
- patches: (max_patches, patch · patch · 3) float32, row-major patches, each patch's pixels
  row-major with the channels innermost; rows past the image's own patches are zero.
- patch positions: (max_patches, 2) int64, (column, row) of each patch, -1 for the padding.
- tokens: patches / pooling² (at most ``max_soft_tokens``); in the prompt ``<|image>``, the
  ``<|image|>`` soft tokens, ``<image|>`` in place of the template's ``<|image|>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from llm_onnx.runtime.media.fields import Fields
from llm_onnx.runtime.media.image import RGBImage
from llm_onnx.runtime.media.pixels import ProcessedImage, rescale_normalize, resize
from llm_onnx.runtime.media.prompt import ImageTokenLayout

SUPPORTED_SOFT_TOKENS = (70, 140, 280, 560, 1120)


@dataclass(frozen=True, kw_only=True)
class Gemma4ImageProcessor:
    """Settings as transformers names them; the defaults are ``Gemma4ImageProcessorPil``'s."""

    patch_size: int = 16
    max_soft_tokens: int = 280
    pooling_kernel_size: int = 3
    resample: int = 3  # bicubic
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = False
    image_mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    image_std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    family = "gemma4"
    image_processor_type = "Gemma4ImageProcessor"

    @classmethod
    def from_fields(cls, fields: Fields, processor: Mapping[str, Any]) -> Gemma4ImageProcessor:
        d = cls()
        fields.flag("do_convert_rgb", True, must_be=True)
        fields.flag("do_resize", True, must_be=True)
        return cls(patch_size=fields.integer("patch_size", d.patch_size),
                   max_soft_tokens=fields.integer("max_soft_tokens", d.max_soft_tokens,
                                                  choices=SUPPORTED_SOFT_TOKENS),
                   pooling_kernel_size=fields.integer("pooling_kernel_size",
                                                      d.pooling_kernel_size),
                   resample=fields.resample("resample", d.resample),
                   do_rescale=fields.flag("do_rescale", d.do_rescale),
                   rescale_factor=fields.number("rescale_factor", d.rescale_factor),
                   do_normalize=fields.flag("do_normalize", d.do_normalize),
                   image_mean=fields.channels("image_mean", d.image_mean),
                   image_std=fields.channels("image_std", d.image_std))

    def to_dict(self) -> dict[str, Any]:
        """The settings as a preprocessor_config.json that transformers reads back."""
        return {"image_processor_type": self.image_processor_type, **asdict(self)}

    @property
    def max_patches(self) -> int:
        return self.max_soft_tokens * self.pooling_kernel_size ** 2

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the aspect-preserving resize (transformers'
        ``get_aspect_ratio_preserving_size``)."""
        target_px = self.max_patches * self.patch_size ** 2
        factor = math.sqrt(target_px / (height * width))
        side = self.pooling_kernel_size * self.patch_size
        h = int(math.floor(factor * height / side)) * side
        w = int(math.floor(factor * width / side)) * side
        longest = self.max_soft_tokens * side  # (max_patches // pooling²) · side
        assert h or w  # the budget is at least one pooling window on each side
        if h == 0:
            h, w = side, min(int(math.floor(width / height)) * side, longest)
        elif w == 0:
            h, w = min(int(math.floor(height / width)) * side, longest), side
        return h, w

    def num_tokens(self, height: int, width: int) -> int:
        h, w = self.target_size(height, width)
        return (h // self.patch_size) * (w // self.patch_size) // self.pooling_kernel_size ** 2

    def __call__(self, image: RGBImage) -> ProcessedImage:
        h, w = self.target_size(image.height, image.width)
        x = rescale_normalize(resize(image.pixels, h, w, self.resample),
                              do_rescale=self.do_rescale, rescale_factor=self.rescale_factor,
                              do_normalize=self.do_normalize, mean=self.image_mean,
                              std=self.image_std)  # (C, H, W)
        p = self.patch_size
        ph, pw = h // p, w // p
        n = ph * pw
        patches = np.zeros((self.max_patches, p * p * 3), dtype=np.float32)
        patches[:n] = x.reshape(3, ph, p, pw, p).transpose(1, 3, 2, 4, 0).reshape(n, -1)
        positions = np.full((self.max_patches, 2), -1, dtype=np.int64)
        columns, rows = np.meshgrid(np.arange(pw), np.arange(ph), indexing="xy")
        positions[:n] = np.stack([columns, rows], axis=-1).reshape(n, 2)
        return ProcessedImage(pixel_values=patches,
                              num_tokens=n // self.pooling_kernel_size ** 2, size=(h, w),
                              image=image, patch_positions=positions, num_patches=n)

    def token_layout(self, encode: Callable[[str], Sequence[int]],
                     tokens: Mapping[str, str] | None = None) -> ImageTokenLayout:
        """The template's ``<|image|>`` becomes ``<|image>``, N ``<|image|>``, ``<image|>``.
        ``tokens`` may rename ``image_token``, ``boi_token`` and ``eoi_token``
        (tokenizer_config.json's names)."""
        tokens = tokens or {}
        soft = tokens.get("image_token", "<|image|>")
        return ImageTokenLayout.build(encode, placeholder=soft, image_token=soft,
                                      before=tokens.get("boi_token", "<|image>"),
                                      after=tokens.get("eoi_token", "<image|>"))

"""What every family's image processor shares: the output type, Pillow's resize and the
rescale/normalise step, each written to compute exactly what transformers' PIL backend computes
(``PilBackend.resize`` goes through ``PIL.Image.resize`` on uint8 pixels; ``rescale`` multiplies
in float64 then casts to float32; ``normalize`` subtracts and divides in float32)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import PIL.Image

from llm_onnx.runtime.media.image import RGBImage

# PIL.Image.Resampling's values, as preprocessor_config.json's "resample" gives them
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, eq=False)
class ProcessedImage:
    """One image as its family's vision encoder takes it.

    - ``pixel_values``: float32, the array transformers' processor gives for this image:
      Qwen (grid_t·grid_h·grid_w, 3·temporal·patch·patch) patches; Gemma 3 (3, H, W);
      Gemma 4 (max_patches, patch·patch·3) patches, zero rows past ``num_patches``.
    - ``num_tokens``: the soft tokens the image becomes in the prompt.
    - ``grid_thw``: Qwen's (t, h, w) patch grid (``image_grid_thw``), else None.
    - ``token_grid``: the (t, h, w) grid of the image's tokens, for Qwen's three position rows
      (the patch grid with h and w divided by the merge size), else None.
    - ``patch_positions``: Gemma 4's (max_patches, 2) int64 (column, row) of each patch, -1 past
      ``num_patches`` (``image_position_ids``), else None.
    - ``size``: (height, width) after resizing; ``image``: the decoded image (its ``digest``
      keys caches).
    """

    pixel_values: np.ndarray
    num_tokens: int
    size: tuple[int, int]
    image: RGBImage | None
    grid_thw: tuple[int, int, int] | None = None
    token_grid: tuple[int, int, int] | None = None
    patch_positions: np.ndarray | None = None
    num_patches: int | None = None


def resize(pixels: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (height, width, 3) uint8 through Pillow, as transformers resizes."""
    if pixels.shape[:2] == (height, width):
        return pixels  # Pillow's resize to the same size is a copy
    image = PIL.Image.fromarray(pixels)
    return np.asarray(image.resize((width, height), resample=PIL.Image.Resampling(resample)))


def rescale_normalize(pixels: np.ndarray, *, do_rescale: bool, rescale_factor: float,
                      do_normalize: bool, mean: tuple[float, ...],
                      std: tuple[float, ...]) -> np.ndarray:
    """(H, W, 3) uint8 -> (3, H, W) float32: ``x * rescale_factor`` (in float64, cast to
    float32), then ``(x - mean) / std`` per channel in float32, as transformers does."""
    chw = np.moveaxis(pixels, -1, 0)
    x = (chw.astype(np.float64) * rescale_factor).astype(np.float32) if do_rescale \
        else chw.astype(np.float32)
    if do_normalize:
        m = np.asarray(mean, dtype=np.float32)[:, None, None]
        s = np.asarray(std, dtype=np.float32)[:, None, None]
        x = (x - m) / s
    return x

"""vision.onnx in the runtime: one image's pixels in, the embeddings of its soft tokens out
(and Qwen3-VL's DeepStack features). What the graph takes, by the tower's kind:

    qwen_vl  the patches and their bookkeeping, computed here in numpy (``patch_inputs``: what
             modeling/vision_tower.py's torch function computes, transformers' own arithmetic)
    gemma3   pixel_values (1, 3, S, S)
    gemma4   the image's own patches and their (column, row), not the processor's padding

    encoder = VisionEncoder(manifest, session_factory)
    encoded = encoder.encode(processed)        # EncodedImage: embeds (N, D), deepstack (K, N, D)

Encodings are kept by the image's pixel digest (a small LRU), so a follow-up turn about the
same picture, or two requests sending it, run the tower once.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llm_onnx import model_folder as names
from llm_onnx.errors import MediaError
from llm_onnx.model_folder import Manifest
from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig
from llm_onnx.modeling.vision_config import VisionConfig

if TYPE_CHECKING:  # (Pillow is loaded only where images are decoded)
    from llm_onnx.runtime.media.pixels import ProcessedImage

CACHED_IMAGES = 16  # encodings kept (by pixel digest and processed size)


@dataclass(frozen=True, eq=False)
class EncodedImage:
    """vision.onnx's output for one image: ``embeds`` (N, D) float32, one row per soft token
    in prompt order; ``deepstack`` (K, N, D) for a tower with DeepStack, else None."""

    embeds: np.ndarray
    deepstack: np.ndarray | None


def patch_inputs(vision: VisionConfig, grid_thw: tuple[int, int, int],
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(position_index (N, 4) int64, position_weight (N, 4), rotary_cos, rotary_sin (N, D/2))
    of an image of patch grid ``grid_thw``, float32, the patches in the processor's order (each
    merge × merge group consecutive, groups row by row): the learned position grid's bilinear
    taps (align_corners) and the tower's 2-D RoPE angles (height, then width)."""
    t, h, w = grid_thw
    m = vision.spatial_merge_size
    shape = (h // m, m, w // m, m)
    rows = np.broadcast_to(np.arange(h).reshape(h // m, m, 1, 1), shape)
    cols = np.broadcast_to(np.arange(w).reshape(1, 1, w // m, m), shape)
    rows = np.tile(rows.transpose(0, 2, 1, 3).reshape(-1), t)  # (N,) block order
    cols = np.tile(cols.transpose(0, 2, 1, 3).reshape(-1), t)
    side = vision.grid_side
    f32 = np.float32

    def taps(index: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        src = index.astype(f32) * f32(side - 1) / f32(max(size - 1, 1))
        floor = np.floor(src)
        offsets = np.arange(2)
        tap = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
        weight = np.maximum(f32(1) - np.abs(src[:, None] - floor[:, None] - offsets.astype(f32)),
                            f32(0))
        return tap, weight.astype(f32)

    (ht, hw), (wt, ww) = taps(rows, h), taps(cols, w)
    index = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
    weight = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
    spatial = vision.head_dim // 2  # height and width each turn a quarter of the head
    inv = f32(1.0) / (f32(vision.rope_theta) ** (np.arange(0, spatial, 2, dtype=f32) / f32(spatial)))
    angles = np.concatenate([rows[:, None].astype(f32) * inv, cols[:, None].astype(f32) * inv],
                            axis=-1)
    return index.astype(np.int64), weight, np.cos(angles), np.sin(angles)


class VisionEncoder:
    """vision.onnx of a folder that takes images, in its own ONNX Runtime session (made by
    ``session``, the engine's, so threads and provider are the decoder's). Thread-safe."""

    def __init__(self, manifest: Manifest, session: Callable[[Path], object]) -> None:
        assert manifest.images is not None and manifest.folder is not None
        self.spec = manifest.images
        self.vision: AnyVisionConfig = manifest.images.vision
        self.session = session(manifest.folder / names.VISION)
        # Gemma: prefill.onnx takes attend_until, so a run must hold an image's tokens whole
        self.whole_images = names.ATTEND_UNTIL in {
            t.name for t in manifest.graphs["prefill"].inputs}
        self._cache: collections.OrderedDict[tuple, EncodedImage] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.encoded = 0  # images run through the tower (not taken from the cache)

    def encode(self, processed: ProcessedImage) -> EncodedImage:
        """The embeddings of one processed image (from the cache when its pixels were seen)."""
        key = (processed.image.digest, processed.size) if processed.image is not None else None
        with self._lock:
            if key is not None and key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        out = self.session.run(None, self.feed(processed))  # type: ignore[attr-defined]
        encoded = EncodedImage(np.asarray(out[0], np.float32),
                               np.asarray(out[1], np.float32) if len(out) > 1 else None)
        if encoded.embeds.shape[0] != processed.num_tokens:
            raise MediaError(f"vision.onnx gave {encoded.embeds.shape[0]} embeddings for an image "
                             f"of {processed.num_tokens} tokens.")
        with self._lock:
            self.encoded += 1
            if key is not None:
                self._cache[key] = encoded
                while len(self._cache) > CACHED_IMAGES:
                    self._cache.popitem(last=False)
        return encoded

    def feed(self, processed: ProcessedImage) -> dict[str, np.ndarray]:
        """vision.onnx's inputs for one processed image (see the module docstring)."""
        pixels = np.ascontiguousarray(processed.pixel_values, np.float32)
        kind = self.vision.kind
        if kind == "gemma3" and pixels.ndim == 3:
            return {names.PIXEL_VALUES: pixels[None]}
        if kind == "gemma4" and processed.patch_positions is not None:
            n = processed.num_patches
            return {names.PIXEL_VALUES: pixels[:n],
                    names.PIXEL_POSITION_IDS: np.ascontiguousarray(processed.patch_positions[:n])}
        if kind == "qwen_vl" and processed.grid_thw is not None:
            assert isinstance(self.vision, VisionConfig)
            index, weight, cos, sin = patch_inputs(self.vision, processed.grid_thw)
            return {names.PIXEL_VALUES: pixels, names.POSITION_INDEX: index,
                    names.POSITION_WEIGHT: weight, names.ROTARY_COS: cos,
                    names.ROTARY_SIN: sin}
        raise MediaError(f"this image was not processed for the {kind} vision tower.")


__all__ = ["CACHED_IMAGES", "EncodedImage", "VisionEncoder", "patch_inputs"]

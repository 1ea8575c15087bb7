"""A prompt's images as a generator's row needs them: what each run of the row's tokens binds
beside the ids (the position rows of Qwen's multimodal RoPE, the image embeddings to place and
where, Gemma's attend_until), and the key its cached prefix is matched by.

    inputs = ImageInputs(manifest, encoder, encode)   # a folder's processor, image block
    images = inputs.row(ids, [(source, name), ...])   # RowImages: the images in place
    chunk = images.chunk(start, stop)                 # ImageChunk of tokens [start, stop)
    keys = images.keyed(tokens)                       # image tokens as their pixels' hash

- An image is encoded (vision.onnx) when the first run that holds one of its tokens needs it:
  a prompt whose prefix the cache still holds (a follow-up turn about the same picture)
  encodes nothing of it.
- After the prompt, token i of the row sits at position i + ``delta`` in all three rows (an
  image of N tokens on an h × w grid advances positions by max(h, w), not N; Gemma: 0).
- Gemma: an image's tokens see each other both ways (``attend_until``), so a run of the
  prompt never ends inside an image (``run_length``).
- Two prompts with the same ids but different pictures must never share a cached prefix: the
  image tokens' id is the same for every picture, so the prefix is matched on ``keyed``
  tokens, where each image's tokens are a negative number made from its pixel digest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_onnx.errors import MediaError
from llm_onnx.model_folder import Manifest
from llm_onnx.runtime.core.vision import EncodedImage, VisionEncoder

if TYPE_CHECKING:  # (Pillow is loaded only where images are decoded)
    from llm_onnx.runtime.media.pixels import ProcessedImage
    from llm_onnx.runtime.media.prompt import ImagePrompt

MAX_IMAGES = 16  # images one prompt may hold (each is run through the tower alone)


@dataclass(frozen=True, eq=False)
class ImageChunk:
    """What one run of tokens [start, stop) of a row binds beside the ids: ``positions``
    (3, T) int64 (Qwen's rows; (1, T) for other families); ``embeds`` (M, D) float32 and
    ``index`` (M,) int64 (where among the T new tokens they go); ``deepstack`` (K, M, D) or
    None; ``delta``: the row's position offset after its prompt; ``attend_until`` (T,) int64:
    an image token's last visible position (its image's last), 0 for text (causal)."""

    positions: np.ndarray
    embeds: np.ndarray
    index: np.ndarray
    deepstack: np.ndarray | None
    delta: int
    attend_until: np.ndarray | None = None


class RowImages:
    """One prompt's images (see the module docstring). ``processed[k]`` fills ``prompt.spans[k]``."""

    def __init__(self, prompt: ImagePrompt, processed: Sequence[ProcessedImage],
                 encoder: VisionEncoder) -> None:
        assert len(prompt.spans) == len(processed)
        self.prompt = prompt
        self.processed = list(processed)
        self.encoder = encoder
        self.length = len(prompt.ids)
        self.delta = int(prompt.next_position) - self.length
        self._encoded: list[EncodedImage | None] = [None] * len(processed)
        self._keys = [-1 - int(p.image.digest[:15], 16) if p.image is not None else -1
                      for p in self.processed]

    @property
    def ids(self) -> list[int]:
        return [int(i) for i in self.prompt.ids]

    def keyed(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` (this prompt, then anything after it) with each image's tokens replaced by
        its key, for matching cached prefixes."""
        out = list(tokens)
        for (start, stop), key in zip(self.prompt.spans, self._keys):
            out[start:min(stop, len(out))] = [key] * max(0, min(stop, len(out)) - start)
        return out

    def positions(self, start: int, stop: int) -> np.ndarray:
        """(3, stop - start) positions of tokens [start, stop) of the row."""
        inside = self.prompt.positions[:, start:min(stop, self.length)]
        after = np.arange(max(start, self.length), stop, dtype=np.int64) + self.delta
        return np.concatenate([inside, np.broadcast_to(after, (inside.shape[0], after.shape[0]))],
                              axis=1)

    def run_length(self, start: int, n: int, waiting: int) -> int:
        """How many of the ``waiting`` tokens after ``start`` a run takes, at least ``n``: not
        ending inside an image whose tokens see each other both ways (the encoder says so),
        nor leaving one token alone."""
        if not self.encoder.whole_images:
            return n
        stop = start + n
        for a, b in self.prompt.spans:
            if a < stop < b:
                stop = b
        return waiting if start + waiting - stop == 1 else min(stop - start, waiting)

    def encoded(self, k: int) -> EncodedImage:
        """Image k's embeddings (vision.onnx run the first time they are needed)."""
        got = self._encoded[k]
        if got is None:
            got = self._encoded[k] = self.encoder.encode(self.processed[k])
        return got

    def chunk(self, start: int, stop: int) -> ImageChunk:
        """The image inputs of a run of tokens [start, stop)."""
        embeds, index, deep = [], [], []
        until = np.zeros(stop - start, np.int64)
        for k, (a, b) in enumerate(self.prompt.spans):
            lo, hi = max(a, start), min(b, stop)
            if lo >= hi:
                continue
            encoded = self.encoded(k)
            embeds.append(encoded.embeds[lo - a:hi - a])
            index.append(np.arange(lo - start, hi - start, dtype=np.int64))
            until[lo - start:hi - start] = self.prompt.positions[0, b - 1]
            if encoded.deepstack is not None:
                deep.append(encoded.deepstack[:, lo - a:hi - a])
        width = self.encoder.vision.out_hidden_size
        layers = self.encoder.vision.deepstack_layers
        return ImageChunk(
            positions=np.ascontiguousarray(self.positions(start, stop)),
            embeds=np.concatenate(embeds) if embeds else np.zeros((0, width), np.float32),
            index=np.concatenate(index) if index else np.zeros(0, np.int64),
            deepstack=(np.concatenate(deep, axis=1) if deep else
                       np.zeros((layers, 0, width), np.float32)) if layers else None,
            delta=self.delta, attend_until=until)


class ImageInputs:
    """A folder's way of taking images: its processor, the prompt's image block, its tower."""

    def __init__(self, manifest: Manifest, encoder: VisionEncoder, encode: Any) -> None:
        from llm_onnx.runtime.media import image_processor_from_dict  # Pillow: only here

        spec = manifest.images
        assert spec is not None
        self.manifest = manifest
        self.processor = image_processor_from_dict(spec.processor, source=f"{manifest.folder}")
        self.layout = self.processor.token_layout(
            encode, spec.token_names or {"image_token": spec.image_token})
        self.encode = encode
        # Gemma 3: text around the block ("\n\n") that the tokenizer may merge with the
        # prompt's own, so a rendered prompt is expanded as text, then tokenized (media.prompt)
        self.by_text = any(s != s.strip() for s in (self.layout.before, self.layout.after))
        self.encoder = encoder
        self.block = [i for i in (spec.vision_start_token_id,) if i is not None] + \
            [self.layout.placeholder_id] + \
            [i for i in (spec.vision_end_token_id,) if i is not None]

    def row(self, ids: Sequence[int], sources: Sequence[tuple[Any, str]],
            text: str | None = None) -> RowImages:
        """The prompt ``ids`` (one placeholder per image; with none, each image's block goes
        before the text) with its images decoded, processed and in place. ``text``: the
        rendered prompt ``ids`` were encoded from (a chat's), expanded as text where the
        family's block has text around it (``by_text``), as transformers' processors do."""
        from llm_onnx.runtime.media import (
            expand_image_text,
            expand_image_tokens,
            find_image_spans,
            load_image,
        )

        if len(sources) > MAX_IMAGES:
            raise MediaError(f"{len(sources)} images in one prompt; this llm-onnx takes at most "
                             f"{MAX_IMAGES}.")
        ids = [int(i) for i in ids]
        if sources and self.layout.placeholder_id not in ids:
            ids = self.block * len(sources) + ids
        processed = [self.processor(load_image(src, name=name)) for src, name in sources]
        if text is not None and self.by_text and self.layout.placeholder in text:
            expanded = expand_image_text(text, processed, self.layout)
            prompt = find_image_spans(self.encode(expanded), processed, self.layout)
        else:
            prompt = expand_image_tokens(ids, processed, self.layout)
        context = self.manifest.context_length
        if len(prompt.ids) >= context:
            raise MediaError(f"the prompt with its images is {len(prompt.ids)} tokens ("
                             + ", ".join(f"{p.num_tokens} for {name}"
                                         for p, (_, name) in zip(processed, sources))
                             + f"); the model's context is {context} tokens. Send smaller or "
                             "fewer images.")
        return RowImages(prompt, processed, self.encoder)


__all__ = ["ImageChunk", "ImageInputs", "MAX_IMAGES", "RowImages"]

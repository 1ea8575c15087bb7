"""How images sit in a prompt: a family's chat template writes one placeholder per image
(Qwen ``<|image_pad|>`` between ``<|vision_start|>`` and ``<|vision_end|>``; Gemma 4
``<|image|>``; Gemma 3 ``<start_of_image>``), and the prompt holds, in its place, the image's N
soft tokens (one id repeated: where the vision encoder's embeddings go) with the family's
markers around them, as transformers' processors write them:

    Qwen      <|image_pad|> × N                                        (markers in the template)
    Gemma 4   <|image>  <|image|> × N  <image|>
    Gemma 3   "\\n\\n" <start_of_image>  <image_soft_token> × N  <end_of_image> "\\n\\n"

Two ways to the same ids:
- token route, ``expand_image_tokens(ids, images, layout)``: tokenize the rendered prompt, then
  replace each placeholder id. Equal to transformers' ids whenever the markers are special
  tokens only (Qwen, Gemma 4).
- text route, ``expand_image_text(text, images, layout)``, tokenize, then
  ``find_image_spans(ids, images, layout)``: what transformers' processors do. Needed for
  Gemma 3 to match transformers exactly, where the "\\n\\n" around the image merges with the
  text next to it into one token ("user\\n" + "\\n\\n" is one "\\n\\n\\n" token).

Both return an ImagePrompt: the ids, each image's span (where its embeddings go) and the
position rows: Qwen's multimodal RoPE gives each token three (time, height, width), which for
text are equal and continue after an image from the image's largest position + 1, as
transformers' ``get_rope_index`` computes; other families have one row, 0..S-1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from llm_onnx.errors import ConfigError, MediaError


class ImageTokens(Protocol):
    """What the prompt needs of an image (a ProcessedImage has both)."""

    @property
    def num_tokens(self) -> int: ...

    @property
    def token_grid(self) -> tuple[int, int, int] | None: ...


@dataclass(frozen=True)
class ImageTokenLayout:
    """A family's image block in the prompt, as text and as token ids.

    ``placeholder`` is what the chat template writes per image; it becomes ``before``,
    ``image_token`` × N, ``after``. ``mrope`` says the family positions tokens with three rows
    (Qwen's multimodal RoPE)."""

    placeholder: str
    placeholder_id: int
    image_token: str
    image_token_id: int
    before: str = ""
    after: str = ""
    before_ids: tuple[int, ...] = ()
    after_ids: tuple[int, ...] = ()
    mrope: bool = False

    @classmethod
    def build(cls, encode: Callable[[str], Sequence[int]], *, placeholder: str, image_token: str,
              before: str = "", after: str = "", mrope: bool = False) -> ImageTokenLayout:
        """The layout with its ids from ``encode`` (text -> ids, no BOS added, special tokens
        recognised: e.g. ``lambda s: tokenizer.encode(s, add_special_tokens=False).ids``)."""
        def single(token: str) -> int:
            ids = list(encode(token))
            if len(ids) != 1:
                raise ConfigError(f"the tokenizer has no single token for {token!r} (it gives "
                                  f"{ids}); the folder's tokenizer lacks the family's image "
                                  "tokens.")
            return int(ids[0])

        return cls(placeholder=placeholder, placeholder_id=single(placeholder),
                   image_token=image_token, image_token_id=single(image_token),
                   before=before, after=after, before_ids=tuple(encode(before)) if before else (),
                   after_ids=tuple(encode(after)) if after else (), mrope=mrope)


@dataclass(frozen=True, eq=False)
class ImagePrompt:
    """A prompt with its images' tokens in place.

    - ``ids``: (S,) int64.
    - ``spans``: per image, (start, stop): ``ids[start:stop]`` are its soft tokens, in order, to
      be replaced by its ``num_tokens`` embeddings.
    - ``positions``: (3, S) int64 (time, height, width) for multimodal RoPE, else (1, S).
    - ``next_position``: the position of the token after the prompt (all rows); decode step k
      (0-based) takes ``next_position + k``.
    """

    ids: np.ndarray
    spans: tuple[tuple[int, int], ...]
    positions: np.ndarray
    next_position: int


def expand_image_tokens(ids: Sequence[int], images: Sequence[ImageTokens],
                        layout: ImageTokenLayout) -> ImagePrompt:
    """Replace each ``layout.placeholder_id`` in ``ids`` (in order) by its image's block."""
    ids = [int(i) for i in ids]
    found = [i for i, t in enumerate(ids) if t == layout.placeholder_id]
    _check_count(len(found), images, layout)
    out: list[int] = []
    spans = []
    prev = 0
    for where, image in zip(found, images):
        out += ids[prev:where] + list(layout.before_ids)
        spans.append((len(out), len(out) + image.num_tokens))
        out += [layout.image_token_id] * image.num_tokens + list(layout.after_ids)
        prev = where + 1
    out += ids[prev:]
    return _prompt(np.asarray(out, dtype=np.int64), spans, images, layout)


def expand_image_text(text: str, images: Sequence[ImageTokens], layout: ImageTokenLayout) -> str:
    """Replace each ``layout.placeholder`` in the rendered prompt by its image's block (text)."""
    pieces = text.split(layout.placeholder)
    _check_count(len(pieces) - 1, images, layout)
    out = [pieces[0]]
    for image, piece in zip(images, pieces[1:]):
        out += [layout.before, layout.image_token * image.num_tokens, layout.after, piece]
    return "".join(out)


def find_image_spans(ids: Sequence[int], images: Sequence[ImageTokens],
                     layout: ImageTokenLayout) -> ImagePrompt:
    """The ImagePrompt of ids already expanded (tokenized from ``expand_image_text``): image k
    is the next ``num_tokens`` image-token ids, which must stand together."""
    array = np.asarray(ids, dtype=np.int64)
    where = np.flatnonzero(array == layout.image_token_id)
    want = sum(image.num_tokens for image in images)
    if len(where) != want:
        raise MediaError(f"the prompt holds {len(where)} {layout.image_token} tokens; its "
                         f"{len(images)} image(s) need {want}.")
    spans = []
    k = 0
    for n, image in enumerate(images):
        start = int(where[k]) if image.num_tokens else 0
        stop = start + image.num_tokens
        if image.num_tokens and int(where[k + image.num_tokens - 1]) != stop - 1:
            raise MediaError(f"image {n + 1}'s {image.num_tokens} {layout.image_token} tokens "
                             "are not together in the prompt.")
        spans.append((start, stop))
        k += image.num_tokens
    return _prompt(array, spans, images, layout)


def _check_count(found: int, images: Sequence[ImageTokens], layout: ImageTokenLayout) -> None:
    if found != len(images):
        raise MediaError(f"the prompt has {found} image placeholder(s) ({layout.placeholder}) "
                         f"for {len(images)} image(s); the chat template writes one per image "
                         "part.")


def _prompt(ids: np.ndarray, spans: list[tuple[int, int]], images: Sequence[ImageTokens],
            layout: ImageTokenLayout) -> ImagePrompt:
    if not layout.mrope:
        return ImagePrompt(ids=ids, spans=tuple(spans), positions=np.arange(len(ids))[None],
                           next_position=len(ids))
    positions, next_position = mrope_positions(len(ids), spans,
                                               [_grid(image) for image in images])
    return ImagePrompt(ids=ids, spans=tuple(spans), positions=positions,
                       next_position=next_position)


def _grid(image: ImageTokens) -> tuple[int, int, int]:
    grid = image.token_grid
    if grid is None or grid[0] * grid[1] * grid[2] != image.num_tokens:
        raise MediaError(f"an image of {image.num_tokens} tokens needs its (t, h, w) token grid "
                         f"for multimodal RoPE; it has {grid}.")
    return grid


def mrope_positions(length: int, spans: Sequence[tuple[int, int]],
                    grids: Sequence[tuple[int, int, int]]) -> tuple[np.ndarray, int]:
    """(3, length) positions and the next position, as transformers' ``get_rope_index``:
    text tokens take p, p+1, ... in all three rows; an image whose span starts at position p
    takes (p + t, p + row, p + column) for its (t, h, w) token grid, in row-major order, and
    the text after it continues at p + max(h, w)."""
    positions = np.empty((3, length), dtype=np.int64)
    current = 0
    prev = 0
    for (start, stop), (t, h, w) in sorted(zip(spans, grids)):
        positions[:, prev:start] = current + np.arange(start - prev)
        current += start - prev
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        positions[:, start:stop] = current + np.stack([tt.ravel(), hh.ravel(), ww.ravel()])
        current += max(h, w)
        prev = stop
    positions[:, prev:] = current + np.arange(length - prev)
    return positions, int(positions.max()) + 1 if length else 0

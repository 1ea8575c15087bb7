"""Decoding an image a user gives into 8-bit RGB pixels, safely.

    load_image("photo.jpg")                  a path (str or os.PathLike)
    load_image(b"\\x89PNG...")               encoded bytes
    load_image("data:image/png;base64,...")  a data: URL (base64)
    load_image(PIL.Image.open(...))          a Pillow image, taken as it is
    load_image(array)                        uint8 (H, W), (H, W, 1), (H, W, 3) or (H, W, 4)

What the reference does, and where we differ (docs/images.md says the same):
- Encoded images (a path, bytes, a data: URL) are turned upright by their EXIF Orientation tag,
  as transformers' ``load_image`` does. A Pillow image is taken as it is, as transformers'
  image processors take it (call ``PIL.ImageOps.exif_transpose`` first to turn it).
- Transparency (RGBA, LA, a palette or grayscale with a transparent colour) is composited onto
  white, as the processors' ``convert_to_rgb`` does for a Pillow image; transformers'
  ``load_image`` instead drops the alpha channel of a file (``convert("RGB")``), which shows
  whatever colour the transparent pixels happen to store. Arrays with four channels are blended
  as the processors blend arrays (``round(a * rgb + (1 - a) * 255)``, a = alpha / 255).
- Other modes (palette, CMYK, 1-bit, 32-bit int, float) become RGB through Pillow's
  ``convert("RGB")``, as in the reference. 16-bit grayscale (Pillow's I;16 modes) is the one
  exception: Pillow clips it to 0..255, which turns a 16-bit PNG almost white; here it is scaled
  to 8 bits (the high byte), as libpng, browsers and llama.cpp show it.
- An animated image gives its first frame.
- Images with more pixels than ``max_pixels`` (default: Pillow's ``Image.MAX_IMAGE_PIXELS``,
  about 89 million) are refused before they are decoded, with an error, never Pillow's warning.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL.Image
import PIL.ImageOps

from llm_onnx.errors import MediaError

# The encoded formats accepted (Pillow's names). JPEG takes in the multi-picture JPEGs phones
# write (Pillow's MPO: the first picture).
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")


@dataclass(frozen=True, eq=False)
class RGBImage:
    """Decoded pixels: ``pixels`` is a read-only (H, W, 3) uint8 array; ``digest`` the SHA-256
    of its size and bytes (the same pixels always give the same digest, whatever the file they
    came from), the key of anything cached about this image; ``name`` says where it came from."""

    pixels: np.ndarray
    digest: str
    name: str

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @classmethod
    def from_pixels(cls, pixels: np.ndarray, name: str) -> RGBImage:
        assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3
        pixels = np.ascontiguousarray(pixels)
        pixels.setflags(write=False)
        h = hashlib.sha256(f"rgb8:{pixels.shape[0]}x{pixels.shape[1]}:".encode())
        h.update(pixels.data)
        return cls(pixels=pixels, digest=h.hexdigest(), name=name)


def load_image(source: object, *, name: str | None = None,
               max_pixels: int | None = None) -> RGBImage:
    """Decode ``source`` (a path, bytes, a ``data:`` URL, a Pillow image or a uint8 array) to RGB.

    Args:
        source: the image; see the module's docstring for what each kind becomes.
        name: how errors name the image (e.g. ``"messages[0].content[1]"``); by default the
            path, or the kind of source.
        max_pixels: refuse images with more pixels than this (width × height); by default
            Pillow's ``Image.MAX_IMAGE_PIXELS``. Pillow itself refuses more than twice that (and
            an app that set it to None has no limit, here as in Pillow).

    Raises:
        MediaError: unreadable, truncated, too large, of an unsupported format or array shape.
    """
    limit = PIL.Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    if isinstance(source, PIL.Image.Image):
        what = name or "the image"
        _check_size(source.size, limit, what)
        return RGBImage.from_pixels(_pil_to_rgb(source, what), what)
    if isinstance(source, np.ndarray):
        what = name or "the image array"
        return RGBImage.from_pixels(_array_to_rgb(source, what, limit), what)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _decode(bytes(source), name or "the image bytes", limit)
    if isinstance(source, str) and source[:5].lower() == "data:":
        return _decode(_data_url_bytes(source, name or "the data: URL"),
                       name or "the data: URL", limit)
    if isinstance(source, str) and source.lower().startswith(("http://", "https://")):
        raise MediaError(f"{name or 'the image'}: {source[:80]!r} is a remote URL, which is not "
                         "fetched here; pass the image's bytes, a file path or a data: URL.")
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise MediaError(f"{name or path}: cannot read the image file: {e.strerror or e}.") \
                from None
        return _decode(data, name or str(path), limit)
    raise MediaError(f"{name or 'the image'}: a {type(source).__name__} is not an image; give a "
                     "path, bytes, a data: URL, a PIL.Image or a uint8 numpy array.")


def _data_url_bytes(url: str, what: str) -> bytes:
    """The bytes of ``data:[<media type>][;base64],<data>``; only base64 images are accepted."""
    header, comma, payload = url.partition(",")
    if not comma:
        raise MediaError(f"{what}: a data: URL needs a comma before its data "
                         "(data:image/png;base64,...).")
    params = header[5:].split(";")
    media_type = params[0].strip().lower()
    if media_type and not media_type.startswith("image/"):
        raise MediaError(f"{what}: media type {media_type!r} is not an image; images are "
                         "image/png, image/jpeg, image/webp, image/gif, image/bmp or image/tiff.")
    if "base64" not in (p.strip().lower() for p in params[1:]):
        raise MediaError(f"{what}: only base64 data: URLs are accepted "
                         "(data:image/png;base64,...).")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{what}: the base64 data is not valid base64.") from None


def _decode(data: bytes, what: str, limit: int | None) -> RGBImage:
    PIL.Image.init()  # registers every plugin (once), so that `formats` can name them all
    with warnings.catch_warnings():
        # our own limit below decides; Pillow's warning would only say it later. (The filter is
        # process-wide while the header is read: at worst another thread's Pillow warning is
        # not shown, and that thread's image is then refused by this same limit.)
        warnings.simplefilter("ignore", PIL.Image.DecompressionBombWarning)
        try:
            image = PIL.Image.open(io.BytesIO(data), formats=FORMATS)
        except PIL.Image.DecompressionBombError:  # (only while Pillow has a limit)
            bomb = 2 * (PIL.Image.MAX_IMAGE_PIXELS or 0)
            raise MediaError(f"{what}: the image has more than {bomb:,} pixels, far past the "
                             "limit; refused as a decompression bomb.") from None
        except PIL.UnidentifiedImageError:
            raise MediaError(f"{what}: {_unsupported(data)}") from None
        except (OSError, SyntaxError, ValueError, EOFError) as e:
            raise MediaError(f"{what}: the image is corrupt ({e}).") from None
    with image:
        _check_size(image.size, limit, what)
        try:
            image.load()
            upright = PIL.ImageOps.exif_transpose(image)
            return RGBImage.from_pixels(_pil_to_rgb(upright, what), what)
        except MediaError:
            raise
        except (OSError, SyntaxError, ValueError, EOFError, KeyError, IndexError) as e:
            detail = "truncated" if "truncated" in str(e) else "corrupt"
            raise MediaError(f"{what}: the {image.format} image is {detail} ({e}).") from None


def _unsupported(data: bytes) -> str:
    """Why Pillow's chosen formats could not open ``data``: another format, or no image."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with PIL.Image.open(io.BytesIO(data)) as other:  # reads the header only
                fmt = other.format
    except Exception:  # noqa: BLE001 - whatever Pillow raises, the bytes are no image we know
        fmt = None
    supported = ", ".join(FORMATS)
    if fmt:
        return f"{fmt} images are not supported; supported formats: {supported}."
    if not data:
        return "the image is empty (0 bytes)."
    return f"not an image of a supported format ({supported}), or a corrupt one."


def _check_size(size: tuple[int, int], limit: int | None, what: str) -> None:
    width, height = size
    if limit is not None and width * height > limit:
        raise MediaError(f"{what}: {width}×{height} is {width * height:,} pixels, more than the "
                         f"limit of {limit:,}; refused as a possible decompression bomb "
                         "(scale the image down).")
    if width < 1 or height < 1:
        raise MediaError(f"{what}: the image is empty ({width}×{height}).")


def _pil_to_rgb(image: PIL.Image.Image, what: str) -> np.ndarray:
    """(H, W, 3) uint8: transformers' ``convert_to_rgb`` for a Pillow image (transparency onto
    white), except 16-bit grayscale, scaled rather than clipped."""
    transparency = image.info.get("transparency")
    if image.mode in _SIXTEEN_BIT:
        wide = np.asarray(image).astype(np.uint16)
        gray = (wide >> 8).astype(np.uint8)
        if isinstance(transparency, int):  # a 16-bit tRNS colour: those pixels become white
            gray[wide == transparency] = 255
        return np.repeat(gray[:, :, None], 3, axis=2)
    if "A" in image.getbands() or transparency is not None:
        rgba = image.convert("RGBA")
        white = PIL.Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.asarray(PIL.Image.alpha_composite(white, rgba).convert("RGB"))
    try:
        return np.asarray(image.convert("RGB"))
    except ValueError as e:  # a mode Pillow cannot turn into RGB
        raise MediaError(f"{what}: Pillow cannot convert mode {image.mode!r} to RGB ({e}).") \
            from None


def _array_to_rgb(array: np.ndarray, what: str, limit: int | None) -> np.ndarray:
    """(H, W, 3) uint8 from a channels-last uint8 array, as transformers' processors convert
    arrays: one channel repeated, four channels blended onto white."""
    if array.dtype != np.uint8:
        raise MediaError(f"{what}: pixels of dtype {array.dtype} are not accepted; give uint8 "
                         "values 0..255 (e.g. (x * 255).round().astype(np.uint8)).")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise MediaError(f"{what}: an array of shape {array.shape} is not an image; give "
                         "(H, W), (H, W, 1), (H, W, 3) RGB or (H, W, 4) RGBA, channels last.")
    _check_size((array.shape[1], array.shape[0]), limit, what)
    if array.shape[2] == 1:
        return np.repeat(array, 3, axis=2)
    if array.shape[2] == 4:
        alpha = array[:, :, 3:4] / 255
        return np.round(alpha * array[:, :, :3] + (1 - alpha) * 255).astype(np.uint8)
    return array.copy()  # ours to freeze: the caller's array stays theirs (and writable)

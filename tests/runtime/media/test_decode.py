"""Decoding images: every kind of source to the same RGB pixels, EXIF orientation applied to
files, modes converted as transformers' processors convert a Pillow image (transparency onto
white), 16-bit grayscale scaled, and every bad input refused with a MediaError that names it:
decompression bombs (never a warning), truncated and corrupt files, formats we do not take,
data: URLs that are not base64 images, remote URLs, arrays of the wrong type or shape."""

from __future__ import annotations

import base64
import io
import struct
import warnings
import zlib

import numpy as np
import PIL.Image
import pytest

from llm_onnx.errors import GenerationError, MediaError
from llm_onnx.runtime.media import load_image
from tests.runtime.media.reference import encoded, image_in_mode, random_pixels


def hf_rgb(image: PIL.Image.Image) -> np.ndarray:
    """transformers' processors' RGB conversion of a Pillow image (convert_to_rgb)."""
    from transformers.image_transforms import convert_to_rgb

    return convert_to_rgb(image, return_numpy=True)


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def test_every_source_gives_the_same_pixels_and_digest(tmp_path):
    pixels = random_pixels(31, 47, 1)
    png = encoded(PIL.Image.fromarray(pixels), "PNG")
    path = tmp_path / "a.png"
    path.write_bytes(png)
    images = [load_image(pixels), load_image(PIL.Image.fromarray(pixels)), load_image(png),
              load_image(bytearray(png)), load_image(str(path)), load_image(path),
              load_image(data_url(png)), load_image(data_url(png).replace(";base64", ";BASE64")),
              load_image(np.dstack([pixels, np.full((31, 47, 1), 255, np.uint8)]))]
    for image in images:
        assert image.pixels.dtype == np.uint8 and image.pixels.shape == (31, 47, 3)
        assert np.array_equal(image.pixels, pixels)
        assert image.digest == images[0].digest
        assert not image.pixels.flags.writeable
    assert (images[0].height, images[0].width) == (31, 47)
    assert load_image(str(path)).name == str(path)
    other = pixels.copy()
    other[0, 0, 0] ^= 1
    assert load_image(other).digest != images[0].digest
    assert load_image(pixels[:, :46]).digest != load_image(pixels[:, 1:]).digest
    assert pixels.flags.writeable  # the caller's array is copied, not frozen


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_to_files(orientation, tmp_path):
    """As transformers' load_image does: the picture upright, as a viewer shows it."""
    from transformers.image_utils import load_image as hf_load_image

    upright = PIL.Image.fromarray(random_pixels(24, 40, orientation))
    exif = PIL.Image.Exif()
    exif[0x0112] = orientation
    data = encoded(upright, "JPEG", exif=exif.tobytes(), quality=95)
    path = tmp_path / "photo.jpg"
    path.write_bytes(data)
    ours = load_image(data)
    want = np.asarray(hf_load_image(str(path)))
    assert np.array_equal(ours.pixels, want)
    assert ours.pixels.shape[:2] == ((40, 24) if orientation >= 5 else (24, 40))
    # a Pillow image is taken as it is, as transformers' processors take it
    assert load_image(PIL.Image.open(path)).pixels.shape[:2] == (24, 40)


@pytest.mark.parametrize(("mode", "fmt"), [
    ("L", "PNG"), ("LA", "PNG"), ("RGBA", "PNG"), ("P", "PNG"), ("P+transparency", "PNG"),
    ("1", "PNG"), ("CMYK", "JPEG"), ("L", "JPEG"), ("RGB", "BMP"), ("P+transparency", "GIF"),
    ("RGBA", "WEBP"), ("RGBA", "TIFF"), ("CMYK", "TIFF")])
def test_files_in_every_mode_convert_as_transformers_converts(mode, fmt):
    image = image_in_mode(mode, 21, 34, seed=3)
    if mode == "RGBA" and fmt == "WEBP":
        data = encoded(image, fmt, lossless=True)
    else:
        data = encoded(image, fmt)
    assert np.array_equal(load_image(data).pixels, hf_rgb(PIL.Image.open(io.BytesIO(data))))


def test_transparent_pixels_are_white_where_transformers_load_image_drops_alpha(tmp_path):
    """The documented difference: transformers' load_image(path) converts RGBA with
    convert("RGB") (the hidden colour of clear pixels shows); we composite onto white, as its
    processors do for a Pillow image."""
    from transformers.image_utils import load_image as hf_load_image

    rgba = np.zeros((4, 4, 4), np.uint8)  # clear black, then one opaque red pixel
    rgba[0, 0] = (255, 0, 0, 255)
    path = tmp_path / "clear.png"
    PIL.Image.fromarray(rgba, "RGBA").save(path)
    ours = load_image(path).pixels
    assert ours[0, 0].tolist() == [255, 0, 0] and ours[1:].min() == 255
    assert np.asarray(hf_load_image(str(path)))[1:].max() == 0


def test_sixteen_bit_grayscale_is_scaled_not_clipped():
    """Pillow (and so transformers) clips 16-bit values to 255: nearly white. We keep the high
    byte, as libpng and browsers show the picture."""
    image = image_in_mode("I;16", 30, 50, seed=4)
    data = encoded(image, "PNG")
    reopened = PIL.Image.open(io.BytesIO(data))
    assert reopened.mode == "I;16"
    wide = np.asarray(image).astype(np.uint16)
    assert np.array_equal(load_image(data).pixels,
                          np.repeat((wide >> 8).astype(np.uint8)[:, :, None], 3, 2))
    assert hf_rgb(reopened).mean() > 250  # the reference's near-white picture


def test_an_animated_gif_gives_its_first_frame():
    frames = [PIL.Image.fromarray(random_pixels(8, 8, s)).convert("P") for s in range(3)]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert PIL.Image.open(io.BytesIO(data)).n_frames == 3
    assert np.array_equal(load_image(data).pixels, np.asarray(frames[0].convert("RGB")))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that says it is width × height and holds one tiny (wrong) IDAT."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + \
            struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + \
        chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [10_000, 100_000])
def test_a_decompression_bomb_is_an_error_never_a_warning(side):
    """10,000² is past Pillow's limit (Pillow only warns); 100,000² is past twice it (Pillow
    raises its own error). Both are our MediaError, decided from the header, at once."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(MediaError, match="decompression bomb") as e:
            load_image(png_header_only(side, side), name="messages[0].content[1]")
    assert seen == []
    assert str(e.value).startswith("messages[0].content[1]: ")


def test_a_lower_pixel_limit_is_honoured_for_every_source():
    pixels = random_pixels(100, 100, 1)
    for source in (pixels, PIL.Image.fromarray(pixels), encoded(PIL.Image.fromarray(pixels),
                                                                "PNG")):
        with pytest.raises(MediaError, match="100×100 is 10,000 pixels, more than the limit "
                                             "of 9,999"):
            load_image(source, max_pixels=9_999)
        assert load_image(source, max_pixels=10_000).width == 100


def test_no_limit_where_pillows_is_turned_off(monkeypatch):
    """An app that set PIL.Image.MAX_IMAGE_PIXELS = None (Pillow's way to turn its limit off)
    gets no limit here either; it was a TypeError comparing with None."""
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", None)
    pixels = random_pixels(100, 100, 1)
    for source in (pixels, PIL.Image.fromarray(pixels), encoded(PIL.Image.fromarray(pixels),
                                                                "PNG")):
        assert load_image(source).width == 100
    with pytest.raises(MediaError, match="more than the limit of 9,999"):
        load_image(pixels, max_pixels=9_999)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_truncated_files_are_refused(fmt):
    data = encoded(PIL.Image.fromarray(random_pixels(64, 64, 2)).convert(
        "P" if fmt == "GIF" else "RGB"), fmt)
    with pytest.raises(MediaError, match=r"^the image bytes: .*(truncated|corrupt)"):
        load_image(data[: len(data) * 2 // 3])


def test_corrupt_and_empty_bytes_are_refused():
    png = bytearray(encoded(PIL.Image.fromarray(random_pixels(32, 32, 2)), "PNG"))
    png[60:70] = b"\xff" * 10  # inside the IDAT: its CRC no longer holds
    with pytest.raises(MediaError, match="corrupt"):
        load_image(bytes(png))
    with pytest.raises(MediaError, match="not an image of a supported format"):
        load_image(b"hello, world")
    with pytest.raises(MediaError, match=r"empty \(0 bytes\)"):
        load_image(b"")


@pytest.mark.parametrize("fmt", ["ICO", "PPM", "TGA", "PCX"])
def test_an_unsupported_format_is_named(fmt):
    data = encoded(PIL.Image.fromarray(random_pixels(16, 16, 2)), fmt)
    with pytest.raises(MediaError, match=f"{fmt} images are not supported; supported formats: "
                                         "PNG, JPEG, WEBP, GIF, BMP, TIFF"):
        load_image(data)


@pytest.mark.parametrize(("url", "message"), [
    ("data:image/png,rawbytes", "only base64 data: URLs"),
    ("data:text/plain;base64,aGVsbG8=", "media type 'text/plain' is not an image"),
    ("data:image/png;base64,%%%", "not valid base64"),
    ("data:image/png;base64", "needs a comma"),
    ("https://example.com/cat.png", "is a remote URL, which is not fetched here"),
])
def test_bad_urls_are_refused(url, message):
    with pytest.raises(MediaError, match=message):
        load_image(url)


def test_a_missing_file_and_a_wrong_type_are_refused(tmp_path):
    with pytest.raises(MediaError, match=f"{tmp_path / 'nope.png'}: cannot read the image file"):
        load_image(tmp_path / "nope.png")
    with pytest.raises(MediaError, match="a int is not an image"):
        load_image(3)
    assert issubclass(MediaError, GenerationError)  # the server's 400 path takes it as it is


@pytest.mark.parametrize(("array", "message"), [
    (np.zeros((4, 4, 3), np.float32), "dtype float32 are not accepted"),
    (np.zeros((4, 4, 2), np.uint8), r"shape \(4, 4, 2\) is not an image"),
    (np.zeros((3, 4, 4, 3), np.uint8), r"shape \(3, 4, 4, 3\)"),
    (np.zeros((0, 4, 3), np.uint8), r"empty \(4×0\)"),
])
def test_bad_arrays_are_refused(array, message):
    with pytest.raises(MediaError, match=message):
        load_image(array, name="image 2")

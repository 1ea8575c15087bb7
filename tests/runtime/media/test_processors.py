"""Each family's image processor against transformers' PIL processor with the same config:
equal arrays (pixel values, Qwen's grid, Gemma 4's patch positions) and token counts, on tiny,
huge, strip-shaped and square images, in every mode, bit for bit: both resize through the same
Pillow call on the same uint8 pixels and then do the same float32 arithmetic, so nothing but
equality is accepted.

Hypothesis draws sizes, aspect ratios and modes: a few examples under the CI profile;
LLM_ONNX_MEDIA_EXAMPLES=N (or HYPOTHESIS_PROFILE=explore) searches further."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import PIL.Image
import PIL.ImageOps
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_onnx.errors import ConfigError, MediaError
from llm_onnx.runtime.media import (
    Gemma3ImageProcessor,
    Gemma4ImageProcessor,
    QwenVLImageProcessor,
    image_processor_from_dict,
    load_image,
    load_image_processor,
)
from tests.runtime.media.reference import (
    CONFIGS,
    encoded,
    hf_image_processor,
    hf_pixels,
    image_in_mode,
    random_pixels,
)

EXAMPLES = int(os.environ.get("LLM_ONNX_MEDIA_EXAMPLES") or
               (200 if os.environ.get("HYPOTHESIS_PROFILE") == "explore" else 4))
MODES = ["RGB", "L", "LA", "RGBA", "P", "P+transparency", "CMYK", "1"]


def assert_same(config_name: str, image: PIL.Image.Image) -> None:
    config = CONFIGS[config_name]
    ours = image_processor_from_dict(config)(load_image(image))
    want = hf_pixels(config, image)
    assert ours.pixel_values.dtype == np.float32
    assert ours.pixel_values.shape == want["pixel_values"].shape
    assert np.array_equal(ours.pixel_values, want["pixel_values"])
    if "grid_thw" in want:
        assert ours.grid_thw == want["grid_thw"]
        m = config.get("merge_size", 2)
        assert ours.token_grid == (1, want["grid_thw"][1] // m, want["grid_thw"][2] // m)
        assert ours.num_tokens == want["grid_thw"][1] * want["grid_thw"][2] // m ** 2
    if "positions" in want:
        assert np.array_equal(ours.patch_positions, want["positions"])
        assert ours.num_tokens == want["num_tokens"]
        assert ours.num_patches == int((want["positions"][:, 0] >= 0).sum())
    processor = image_processor_from_dict(config)
    assert processor.num_tokens(image.height, image.width) == ours.num_tokens


SIZES = [(1, 1), (3, 5), (5, 3), (2, 2), (27, 29), (224, 224), (480, 640), (1080, 1920),
         (1, 150), (150, 1), (1, 200), (7, 1400), (1400, 7), (2, 399), (33, 1000)]


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_sizes_and_aspect_ratios(config_name):
    for height, width in SIZES:
        assert_same(config_name, PIL.Image.fromarray(random_pixels(height, width, height + width)))


@pytest.mark.parametrize("config_name", ["qwen_small", "qwen2_5_vl", "gemma3", "gemma4"])
def test_a_huge_photo(config_name):
    """4000 × 3000 (12 megapixels): past the small Qwen budget (1280 tokens), inside Qwen2.5's."""
    assert_same(config_name, PIL.Image.fromarray(random_pixels(3000, 4000, 7)))


def test_qwen3_vl_large_and_past_its_pixel_budget():
    assert_same("qwen3_vl", PIL.Image.fromarray(random_pixels(1500, 2000, 8)))
    small = dict(CONFIGS["qwen3_vl"], size={"longest_edge": 200_000, "shortest_edge": 65536})
    processor = image_processor_from_dict(small)
    assert processor.target_size(3000, 4000) == (384, 512)  # 196,608 <= 200,000
    assert processor.target_size(3000, 4000) == tuple(
        hf_image_processor(small)(images=[PIL.Image.new("RGB", (4000, 3000))])[
            "image_grid_thw"][0][1:] * 16)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config_name", ["qwen3_vl", "gemma3", "gemma4"])
def test_modes(config_name, mode):
    """Grayscale, alpha (onto white), palettes with and without a transparent colour, CMYK and
    1-bit become RGB as transformers' processors make them."""
    assert_same(config_name, image_in_mode(mode, 45, 70, seed=len(mode)))


@pytest.mark.parametrize("config_name", ["qwen3_vl", "gemma4"])
def test_arrays_as_transformers_takes_them(config_name):
    """(H, W, 3) and (H, W, 4) uint8 arrays as transformers' processors take arrays ((H, W, 1)
    for one channel: a bare (H, W) array is no image to them; here it is grayscale)."""
    config = CONFIGS[config_name]
    processor = image_processor_from_dict(config)
    hf = hf_image_processor(config)
    for channels in (1, 3, 4):
        array = random_pixels(40, 66, channels, channels=channels)
        if channels == 4:
            array[:10, :, 3] = 0
        ours = processor(load_image(array))
        want = hf(images=[array], input_data_format="channels_last")["pixel_values"]
        assert np.array_equal(ours.pixel_values, np.asarray(want).reshape(
            ours.pixel_values.shape))
    gray = random_pixels(40, 66, 5, channels=1)
    assert np.array_equal(processor(load_image(gray[:, :, 0])).pixel_values,
                          processor(load_image(gray)).pixel_values)


@st.composite
def drawn_images(draw):
    shape = draw(st.sampled_from(["small", "strip", "any"]))
    if shape == "small":
        height, width = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    elif shape == "strip":
        short, ratio = draw(st.integers(1, 12)), draw(st.integers(2, 200))
        height, width = (short, short * ratio) if draw(st.booleans()) else (short * ratio, short)
    else:
        height, width = draw(st.integers(1, 1200)), draw(st.integers(1, 1200))
        if max(height, width) / min(height, width) > 200:
            height = max(height, width // 200 + 1)
            width = max(width, height // 200 + 1)
    mode = draw(st.sampled_from(MODES))
    return image_in_mode(mode, height, width, seed=draw(st.integers(0, 2 ** 16)))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(image=drawn_images(), config_name=st.sampled_from(list(CONFIGS)))
def test_drawn_images_match_transformers(image, config_name):
    assert_same(config_name, image)


@pytest.mark.parametrize(("mode", "fmt"), [("P+transparency", "PNG"), ("LA", "PNG"),
                                           ("CMYK", "JPEG"), ("RGBA", "WEBP")])
def test_decoded_files_give_transformers_arrays(mode, fmt):
    data = encoded(image_in_mode(mode, 21, 34, seed=3), fmt, **(
        {"lossless": True} if fmt == "WEBP" else {}))
    for config in ("gemma4", "qwen_small", "gemma3"):
        assert np.array_equal(image_processor_from_dict(CONFIGS[config])(load_image(data))
                              .pixel_values,
                              hf_pixels(CONFIGS[config], PIL.Image.open(io.BytesIO(data)))[
                                  "pixel_values"])


def test_an_exif_rotated_photo_gives_transformers_arrays_of_the_upright_picture():
    exif = PIL.Image.Exif()
    exif[0x0112] = 6  # turned 90° clockwise to show
    data = encoded(PIL.Image.fromarray(random_pixels(40, 64, 9)), "JPEG", exif=exif.tobytes())
    upright = PIL.ImageOps.exif_transpose(PIL.Image.open(io.BytesIO(data)))
    for config in ("qwen3_vl", "gemma4"):
        ours = image_processor_from_dict(CONFIGS[config])(load_image(data))
        assert np.array_equal(ours.pixel_values,
                              hf_pixels(CONFIGS[config], upright)["pixel_values"])
    assert image_processor_from_dict(CONFIGS["qwen3_vl"])(load_image(data)).grid_thw == (
        hf_pixels(CONFIGS["qwen3_vl"], upright)["grid_thw"])


def test_sixteen_bit_grayscale_gives_transformers_arrays_of_its_8_bit_picture():
    image = image_in_mode("I;16", 30, 50, seed=4)
    gray = PIL.Image.fromarray((np.asarray(image).astype(np.uint16) >> 8).astype(np.uint8))
    for config in ("gemma4", "qwen3_vl"):
        assert np.array_equal(
            image_processor_from_dict(CONFIGS[config])(load_image(encoded(image, "PNG")))
            .pixel_values, hf_pixels(CONFIGS[config], gray)["pixel_values"])


def test_an_aspect_ratio_past_200_is_refused_as_transformers_refuses_it():
    image = PIL.Image.new("RGB", (201, 1))
    with pytest.raises(ValueError, match="aspect ratio"):
        hf_image_processor(CONFIGS["qwen3_vl"])(images=[image])
    processor = image_processor_from_dict(CONFIGS["qwen3_vl"])
    with pytest.raises(MediaError, match="aspect ratio 201 is past 200"):
        processor(load_image(image))
    with pytest.raises(MediaError, match="aspect ratio"):
        processor.num_tokens(1, 201)


def test_token_counts_are_transformers_counts():
    """num_tokens(h, w) without the pixels: what transformers' processors tell vLLM."""
    from transformers import Gemma4ImageProcessorPil, Gemma4Processor

    qwen = image_processor_from_dict(CONFIGS["qwen3_vl"])
    hf_qwen = hf_image_processor(CONFIGS["qwen3_vl"])
    gemma4 = image_processor_from_dict(CONFIGS["gemma4"])
    hf_gemma4 = Gemma4Processor.__new__(Gemma4Processor)  # only its size arithmetic is used
    hf_gemma4.image_processor = Gemma4ImageProcessorPil()
    hf_gemma4._merge_kwargs = lambda **kw: {"images_kwargs": {}, "videos_kwargs": {}}
    sizes = [(1, 1), (3, 5), (224, 224), (1, 200), (999, 7), (3000, 4000), (768, 1024)]
    for h, w in sizes:
        assert qwen.num_tokens(h, w) == hf_qwen.get_number_of_image_patches(h, w) // 4
    want = hf_gemma4._get_num_multimodal_tokens(image_sizes=sizes)["num_image_tokens"]
    assert [gemma4.num_tokens(h, w) for h, w in sizes] == want
    assert image_processor_from_dict(CONFIGS["gemma3"]).num_tokens(5, 9000) == 256


def test_settings_round_trip_through_transformers():
    """to_dict() is a preprocessor config transformers reads as the same processor."""
    for name, config in CONFIGS.items():
        ours = image_processor_from_dict(config)
        back = image_processor_from_dict(ours.to_dict())
        assert back == ours, name
        image = PIL.Image.fromarray(random_pixels(50, 81, 3))
        assert np.array_equal(hf_pixels(ours.to_dict(), image)["pixel_values"],
                              hf_pixels(config, image)["pixel_values"]), name


def test_defaults_are_transformers_class_defaults():
    import transformers

    for ours, cls in ((QwenVLImageProcessor(), transformers.Qwen2VLImageProcessorPil),
                      (Gemma3ImageProcessor(), transformers.Gemma3ImageProcessorPil),
                      (Gemma4ImageProcessor(), transformers.Gemma4ImageProcessorPil)):
        hf = cls()
        for field in ("resample", "rescale_factor", "do_normalize", "patch_size",
                      "temporal_patch_size", "merge_size", "max_soft_tokens",
                      "pooling_kernel_size"):
            if hasattr(ours, field):
                assert getattr(ours, field) == getattr(hf, field), (cls, field)
        assert tuple(ours.image_mean) == pytest.approx(tuple(hf.image_mean))
        assert tuple(ours.image_std) == pytest.approx(tuple(hf.image_std))
    assert QwenVLImageProcessor().min_pixels == transformers.Qwen2VLImageProcessorPil().size[
        "shortest_edge"]
    assert QwenVLImageProcessor().max_pixels == transformers.Qwen2VLImageProcessorPil().size[
        "longest_edge"]


def test_top_level_min_and_max_pixels_override_size():
    config = dict(CONFIGS["qwen3_vl"], min_pixels=4096, max_pixels=50_000)
    ours = image_processor_from_dict(config)
    assert (ours.min_pixels, ours.max_pixels) == (4096, 50_000)
    assert_same_config = hf_image_processor(config)
    assert (assert_same_config.size.shortest_edge, assert_same_config.size.longest_edge) == (
        4096, 50_000)


def test_load_from_a_checkpoint_folder(tmp_path):
    """processor_config.json's "image_processor" first, else preprocessor_config.json; Gemma 3's
    image_seq_length from processor_config.json's top level."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(CONFIGS["gemma4"]))
    assert load_image_processor(tmp_path) == image_processor_from_dict(CONFIGS["gemma4"])
    (tmp_path / "processor_config.json").write_text(json.dumps(
        {"image_processor": CONFIGS["gemma3"], "image_seq_length": 64}))
    loaded = load_image_processor(tmp_path)
    assert isinstance(loaded, Gemma3ImageProcessor) and loaded.image_seq_length == 64
    assert (loaded.height, loaded.width, loaded.resample) == (896, 896, 2)
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_length": 16}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(CONFIGS["gemma3"]))
    assert load_image_processor(tmp_path).image_seq_length == 16


@pytest.mark.parametrize(("config", "message"), [
    ({"image_processor_type": "SiglipImageProcessor"},
     "field 'image_processor_type' = 'SiglipImageProcessor': not an image processor this "
     "runtime has; known: Qwen2VLImageProcessor, Gemma3ImageProcessor, Gemma4ImageProcessor"),
    ({"patch_size": 16}, "no 'image_processor_type'"),
    (dict(CONFIGS["gemma4"], max_soft_tokens=300),
     "field 'max_soft_tokens' = 300: supported values: 70, 140, 280, 560, 1120"),
    (dict(CONFIGS["gemma3"], do_pan_and_scan=True),
     "field 'do_pan_and_scan' = True: only false is supported here"),
    (dict(CONFIGS["qwen3_vl"], resample=7), "field 'resample' = 7: supported resampling"),
    (dict(CONFIGS["qwen3_vl"], size={"height": 4, "width": 4}),
     "field 'size' = {'height': 4, 'width': 4}: expected {'shortest_edge', 'longest_edge'}"),
    (dict(CONFIGS["qwen3_vl"], image_mean=[0.5, 0.5]), "field 'image_mean' = [0.5, 0.5]"),
    (dict(CONFIGS["qwen3_vl"], do_convert_rgb=False), "field 'do_convert_rgb' = False"),
    (dict(CONFIGS["gemma4"], patch_size="16"), "field 'patch_size' = '16': expected a whole"),
])
def test_unsupported_settings_name_the_file_and_field(config, message):
    with pytest.raises(ConfigError) as e:
        image_processor_from_dict(config, source="ckpt/preprocessor_config.json")
    assert str(e.value).startswith("ckpt/preprocessor_config.json: ")
    assert message in str(e.value)


def test_a_folder_without_a_processor(tmp_path):
    with pytest.raises(ConfigError, match="no preprocessor_config.json"):
        load_image_processor(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="preprocessor_config.json: not readable JSON"):
        load_image_processor(tmp_path)


def test_a_single_number_mean_stands_for_three_channels():
    config = dict(CONFIGS["gemma3"], image_mean=0.5, image_std=0.5)
    image = PIL.Image.fromarray(random_pixels(20, 30, 1))
    assert image_processor_from_dict(config).image_mean == (0.5, 0.5, 0.5)
    assert_same_pixels = hf_pixels(config, image)["pixel_values"]
    assert np.array_equal(image_processor_from_dict(config)(load_image(image)).pixel_values,
                          assert_same_pixels)

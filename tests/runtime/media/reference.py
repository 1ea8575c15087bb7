"""transformers' side of the media tests: its PIL image processors built from the same config
dict as ours, the released checkpoints' preprocessor configs, images in every mode Pillow
writes, and small byte-level tokenizers carrying each family's image tokens."""

from __future__ import annotations

import io

import numpy as np
import PIL.Image

from tests.byte_model import _bytes_to_unicode

# preprocessor_config.json of the released checkpoints (their image-processing fields)
QWEN3_VL = {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16,
            "temporal_patch_size": 2, "merge_size": 2,
            "size": {"longest_edge": 16777216, "shortest_edge": 65536},
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "processor_class": "Qwen3VLProcessor"}
QWEN2_5_VL = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14,
              "temporal_patch_size": 2, "merge_size": 2, "min_pixels": 3136,
              "max_pixels": 12845056, "resample": 3, "do_rescale": True, "do_normalize": True,
              "rescale_factor": 0.00392156862745098, "do_convert_rgb": True,
              "image_mean": [0.48145466, 0.4578275, 0.40821073],
              "image_std": [0.26862954, 0.26130258, 0.27577711]}
# Qwen2VLImageProcessor's own defaults (max 1280 tokens of 28 × 28: what servers often set)
QWEN_SMALL = {"image_processor_type": "Qwen2VLImageProcessorPil"}
GEMMA3 = {"image_processor_type": "Gemma3ImageProcessor", "do_convert_rgb": None,
          "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
          "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "image_seq_length": 256,
          "resample": 2, "rescale_factor": 0.00392156862745098,
          "size": {"height": 896, "width": 896}}
GEMMA4 = {"image_processor_type": "Gemma4ImageProcessor", "do_convert_rgb": True,
          "do_normalize": False, "do_rescale": True, "do_resize": True,
          "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0], "max_soft_tokens": 280,
          "patch_size": 16, "pooling_kernel_size": 3, "resample": 3,
          "rescale_factor": 0.00392156862745098}
CONFIGS = {"qwen3_vl": QWEN3_VL, "qwen2_5_vl": QWEN2_5_VL, "qwen_small": QWEN_SMALL,
           "gemma3": GEMMA3, "gemma4": GEMMA4}


def hf_image_processor(config: dict):
    """transformers' PIL image processor for ``config`` (as AutoImageProcessor would read it)."""
    import transformers

    base = config["image_processor_type"].removesuffix("Fast").removesuffix("Pil")
    cls = getattr(transformers, base + "Pil")
    return cls.from_dict({k: v for k, v in config.items()
                          if k not in ("image_processor_type", "processor_class",
                                       "image_seq_length")})


def hf_pixels(config: dict, image: PIL.Image.Image) -> dict[str, np.ndarray]:
    """transformers' arrays for one image: its pixel_values (this image's), and grid / positions
    / token count where the family has them."""
    processor = hf_image_processor(config)
    # Gemma3Processor fills its config's nulls (do_convert_rgb, do_pan_and_scan) with these
    extra = {"do_convert_rgb": True, "do_pan_and_scan": False} \
        if config["image_processor_type"].startswith("Gemma3") else {}
    out = processor(images=[image], **extra)
    got = {"pixel_values": np.asarray(out["pixel_values"][0] if "num_crops" in out or
                                      "image_position_ids" in out else out["pixel_values"])}
    if "image_grid_thw" in out:
        got["grid_thw"] = tuple(int(v) for v in out["image_grid_thw"][0])
    if "image_position_ids" in out:
        got["positions"] = np.asarray(out["image_position_ids"][0])
        got["num_tokens"] = int(out["num_soft_tokens_per_image"][0])
    return got


def random_pixels(height: int, width: int, seed: int, channels: int = 3) -> np.ndarray:
    """Noise plus a gradient (resampling filters see both edges and smooth areas)."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    ramp = (np.add.outer(np.arange(height), np.arange(width)) * 255 // max(1, height + width - 2))
    smooth = np.repeat(ramp[:, :, None], channels, axis=2).astype(np.uint8)
    keep = rng.random((height, width, 1)) < 0.5
    return np.where(keep, noise, smooth)


def encoded(image: PIL.Image.Image, fmt: str, **save) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **save)
    return buf.getvalue()


def image_in_mode(mode: str, height: int, width: int, seed: int = 0) -> PIL.Image.Image:
    """A ``height`` × ``width`` Pillow image in ``mode`` (RGB, L, LA, RGBA, P, P+transparency,
    CMYK, 1, I;16)."""
    rgb = random_pixels(height, width, seed)
    if mode == "RGBA":
        alpha = random_pixels(height, width, seed + 1, channels=1)[:, :, 0]
        alpha[: height // 2] = 255  # opaque, half transparent, clear pixels all present
        alpha[:, : width // 3] = 0
        return PIL.Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    if mode == "LA":
        return image_in_mode("RGBA", height, width, seed).convert("LA")
    if mode in ("P", "P+transparency"):
        image = PIL.Image.fromarray(rgb).quantize(colors=16)
        if mode == "P+transparency":
            image.info["transparency"] = 3
        return image
    if mode == "I;16":
        wide = (random_pixels(height, width, seed, channels=1)[:, :, 0].astype(np.uint16) * 257)
        return PIL.Image.fromarray(wide + (np.arange(width, dtype=np.uint16) % 200)[None])
    return PIL.Image.fromarray(rgb).convert(mode)


def byte_tokenizer(specials: list[str], merges: tuple[tuple[str, str], ...] = ()):
    """A tokenizers.Tokenizer: ``specials`` first (special tokens), then the 256 bytes, then
    what ``merges`` (byte-level pairs) make."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(specials)}
    for _, char in sorted(_bytes_to_unicode().items()):
        vocab[char] = len(vocab)
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab, list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def hf_tokenizer(tok, pad_token: str | None = None, **special):
    """transformers' tokenizer over ``tok``; ``special`` names its image tokens (boi_token=...)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad_token,
                                   extra_special_tokens=special)

"""Gemma 3's image processor (transformers' ``Gemma3ImageProcessorPil``; SigLIP's input).

- resize: to the config's fixed size (896 × 896 for the released checkpoints), whatever the
  aspect ratio; bilinear by default.
- rescale by 1/255, normalise by mean and std (0.5 each in the released configs).
- pixels: (3, H, W) float32, channels first.
- tokens: ``image_seq_length`` (256), always; in the prompt "\\n\\n<start_of_image>", the soft
  tokens, "<end_of_image>\\n\\n" in place of the template's ``<start_of_image>``.

Pan and scan (extra crops of a wide image, ``do_pan_and_scan``) is off in the released
configs and in transformers' Gemma3Processor by default; it is refused here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from llm_onnx.runtime.media.fields import Fields
from llm_onnx.runtime.media.image import RGBImage
from llm_onnx.runtime.media.pixels import ProcessedImage, rescale_normalize, resize
from llm_onnx.runtime.media.prompt import ImageTokenLayout

IMAGENET_STANDARD = (0.5, 0.5, 0.5)


@dataclass(frozen=True, kw_only=True)
class Gemma3ImageProcessor:
    """Settings as transformers names them; the defaults are ``Gemma3ImageProcessorPil``'s
    (224 × 224: the class's; the checkpoints' configs say 896) and Gemma3Processor's
    ``image_seq_length``."""

    height: int = 224
    width: int = 224
    resample: int = 2  # bilinear
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, float, float] = IMAGENET_STANDARD
    image_std: tuple[float, float, float] = IMAGENET_STANDARD
    image_seq_length: int = 256

    family = "gemma3"
    image_processor_type = "Gemma3ImageProcessor"

    @classmethod
    def from_fields(cls, fields: Fields, processor: Mapping[str, Any]) -> Gemma3ImageProcessor:
        d = cls()
        fields.flag("do_convert_rgb", True, must_be=True)
        fields.flag("do_resize", True, must_be=True)
        fields.flag("do_pan_and_scan", False, must_be=False)
        size = fields.size("size", {"height": d.height, "width": d.width},
                           keys=("height", "width"), square_int=True)
        # the processor's own setting (processor_config.json) before the image processor's
        seq = processor.get("image_seq_length")
        seq_fields = Fields(processor, fields.source) if seq is not None else fields
        return cls(height=size["height"], width=size["width"],
                   resample=fields.resample("resample", d.resample),
                   do_rescale=fields.flag("do_rescale", d.do_rescale),
                   rescale_factor=fields.number("rescale_factor", d.rescale_factor),
                   do_normalize=fields.flag("do_normalize", d.do_normalize),
                   image_mean=fields.channels("image_mean", d.image_mean),
                   image_std=fields.channels("image_std", d.image_std),
                   image_seq_length=seq_fields.integer("image_seq_length", d.image_seq_length))

    def to_dict(self) -> dict[str, Any]:
        """The settings as a preprocessor_config.json that transformers reads back."""
        fields = asdict(self)
        size = {"height": fields.pop("height"), "width": fields.pop("width")}
        return {"image_processor_type": self.image_processor_type, "size": size, **fields}

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        return self.height, self.width

    def num_tokens(self, height: int, width: int) -> int:
        return self.image_seq_length

    def __call__(self, image: RGBImage) -> ProcessedImage:
        x = rescale_normalize(resize(image.pixels, self.height, self.width, self.resample),
                              do_rescale=self.do_rescale, rescale_factor=self.rescale_factor,
                              do_normalize=self.do_normalize, mean=self.image_mean,
                              std=self.image_std)
        return ProcessedImage(pixel_values=x, num_tokens=self.image_seq_length,
                              size=(self.height, self.width), image=image)

    def token_layout(self, encode: Callable[[str], Sequence[int]],
                     tokens: Mapping[str, str] | None = None) -> ImageTokenLayout:
        """The template's ``<start_of_image>`` becomes "\\n\\n<start_of_image>", N
        ``<image_soft_token>``, "<end_of_image>\\n\\n". ``tokens`` may rename ``boi_token``,
        ``image_token`` and ``eoi_token`` (tokenizer_config.json's names)."""
        tokens = tokens or {}
        boi = tokens.get("boi_token", "<start_of_image>")
        eoi = tokens.get("eoi_token", "<end_of_image>")
        soft = tokens.get("image_token", "<image_soft_token>")
        return ImageTokenLayout.build(encode, placeholder=boi, image_token=soft,
                                      before=f"\n\n{boi}", after=f"{eoi}\n\n")

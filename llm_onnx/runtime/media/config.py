"""Choosing and configuring a family's image processor from a checkpoint's files, as
transformers' ``AutoImageProcessor`` does: processor_config.json's ``"image_processor"`` entry
when it has one, else preprocessor_config.json; ``image_processor_type`` names the class (its
``Fast`` / ``Pil`` suffix aside); processor-level settings (Gemma 3's ``image_seq_length``) come
from processor_config.json's top level."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.runtime.media.fields import Fields
from llm_onnx.runtime.media.gemma3 import Gemma3ImageProcessor
from llm_onnx.runtime.media.gemma4 import Gemma4ImageProcessor
from llm_onnx.runtime.media.qwen_vl import QwenVLImageProcessor

ImageProcessor = QwenVLImageProcessor | Gemma3ImageProcessor | Gemma4ImageProcessor
PROCESSORS: dict[str, type[ImageProcessor]] = {
    cls.image_processor_type: cls
    for cls in (QwenVLImageProcessor, Gemma3ImageProcessor, Gemma4ImageProcessor)}
PROCESSOR_FILE = "processor_config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"


def image_processor_from_dict(fields: Mapping[str, Any], *, source: str = PREPROCESSOR_FILE,
                              processor: Mapping[str, Any] | None = None) -> ImageProcessor:
    """The image processor a preprocessor config describes.

    Args:
        fields: the image processor's settings (a preprocessor_config.json, or
            processor_config.json's ``"image_processor"``), transformers' names.
        source: how errors name where ``fields`` came from.
        processor: processor_config.json's top level (Gemma 3's ``image_seq_length``).

    Raises:
        ConfigError: an unknown ``image_processor_type``, or a value this runtime does not
            support (named with its file and field).
    """
    name = fields.get("image_processor_type")
    if not isinstance(name, str):
        raise ConfigError(f"{source}: no 'image_processor_type'; known: {', '.join(PROCESSORS)}.")
    base = name.removesuffix("Fast").removesuffix("Pil")
    cls = PROCESSORS.get(base)
    if cls is None:
        raise ConfigError(f"{source}: field 'image_processor_type' = {name!r}: not an image "
                          f"processor this runtime has; known: {', '.join(PROCESSORS)}.")
    return cls.from_fields(Fields(fields, source), processor or {})


def load_image_processor(folder: str | Path) -> ImageProcessor:
    """The image processor of a checkpoint folder (its processor_config.json and/or
    preprocessor_config.json).

    Raises:
        ConfigError: neither file, unreadable JSON, or what ``image_processor_from_dict`` refuses.
    """
    folder = Path(folder)
    processor = _read(folder / PROCESSOR_FILE)
    nested = processor.get("image_processor") if processor else None
    if isinstance(nested, Mapping):
        return image_processor_from_dict(nested, source=f"{folder / PROCESSOR_FILE} "
                                         "(image_processor)", processor=processor)
    fields = _read(folder / PREPROCESSOR_FILE)
    if fields is None:
        raise ConfigError(f"{folder}: no {PREPROCESSOR_FILE} nor an 'image_processor' in "
                          f"{PROCESSOR_FILE}; the checkpoint has no image processor (a text "
                          "model, or a folder missing files from its repository).")
    return image_processor_from_dict(fields, source=str(folder / PREPROCESSOR_FILE),
                                     processor=processor)


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not readable JSON ({e}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}.")
    return data

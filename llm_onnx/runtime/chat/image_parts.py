"""Image parts of chat messages (the Python API's, and what the server's APIs turn theirs into).

Chat messages take image parts in two shapes, beside ``{"type": "text", "text": ...}``:

    {"type": "image", "image": <path | bytes | data: URL | PIL.Image | numpy array>}
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}   # OpenAI's

The chat template sees ``{"type": "image"}`` in their place and writes the family's placeholder
for each; the placeholder becomes the image's soft tokens (``media.expand_image_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llm_onnx.errors import GenerationError, MediaError
from llm_onnx.model_folder import Manifest

IMAGE_PART_TYPES = ("image", "image_url", "input_image")


def text_only_error(folder: Any, where: str) -> GenerationError:
    return GenerationError(f"{where}: {folder} takes text only (no vision.onnx); export it from "
                           "the multimodal checkpoint without --text-only to send images.")


def image_source(part: dict, where: str) -> Any:
    """What an image part holds (path, bytes, data: URL, PIL image, array)."""
    kind = part.get("type")
    if kind == "image_url" or (kind is None and "image_url" in part):
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str) or not url:
            raise MediaError(f"{where}: an image_url part needs image_url.url, a data: URL.")
        return url
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise MediaError(f"{where}: an input_image part needs image_url, a data: URL.")
        return url
    if "image" not in part or part["image"] is None:
        raise MediaError(f"{where}: an image part needs 'image' (a path, bytes, a data: URL, "
                         "a PIL image or a uint8 array).")
    return part["image"]


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and (part.get("type") in IMAGE_PART_TYPES or (
        part.get("type") is None and ("image" in part or "image_url" in part)))


def split_images(messages: Sequence[Any], manifest: Manifest | None,
                 ) -> tuple[list[Any], list[tuple[Any, str]]]:
    """``messages`` with each image part as ``{"type": "image"}`` (what templates look for), and
    the images in order, each with the name errors give it (``messages[0].content[1]``).
    Messages without image parts are returned as they are."""
    out: list[Any] = []
    sources: list[tuple[Any, str]] = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or not any(is_image_part(p) for p in content):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            named = part.get("where") if isinstance(part, dict) else None
            where = named if isinstance(named, str) else f"messages[{i}].content[{j}]"
            if not is_image_part(part):
                parts.append(part)
                continue
            if manifest is None or manifest.images is None:
                raise text_only_error(getattr(manifest, "folder", "this model folder"), where)
            sources.append((image_source(part, where), where))
            parts.append({"type": "image"})
        out.append({**message, "content": parts})
    return out, sources


__all__ = ["IMAGE_PART_TYPES", "image_source", "is_image_part", "split_images",
           "text_only_error"]

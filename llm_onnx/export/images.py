"""What an export of a checkpoint with a vision tower adds to the folder's manifest: how prompts
take images (``ImagesSpec``): the tower's config, the image processor's settings (read from the
checkpoint as transformers' AutoImageProcessor reads them, and checked by the runtime's own
processor, so a folder the runtime would refuse is never written), the image token and its
id, and what the tower's weights store."""

from __future__ import annotations

import json

from llm_onnx import model_folder as mf
from llm_onnx.checkpoints.load import Checkpoint
from llm_onnx.errors import ConfigError
from llm_onnx.export.modules import NBitsLinear
from llm_onnx.export.plan import ExportPlan
from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig


def images_spec(checkpoint: Checkpoint, plan: ExportPlan) -> mf.ImagesSpec:
    """The ``images`` section of an export with a vision tower."""
    from tokenizers import Tokenizer

    from llm_onnx.runtime.media import load_image_processor  # numpy + Pillow, no engine

    vision = plan.vision_config
    assert vision is not None and checkpoint.path is not None
    folder = checkpoint.path
    try:
        processor = load_image_processor(folder)
    except ConfigError as e:
        raise ConfigError(f"{e} A folder that takes images needs it; export the text model "
                          "alone with --text-only.") from e
    _check_processor(processor, vision, folder)
    data = checkpoint.tokenizer_files.get("tokenizer.json")
    if data is None:
        raise ConfigError(f"{folder}: no tokenizer.json, which a folder that takes images needs "
                          "(its image tokens); export it with --text-only or add the file.")
    tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    renamed = _token_names(checkpoint)
    layout = processor.token_layout(
        lambda text: tokenizer.encode(text, add_special_tokens=False).ids, renamed)
    if layout.image_token_id != vision.image_token_id:
        raise ConfigError(f"{folder}: config.json's image_token_id is {vision.image_token_id}, "
                          f"but the tokenizer gives {layout.image_token!r} id "
                          f"{layout.image_token_id}.")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return mf.ImagesSpec(
        vision=vision, processor=processor.to_dict(), image_token_id=vision.image_token_id,
        placeholder=layout.placeholder, image_token=layout.image_token,
        weights=vision_weights(plan),
        vision_start_token_id=config.get("vision_start_token_id"),
        vision_end_token_id=config.get("vision_end_token_id"), token_names=renamed or None)


def _check_processor(processor, vision: AnyVisionConfig, folder) -> None:
    """ConfigError where the image processor does not cut images as the tower takes them."""
    if processor.family != vision.kind:
        raise ConfigError(f"{folder}: its image processor is {processor.image_processor_type}, "
                          f"not the {vision.kind} processor this vision tower takes.")
    if vision.kind == "qwen_vl":
        cut = (processor.patch_size, processor.merge_size, processor.temporal_patch_size)
        takes = (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
        what = "patches, merge size and frames"
    elif vision.kind == "gemma3":
        cut = (processor.height, processor.width, processor.image_seq_length)
        takes = (vision.image_size, vision.image_size, vision.mm_tokens_per_image)
        what = "height, width and soft tokens"
    else:  # gemma4: its position tables must reach the longest side the processor makes
        longest = processor.max_soft_tokens * processor.pooling_kernel_size
        if longest > vision.position_embedding_size:
            raise ConfigError(
                f"{folder}: the image processor may make an image {longest} patches long "
                f"(max_soft_tokens {processor.max_soft_tokens}); the vision tower's position "
                f"table has {vision.position_embedding_size}.")
        cut = (processor.patch_size, processor.pooling_kernel_size)
        takes = (vision.patch_size, vision.pooling_kernel_size)
        what = "patch size and pooling"
    if cut != takes:
        raise ConfigError(f"{folder}: the image processor's {what} are {list(cut)}, the vision "
                          f"tower takes {list(takes)}; the files do not belong together.")


def _token_names(checkpoint: Checkpoint) -> dict[str, str]:
    """The image tokens' names where tokenizer_config.json renames them (``image_token``,
    Gemma's ``boi_token`` and ``eoi_token``)."""
    raw = checkpoint.tokenizer_files.get("tokenizer_config.json")
    names = json.loads(raw.decode("utf-8")) if raw else {}
    if not isinstance(names, dict):
        return {}
    return {k: names[k] for k in ("image_token", "boi_token", "eoi_token")
            if isinstance(names.get(k), str)}


def vision_weights(plan: ExportPlan) -> str:
    """What the tower's projections store, in words."""
    assert plan.vision is not None
    quantized = [m for m in plan.vision.modules() if isinstance(m, NBitsLinear)]
    if quantized:
        first = quantized[0]
        return f"int{first.bits} per block of {first.block_size}, {first.scheme}"
    return "float16" if plan.options.float16 else "float32"


__all__ = ["images_spec", "vision_weights"]

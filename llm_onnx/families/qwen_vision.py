"""The Qwen vision tower in checkpoints (Qwen3-VL, Qwen3.5, Qwen3.6): its config.json fields
(``vision_config``, the text model's ``rope_parameters.mrope_section``, ``image_token_id``) read
into a VisionConfig, the inverse for the tests' transformers twin, and its tensors
(``model.visual.*``, transformers' names). Not a family: the families that carry the tower use
it (qwen3_5.py, qwen3_5_moe.py, qwen3_vl.py). Pure Python."""

from __future__ import annotations

from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.modeling.vision_config import VisionConfig

PREFIX = "model.visual."  # where the checkpoints keep the tower


def vision_fields(hf: Any, *, default_section: tuple[int, int, int],
                  default_image_token: int, deepstack: bool) -> VisionConfig | None:
    """The tower of a ``...ForConditionalGeneration`` config.json (None when it has no
    ``vision_config``: a text-only class). ``deepstack``: the family reads
    ``deepstack_visual_indexes`` (Qwen3-VL); otherwise it must have none."""
    vision = hf.get("vision_config")
    if vision is None:
        return None
    where = f"{hf.source} (vision_config)"
    if not isinstance(vision, dict):
        raise ConfigError(f"{where}: must be an object.")

    def need(key: str) -> Any:
        if vision.get(key) is None:
            raise ConfigError(f"{where}: missing field '{key}' needed by {hf.architecture}.")
        return vision[key]

    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") not in ("axial", "default"):
        raise ConfigError(f"{where}: rope_type {rope.get('rope_type')!r} is not supported; "
                          "supported: axial.")
    for key in ("patch_size", "temporal_patch_size"):
        if isinstance(vision.get(key), (list, tuple)):
            raise ConfigError(f"{where}: field '{key}' = {vision[key]}: only square patches "
                              "(one number) are supported.")
    text = hf.get("text_config") or {}
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = tuple(params.get("mrope_section") or default_section)
    indexes = tuple(vision.get("deepstack_visual_indexes") or ())
    if indexes and not deepstack:
        raise ConfigError(f"{where}: deepstack_visual_indexes is not part of "
                          f"{hf.architecture}.")
    sizes = {key: need(key) for key in ("depth", "hidden_size", "intermediate_size",
                                        "num_heads", "out_hidden_size")}
    try:  # (VisionConfig's own checks name no file)
        return VisionConfig(
            **sizes,
            patch_size=vision.get("patch_size", 16),
            temporal_patch_size=vision.get("temporal_patch_size", 2),
            in_channels=vision.get("in_channels", 3),
            spatial_merge_size=vision.get("spatial_merge_size", 2),
            num_position_embeddings=vision.get("num_position_embeddings", 2304),
            hidden_act=vision.get("hidden_act", "gelu_pytorch_tanh"),
            rope_theta=float(rope.get("rope_theta", 10_000.0)),
            mrope_section=section, deepstack_visual_indexes=indexes,
            image_token_id=int(hf.get("image_token_id", default_image_token)))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def vision_hf_config(v: VisionConfig) -> dict[str, Any]:
    """transformers' ``vision_config`` of a VisionConfig (the tests' twin)."""
    out = dict(depth=v.depth, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
               num_heads=v.num_heads, out_hidden_size=v.out_hidden_size,
               patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
               in_channels=v.in_channels, spatial_merge_size=v.spatial_merge_size,
               num_position_embeddings=v.num_position_embeddings, hidden_act=v.hidden_act,
               rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta})
    if v.deepstack_visual_indexes:
        out["deepstack_visual_indexes"] = list(v.deepstack_visual_indexes)
    return out


def vision_shapes(v: VisionConfig) -> dict[str, tuple[int, ...]]:
    """The tower's tensors in a checkpoint: name -> shape."""
    p, d, i = PREFIX, v.hidden_size, v.intermediate_size
    out: dict[str, tuple[int, ...]] = {
        f"{p}patch_embed.proj.weight": (d, v.in_channels, v.temporal_patch_size, v.patch_size,
                                        v.patch_size),
        f"{p}patch_embed.proj.bias": (d,),
        f"{p}pos_embed.weight": (v.num_position_embeddings, d),
    }
    for b in range(v.depth):
        q = f"{p}blocks.{b}."
        for norm in ("norm1", "norm2"):
            out[f"{q}{norm}.weight"] = out[f"{q}{norm}.bias"] = (d,)
        out.update({f"{q}attn.qkv.weight": (3 * d, d), f"{q}attn.qkv.bias": (3 * d,),
                    f"{q}attn.proj.weight": (d, d), f"{q}attn.proj.bias": (d,),
                    f"{q}mlp.linear_fc1.weight": (i, d), f"{q}mlp.linear_fc1.bias": (i,),
                    f"{q}mlp.linear_fc2.weight": (d, i), f"{q}mlp.linear_fc2.bias": (d,)})
    wide = d * v.merge_unit
    mergers = [(f"{p}merger.", d)] + [(f"{p}deepstack_merger_list.{j}.", wide)
                                      for j in range(v.deepstack_layers)]
    for q, norm in mergers:
        out.update({f"{q}norm.weight": (norm,), f"{q}norm.bias": (norm,),
                    f"{q}linear_fc1.weight": (wide, wide), f"{q}linear_fc1.bias": (wide,),
                    f"{q}linear_fc2.weight": (v.out_hidden_size, wide),
                    f"{q}linear_fc2.bias": (v.out_hidden_size,)})
    return out


__all__ = ["PREFIX", "vision_fields", "vision_hf_config", "vision_shapes"]

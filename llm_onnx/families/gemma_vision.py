"""The Gemma vision towers in checkpoints (Gemma 3, Gemma 4): their config.json fields
(``vision_config``, the multimodal config's token ids, the text config's pad id and
``use_bidirectional_attention``) read into Gemma3VisionConfig / Gemma4VisionConfig, the inverse
for the tests' transformers twins, and the towers' tensors (transformers' names, as
``Gemma3ForConditionalGeneration`` and ``Gemma4ForConditionalGeneration`` save them). Not a
family: gemma3.py and gemma4.py use it. Pure Python."""

from __future__ import annotations

from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.modeling.gemma_vision_config import Gemma3VisionConfig, Gemma4VisionConfig

# Each tower's canonical prefixes (transformers' module names) and, for each, the prefixes
# checkpoints keep it under, tried in order. Gemma 3's files (the released ones, and what
# transformers 5 saves) keep the older layout: language_model.model.*, vision_tower.* (the
# released: vision_tower.vision_model.*), multi_modal_projector.*.
GEMMA3_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.")
GEMMA4_PREFIXES = ("model.vision_tower.", "model.embed_vision.")
GEMMA3_LAYOUTS = {
    "model.vision_tower.": ("model.vision_tower.", "vision_tower.vision_model.", "vision_tower."),
    "model.multi_modal_projector.": ("model.multi_modal_projector.", "multi_modal_projector."),
}
GEMMA4_LAYOUTS = {prefix: (prefix,) for prefix in GEMMA4_PREFIXES}


def _vision(hf: Any) -> dict[str, Any] | None:
    vision = hf.get("vision_config")
    if vision is not None and not isinstance(vision, dict):
        raise ConfigError(f"{hf.source} (vision_config): must be an object.")
    return vision


def _square(vision: dict[str, Any], key: str, default: int, where: str) -> int:
    value = vision.get(key, default)
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ConfigError(f"{where}: field '{key}' = {value}: only square sizes are "
                              "supported.")
        value = value[0]
    return value


def gemma3_vision_fields(hf: Any, text: Any) -> Gemma3VisionConfig | None:
    """SigLIP and the projector of a ``Gemma3ForConditionalGeneration`` config.json (None when
    it has no ``vision_config``: the text-only class); ``text``: its text config (the pad id,
    the width). Missing fields take transformers' defaults (SiglipVisionConfig's, Gemma3Config's),
    as the released configs rely on them."""
    vision = _vision(hf)
    if vision is None:
        return None
    where = f"{hf.source} (vision_config)"
    if vision.get("vision_use_head"):
        raise ConfigError(f"{where}: vision_use_head is not part of {hf.architecture}.")
    try:
        return Gemma3VisionConfig(
            hidden_size=vision.get("hidden_size", 768),
            intermediate_size=vision.get("intermediate_size", 3072),
            num_hidden_layers=vision.get("num_hidden_layers", 12),
            num_attention_heads=vision.get("num_attention_heads", 12),
            image_size=_square(vision, "image_size", 224, where),
            patch_size=_square(vision, "patch_size", 16, where),
            num_channels=vision.get("num_channels", 3),
            hidden_act=vision.get("hidden_act", "gelu_pytorch_tanh"),
            layer_norm_eps=float(vision.get("layer_norm_eps", 1e-6)),
            mm_tokens_per_image=hf.get("mm_tokens_per_image", 256),
            out_hidden_size=text.get("hidden_size"),
            image_token_id=_token(hf, "image_token", 262_144),
            boi_token_id=_token(hf, "boi_token", 255_999),
            eoi_token_id=_token(hf, "eoi_token", 256_000),
            pad_token_id=text.get("pad_token_id", 0) or 0)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _token(hf: Any, name: str, default: int) -> int:
    """Gemma 3's token ids: ``<name>_index`` (its own field) or ``<name>_id`` (the alias)."""
    value = hf.get(f"{name}_index", hf.get(f"{name}_id", default))
    return int(value)


def gemma4_vision_fields(hf: Any, text: Any) -> Gemma4VisionConfig | None:
    """The tower and embedder of a ``Gemma4ForConditionalGeneration`` config.json (None without
    ``vision_config``); ``text``: its text config (the pad id, the width,
    ``use_bidirectional_attention``). Missing fields take Gemma4VisionConfig's defaults."""
    vision = _vision(hf)
    if vision is None:
        return None
    where = f"{hf.source} (vision_config)"
    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") != "axial":
        raise ConfigError(f"{where}: rope_type {rope.get('rope_type')!r} is not supported; "
                          "supported: axial.")
    if vision.get("attention_bias"):
        raise ConfigError(f"{where}: attention_bias is not part of {hf.architecture}.")
    heads = vision.get("num_attention_heads", 12)
    bidirectional = text.get("use_bidirectional_attention")
    try:
        return Gemma4VisionConfig(
            hidden_size=vision.get("hidden_size", 768),
            intermediate_size=vision.get("intermediate_size", 3072),
            num_hidden_layers=vision.get("num_hidden_layers", 16), num_attention_heads=heads,
            num_key_value_heads=vision.get("num_key_value_heads", heads),
            head_dim=vision.get("head_dim", 64), patch_size=vision.get("patch_size", 16),
            position_embedding_size=vision.get("position_embedding_size", 10 * 1024),
            pooling_kernel_size=vision.get("pooling_kernel_size", 3),
            rms_norm_eps=float(vision.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", 100.0)),
            hidden_activation=vision.get("hidden_activation", "gelu_pytorch_tanh"),
            use_clipped_linears=bool(vision.get("use_clipped_linears", False)),
            standardize=bool(vision.get("standardize", False)),
            out_hidden_size=text.get("hidden_size"),
            image_token_id=int(hf.get("image_token_id", 258_880)),
            boi_token_id=int(hf.get("boi_token_id", 255_999)),
            eoi_token_id=int(hf.get("eoi_token_id", 258_882)),
            pad_token_id=text.get("pad_token_id", 0) or 0,
            bidirectional=bidirectional or None)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def gemma3_vision_hf_config(v: Gemma3VisionConfig) -> dict[str, Any]:
    """transformers' ``vision_config`` (SiglipVisionConfig) of a Gemma3VisionConfig."""
    return dict(model_type="siglip_vision_model", hidden_size=v.hidden_size,
                intermediate_size=v.intermediate_size, num_hidden_layers=v.num_hidden_layers,
                num_attention_heads=v.num_attention_heads, image_size=v.image_size,
                patch_size=v.patch_size, num_channels=v.num_channels, hidden_act=v.hidden_act,
                layer_norm_eps=v.layer_norm_eps, vision_use_head=False)


def gemma4_vision_hf_config(v: Gemma4VisionConfig) -> dict[str, Any]:
    """transformers' ``vision_config`` (Gemma4VisionConfig) of ours."""
    return dict(hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
                num_hidden_layers=v.num_hidden_layers, num_attention_heads=v.num_attention_heads,
                num_key_value_heads=v.num_key_value_heads, head_dim=v.head_dim,
                patch_size=v.patch_size, position_embedding_size=v.position_embedding_size,
                pooling_kernel_size=v.pooling_kernel_size, rms_norm_eps=v.rms_norm_eps,
                rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta},
                hidden_activation=v.hidden_activation,
                use_clipped_linears=v.use_clipped_linears, standardize=v.standardize)


def gemma3_vision_shapes(v: Gemma3VisionConfig) -> dict[str, tuple[int, ...]]:
    """SigLIP's and the projector's tensors in a checkpoint: name -> shape."""
    d, i = v.hidden_size, v.intermediate_size
    t, p = GEMMA3_PREFIXES
    out: dict[str, tuple[int, ...]] = {
        f"{t}embeddings.patch_embedding.weight": (d, v.num_channels, v.patch_size,
                                                  v.patch_size),
        f"{t}embeddings.patch_embedding.bias": (d,),
        f"{t}embeddings.position_embedding.weight": (v.num_patches, d),
        f"{t}post_layernorm.weight": (d,), f"{t}post_layernorm.bias": (d,),
        f"{p}mm_input_projection_weight": (d, v.out_hidden_size),
        f"{p}mm_soft_emb_norm.weight": (d,),
    }
    for n in range(v.num_hidden_layers):
        q = f"{t}encoder.layers.{n}."
        for name, shape in (("layer_norm1", (d,)), ("layer_norm2", (d,)),
                            ("self_attn.q_proj", (d, d)), ("self_attn.k_proj", (d, d)),
                            ("self_attn.v_proj", (d, d)), ("self_attn.out_proj", (d, d)),
                            ("mlp.fc1", (i, d)), ("mlp.fc2", (d, i))):
            out[f"{q}{name}.weight"] = shape
            out[f"{q}{name}.bias"] = (shape[0],)
    return out


def gemma4_vision_shapes(v: Gemma4VisionConfig) -> dict[str, tuple[int, ...]]:
    """Gemma 4's tower's and embedder's tensors in a checkpoint: name -> shape."""
    d, i, hd = v.hidden_size, v.intermediate_size, v.head_dim
    t, e = GEMMA4_PREFIXES
    out: dict[str, tuple[int, ...]] = {
        f"{t}patch_embedder.input_proj.weight": (d, v.patch_width),
        f"{t}patch_embedder.position_embedding_table": (2, v.position_embedding_size, d),
        f"{e}embedding_projection.weight": (v.out_hidden_size, d),
    }
    if v.standardize:
        out[f"{t}std_bias"] = out[f"{t}std_scale"] = (d,)
    projections = {"self_attn.q_proj": (v.num_attention_heads * hd, d),
                   "self_attn.k_proj": (v.num_key_value_heads * hd, d),
                   "self_attn.v_proj": (v.num_key_value_heads * hd, d),
                   "self_attn.o_proj": (d, v.num_attention_heads * hd),
                   "mlp.gate_proj": (i, d), "mlp.up_proj": (i, d), "mlp.down_proj": (d, i)}
    for n in range(v.num_hidden_layers):
        q = f"{t}encoder.layers.{n}."
        for name, shape in projections.items():
            out[f"{q}{name}.linear.weight"] = shape
            if v.use_clipped_linears:
                for bound in ("input_min", "input_max", "output_min", "output_max"):
                    out[f"{q}{name}.{bound}"] = ()
        out[f"{q}self_attn.q_norm.weight"] = out[f"{q}self_attn.k_norm.weight"] = (hd,)
        for norm in ("input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            out[f"{q}{norm}.weight"] = (d,)
    return out


__all__ = ["GEMMA3_LAYOUTS", "GEMMA3_PREFIXES", "GEMMA4_LAYOUTS", "GEMMA4_PREFIXES",
           "gemma3_vision_fields", "gemma3_vision_hf_config", "gemma3_vision_shapes",
           "gemma4_vision_fields", "gemma4_vision_hf_config", "gemma4_vision_shapes"]

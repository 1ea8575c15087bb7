"""Qwen3-VL (``Qwen3VLForConditionalGeneration``): a Qwen3 text model (q/k norms, explicit
head_dim) beside the Qwen vision tower (qwen_vision.py), under ``model.language_model.`` and
``model.visual.``. Differences from Qwen3, all on the image side (``VisionConfig``):

- multimodal RoPE: each token turns by three positions (time, height, width), interleaved by
  ``rope_parameters.mrope_section``; for text the three are equal, which is Qwen3's RoPE;
- DeepStack: three of the tower's middle blocks feed the first three text layers' hidden
  states at the image positions (``deepstack_visual_indexes``).

Read as text alone (``--text-only``, or a checkpoint without ``vision_config``), it is Qwen3
with the text weights nested. The tie of the LM head is the top-level config's. Qwen3-VL-MoE
(``Qwen3VLMoeForConditionalGeneration``) is not built."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.layouts import Part
from llm_onnx.families.llama import base_fields
from llm_onnx.families.qwen3_5 import text_config
from llm_onnx.families.qwen_vision import vision_fields, vision_hf_config
from llm_onnx.modeling.config import AttentionConfig, ModelConfig
from llm_onnx.modeling.shapes import layer_shapes
from llm_onnx.modeling.vision_config import VisionConfig

ARCHITECTURE = "Qwen3VLForConditionalGeneration"
HF_CONFIG_CLASS = "Qwen3VLConfig"
CHECKPOINT_NESTED = ("model.", "model.language_model.")
IMAGE_TOKEN_ID = 151_655  # <|image_pad|> in Qwen's vocabulary (transformers' default)
MROPE_SECTION = (24, 20, 20)  # transformers' default: head_dim 128

# The text model of transformers' default Qwen3VLTextConfig, as Qwen3-VL-8B has it
QWEN3_VL_TEXT = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=151_936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, intermediate_size=12_288, rope_theta=5_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=262_144, tie_word_embeddings=False,
    attention=AttentionConfig(qk_norm=True),
)
# Tiny: head_dim 32 (rotary halves to 16, split 6/5/5 between time, height and width)
QWEN3_VL_TINY = QWEN3_VL_TEXT.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=256,
    rope_theta=10_000.0, tie_word_embeddings=True,
)
PRESETS = {"qwen3_vl_tiny": QWEN3_VL_TINY}
# The tests' twin of a text preset: the smallest tower transformers builds beside it
TWIN_VISION = VisionConfig(depth=1, hidden_size=32, intermediate_size=32, num_heads=2,
                           out_hidden_size=64, num_position_embeddings=16,
                           mrope_section=(6, 5, 5), deepstack_visual_indexes=(0,),
                           image_token_id=IMAGE_TOKEN_ID)


def config_fields(hf: Any) -> dict[str, Any]:
    text = text_config(hf)
    text.refuse(use_sliding_window=True)
    fields = dict(base_fields(text), qk_norm=True)
    tie = hf.get("tie_word_embeddings")  # the multimodal config's, which transformers reads
    if tie is not None:
        fields["tie_word_embeddings"] = bool(tie)
    return fields


def vision_config(hf: Any) -> VisionConfig | None:
    return vision_fields(hf, default_section=MROPE_SECTION, default_image_token=IMAGE_TOKEN_ID,
                         deepstack=True)


def hf_config(cfg: ModelConfig, vision: VisionConfig | None = None) -> dict[str, Any]:
    """transformers' Qwen3VLConfig: the text model, and ``vision`` (a minimal tower by default:
    the class always has one)."""
    vision = vision or TWIN_VISION.replace(out_hidden_size=cfg.hidden_size)
    text = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        hidden_act=cfg.hidden_act, attention_bias=cfg.attention.attention_bias,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_parameters=dict(rope_type="default", rope_theta=cfg.rope_theta,
                             mrope_section=list(vision.mrope_section), mrope_interleaved=True))
    return dict(architectures=[cfg.architecture], text_config=text,
                vision_config=vision_hf_config(vision), image_token_id=vision.image_token_id,
                tie_word_embeddings=cfg.tie_word_embeddings)


# Canonical names are transformers' text names; the table is declared so that the nesting
# under model.language_model. applies (the tower is read apart: qwen_vision.py).
CHECKPOINT_GLOBALS = {name: name for name in ("model.embed_tokens.weight", "model.norm.weight")}
CHECKPOINT_SKIP = r"^model\.visual\."


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    return {name: Part(name) for name in layer_shapes(cfg, i)}


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer,
    checkpoint_skip=CHECKPOINT_SKIP, checkpoint_nested=CHECKPOINT_NESTED,
    vision_config=vision_config)

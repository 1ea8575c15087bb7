"""SmolLM3: Llama whose layers marked 0 in ``no_rope_layers`` attend without RoPE (NoPE).

Hugging Face's ``no_rope_layers`` gives each layer 1 (rotate q and k) or 0 (no positions at
all); without it every ``no_rope_layer_interval``-th layer (4: layers 3, 7, 11, ...) is NoPE, as
in SmolLM3-3B. Optional sliding windows (``use_sliding_window``) apply to the layers
``layer_types`` names ``sliding_attention`` (by default the NoPE ones). Defaults differ from
Llama's where transformers' SmolLM3Config differs: tied embeddings, 4 KV heads, RoPE base
2,000,000, a context of 32,768. GGUF files (llama.cpp's ``smollm3``) are Llama's layout, q/k
rows interleaved; llama.cpp stores no NoPE pattern and always takes every fourth layer, as the
reader does.
"""

from __future__ import annotations

from typing import Any

from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.families import llama
from llm_onnx.families.family import Family, HFConfig
from llm_onnx.families.layouts import GGUFNames
from llm_onnx.families.llama import GGUF_GLOBALS, GGUF_LAYER, base_hf_config, gguf_fields
from llm_onnx.modeling.config import ModelConfig, PositionConfig

ARCHITECTURE = "SmolLM3ForCausalLM"
HF_CONFIG_CLASS = "SmolLM3Config"


def nope_every(layers: int, interval: int) -> tuple[int, ...]:
    """transformers' default ``no_rope_layers``: 0 (NoPE) on every ``interval``-th layer."""
    return tuple(int((i + 1) % interval != 0) for i in range(layers))


SMOLLM3_3B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=128_256, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
    num_key_value_heads=4, head_dim=128, intermediate_size=11_008, rope_theta=5_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=65_536, tie_word_embeddings=True,
    positions=PositionConfig(no_rope_layers=nope_every(36, 4)),
)
# A rotating layer, then a NoPE one (interval 2); head_dim != hidden / heads, kv heads < heads.
SMOLLM3_TINY = SMOLLM3_3B.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=256,
    no_rope_layers=(1, 0),
)
PRESETS = {"smollm3_3b": SMOLLM3_3B, "smollm3_tiny": SMOLLM3_TINY}
HF_REPOS = {"smollm3_3b": "HuggingFaceTB/SmolLM3-3B"}

# SmolLM3Config's own defaults where they are not Llama's (a field absent from config.json)
_DEFAULTS = {"num_key_value_heads": 4, "max_position_embeddings": 32_768,
             "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
_DEFAULT_THETA = 2_000_000.0  # SmolLM3Config.default_theta


def config_fields(hf: Any) -> dict[str, Any]:
    data = {**_DEFAULTS, **hf.data}
    if "rope_theta" not in data and "rope_theta" not in (data.get("rope_parameters") or {}):
        data["rope_theta"] = _DEFAULT_THETA
    fields = llama.config_fields(HFConfig(data, hf.source))  # Llama's, o_proj and MLP biases
    layers = fields["num_hidden_layers"]
    flags = hf.get("no_rope_layers")
    if flags is None:
        flags = nope_every(layers, int(hf.get("no_rope_layer_interval", 4)))
    if not isinstance(flags, list | tuple) or len(flags) < layers:
        raise ConfigError(f"{hf.source}: no_rope_layers must list 1 (RoPE) or 0 (NoPE) for each "
                          f"of the {layers} layers, got {flags!r}.")
    flags = tuple(int(f) if isinstance(f, bool) else f for f in flags[:layers])  # "at least" n
    types = hf.get("layer_types")
    window = hf.get("sliding_window") if hf.get("use_sliding_window", False) else None
    if window and types is None:  # transformers: the NoPE layers slide
        types = ["full_attention" if f else "sliding_attention" for f in flags]
    types = tuple(types[:layers]) if types is not None else None
    if types is not None and "sliding_attention" in types and not window:
        raise ConfigError(f"{hf.source}: layer_types names sliding_attention layers but "
                          "use_sliding_window and sliding_window do not give them a window.")
    sliding = types is not None and "sliding_attention" in types
    return dict(fields, no_rope_layers=flags, sliding_window=window if sliding else None,
                layer_types=types if sliding else None)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rope = {**dict(cfg.rope_scaling), "rope_theta": cfg.rope_theta}
    nope = cfg.positions.no_rope_layers
    out = dict(base_hf_config(cfg), mlp_bias=cfg.mlp.mlp_bias, rope_parameters=rope,
               no_rope_layers=list(nope or [1] * cfg.num_hidden_layers),
               use_sliding_window=cfg.sliding_window is not None,
               sliding_window=cfg.sliding_window,
               # SmolLM3Config's pad id (128004) sizes the embedding's padding row, which a
               # smaller vocabulary refuses; it is no part of the architecture
               pad_token_id=None)
    out.pop("rope_theta")
    if cfg.sliding_window is not None:  # every layer slides unless layer_types says otherwise
        out["layer_types"] = list(cfg.layer_types or
                                  ["sliding_attention"] * cfg.num_hidden_layers)
    return out


def smollm3_gguf_fields(meta: Any) -> dict[str, Any]:
    """llama.cpp's smollm3: Llama's keys; every fourth layer NoPE (n_no_rope_layer_step = 4,
    fixed in llama.cpp, not stored in the file)."""
    kind = meta.get("rope.scaling.type")
    if kind not in (None, "none"):
        raise CheckpointError(f"{meta.path}: smollm3.rope.scaling.type {kind!r} is not "
                              "supported for GGUF files; supported: none.")
    fields = gguf_fields(meta)
    return dict(fields, no_rope_layers=nope_every(fields["num_hidden_layers"], 4))


# convert_hf_to_gguf's SmolLM3Model is its LlamaModel: q/k rows interleaved like Llama's
GGUF = GGUFNames(arch="smollm3", config_fields=smollm3_gguf_fields, layer=GGUF_LAYER,
                 globals=GGUF_GLOBALS, unpermute_qk=True)


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    gguf=GGUF)

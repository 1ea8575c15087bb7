"""ModelConfig: the architecture of one decoder, with field names taken from Hugging Face config.json.

Pure Python (no torch), so presets and the CLI's help load instantly and the runtime can read a
config from a manifest without the exporter's dependencies.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_onnx.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Sparse mixture-of-experts MLP (Qwen3-MoE): softmax router, top-k, SwiGLU experts."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool = True  # renormalise the top-k router probabilities to sum to 1
    decoder_sparse_step: int = 1  # every Nth layer is sparse (Qwen3-MoE: 1 = all)
    mlp_only_layers: tuple[int, ...] = ()  # layers that keep a dense MLP


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a decoder-only transformer; no dtype, no paths, no export options.

    Args:
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads:
            as in Hugging Face config.json.
        head_dim: explicit (Qwen3-0.6B has 128, not hidden_size // heads).
        intermediate_size: width of the dense MLP.
        hidden_act: "silu" or a GELU variant: "gelu" (exact, erf), "gelu_new",
            "gelu_pytorch_tanh", "gelu_fast" (the tanh approximation).
        gated_mlp: down(act(gate(x)) * up(x)) (Llama's SwiGLU) or down(act(up(x))) (GPT-2, BLOOM,
            Falcon).
        qk_norm: Qwen3's per-head RMSNorm on q and k, before RoPE.
        moe: Qwen3-MoE experts; None for a dense model.
        rope_scaling: Hugging Face's dict ({"rope_type": "llama3", ...}) or None.
        position_embedding_type: "rope", "learned" (GPT-2's table of absolute positions) or
            "alibi" (BLOOM's per-head linear attention bias).
        norm_type: "rms" (eps ``rms_norm_eps``) or "layer" (LayerNorm with bias, eps
            ``layer_norm_epsilon``).
        parallel_attn: attention and MLP both read the block's normed input and are added to the
            residual together (Falcon-7B); ``parallel_attn_shared_norm`` False gives the MLP its
            own norm (``post_attention_layernorm``) of the same input.
        sliding_window: Mistral: each query attends to its last ``sliding_window`` keys, itself
            included.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_scaling: dict[str, Any] | None = None
    partial_rotary_factor: float = 1.0
    hidden_act: str = "silu"
    gated_mlp: bool = True
    attention_bias: bool = False  # biases on q/k/v projections
    o_proj_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    moe: MoEConfig | None = None
    # Choices of older architectures (GPT-2, BLOOM, Falcon, Mistral); defaults are Llama's.
    position_embedding_type: str = "rope"  # "rope" | "learned" | "alibi"
    norm_type: str = "rms"  # "rms" | "layer"
    layer_norm_epsilon: float = 1e-5  # used when norm_type == "layer"
    embedding_layernorm: bool = False  # BLOOM: LayerNorm right after the embedding
    parallel_attn: bool = False  # GPT-J / Falcon: attention and MLP read the same normed input
    parallel_attn_shared_norm: bool = True  # Falcon-7B: one norm feeds both branches
    sliding_window: int | None = None  # Mistral: attend to at most this many keys
    architecture: str = "LlamaForCausalLM"  # the Hugging Face class this config mirrors

    def __post_init__(self) -> None:
        problems = []
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if not problems and self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                            f"num_key_value_heads ({self.num_key_value_heads})")
        if self.position_embedding_type not in ("rope", "learned", "alibi"):
            problems.append(f"position_embedding_type must be rope, learned or alibi, got "
                            f"{self.position_embedding_type!r}")
        if self.norm_type not in ("rms", "layer"):
            problems.append(f"norm_type must be 'rms' or 'layer', got {self.norm_type!r}")
        if self.hidden_act not in _ACTIVATIONS:
            problems.append(f"hidden_act {self.hidden_act!r} is not supported; supported: "
                            f"{', '.join(sorted(_ACTIVATIONS))}")
        if self.position_embedding_type == "rope" and self.rotary_dim % 2:
            problems.append(f"rotary dimension {self.rotary_dim} must be even")
        if self.embedding_layernorm and self.position_embedding_type == "learned":
            problems.append("embedding_layernorm with learned positions is not supported")
        if self.sliding_window is not None and (
                not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            problems.append(f"sliding_window must be a positive integer or None, got "
                            f"{self.sliding_window!r}")
        if self.moe is not None and self.moe.num_experts_per_tok > self.moe.num_experts:
            problems.append("moe.num_experts_per_tok exceeds moe.num_experts")
        if problems:
            raise ConfigError("Invalid model config: " + "; ".join(problems) + ".")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer: int) -> bool:
        moe = self.moe
        return (moe is not None and layer not in moe.mlp_only_layers
                and (layer + 1) % moe.decoder_sparse_step == 0)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of to_dict (used by the manifest)."""
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"Unknown model config fields: {', '.join(unknown)}.")
        if data.get("moe") is not None:
            moe = dict(data["moe"])
            moe["mlp_only_layers"] = tuple(moe.get("mlp_only_layers", ()))
            data["moe"] = MoEConfig(**moe)
        return cls(**data)


_ACTIVATIONS = {"silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"}

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM",
                           "Qwen3MoeForCausalLM", "GPT2LMHeadModel", "BloomForCausalLM",
                           "FalconForCausalLM")


def _require(cfg: dict[str, Any], key: str, source: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"{source}: missing field '{key}' needed by {cfg.get('architectures', ['?'])[0]}.")
    return cfg[key]


def _rope_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """rope_theta and rope_scaling from either the classic fields or transformers 5's rope_parameters."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10_000.0))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling is not None:
        scaling = dict(scaling)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "default":
            scaling = None
        elif rope_type not in ("linear", "llama3"):
            raise ConfigError(f"rope_scaling type '{rope_type}' is not supported; supported: linear, llama3.")
    return {"rope_theta": float(theta), "rope_scaling": scaling}


def _refuse(cfg: dict[str, Any], source: str, arch: str, **unsupported: Any) -> None:
    """ConfigError if a field has a value whose variant of the architecture we do not build."""
    for key, value in unsupported.items():
        if key in cfg and cfg[key] == value:
            raise ConfigError(f"{source}: {key}={json.dumps(value)} is not supported for {arch}.")


def _gpt2_fields(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """GPT-2: learned positions, LayerNorm, GELU MLP, biases everywhere, multi-head attention."""
    arch = "GPT2LMHeadModel"
    _refuse(cfg, source, arch, scale_attn_by_inverse_layer_idx=True, add_cross_attention=True,
            scale_attn_weights=False)
    hidden = _require(cfg, "n_embd", source)
    heads = _require(cfg, "n_head", source)
    return dict(
        vocab_size=_require(cfg, "vocab_size", source), hidden_size=hidden,
        num_hidden_layers=_require(cfg, "n_layer", source), num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=hidden // heads,
        intermediate_size=cfg.get("n_inner") or 4 * hidden,
        max_position_embeddings=_require(cfg, "n_positions", source),
        hidden_act=cfg.get("activation_function", "gelu_new"), gated_mlp=False,
        position_embedding_type="learned", norm_type="layer",
        layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)),
        attention_bias=True, o_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
    )


def _bloom_fields(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """BLOOM: ALiBi, LayerNorm (also after the embedding), GELU (tanh) MLP, biases, MHA."""
    _refuse(cfg, source, "BloomForCausalLM", apply_residual_connection_post_layernorm=True)
    hidden = cfg.get("hidden_size") or _require(cfg, "n_embed", source)
    heads = _require(cfg, "n_head", source)
    return dict(
        vocab_size=_require(cfg, "vocab_size", source), hidden_size=hidden,
        num_hidden_layers=_require(cfg, "n_layer", source), num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=hidden // heads, intermediate_size=4 * hidden,
        # ALiBi has no table of positions; BLOOM was trained on 2048-token sequences.
        max_position_embeddings=2048,
        hidden_act="gelu_new",  # BloomGelu is the tanh approximation
        gated_mlp=False, position_embedding_type="alibi", norm_type="layer",
        layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)), embedding_layernorm=True,
        attention_bias=True, o_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
    )


def _falcon_fields(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """Falcon-7B style: RoPE, multi-query attention, attention and MLP in parallel from one
    LayerNorm, exact GELU MLP, no biases (``bias``)."""
    arch = "FalconForCausalLM"
    _refuse(cfg, source, arch, new_decoder_architecture=True, alibi=True)
    hidden = cfg.get("hidden_size") or _require(cfg, "n_embed", source)
    heads = _require(cfg, "num_attention_heads", source)
    bias = bool(cfg.get("bias", False))
    return dict(
        vocab_size=_require(cfg, "vocab_size", source), hidden_size=hidden,
        num_hidden_layers=_require(cfg, "num_hidden_layers", source), num_attention_heads=heads,
        num_key_value_heads=1 if cfg.get("multi_query", True) else heads,
        head_dim=hidden // heads, intermediate_size=cfg.get("ffn_hidden_size") or 4 * hidden,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        hidden_act=cfg.get("activation", "gelu"), gated_mlp=False, norm_type="layer",
        layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-5)),
        parallel_attn=bool(cfg.get("parallel_attn", True)),
        attention_bias=bias, o_proj_bias=bias, mlp_bias=bias,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        **_rope_fields(cfg),
    )


_OLDER_FAMILIES = {"GPT2LMHeadModel": _gpt2_fields, "BloomForCausalLM": _bloom_fields,
                   "FalconForCausalLM": _falcon_fields}


def from_hf_config(cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """Map a Hugging Face config.json dict to a ModelConfig (architectures listed in
    SUPPORTED_ARCHITECTURES); raises ConfigError naming the file and field otherwise."""
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"{source}: architecture {arch!r} is not supported. "
                          f"Supported: {', '.join(SUPPORTED_ARCHITECTURES)}.")
    if arch in _OLDER_FAMILIES:
        return _build(dict(architecture=arch, **_OLDER_FAMILIES[arch](cfg, source)), source)
    hidden = _require(cfg, "hidden_size", source)
    heads = _require(cfg, "num_attention_heads", source)
    common = dict(
        architecture=arch,
        vocab_size=_require(cfg, "vocab_size", source),
        hidden_size=hidden,
        num_hidden_layers=_require(cfg, "num_hidden_layers", source),
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        intermediate_size=_require(cfg, "intermediate_size", source),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        hidden_act=cfg.get("hidden_act", "silu"),
        attention_bias=bool(cfg.get("attention_bias", False)),
        partial_rotary_factor=float(cfg.get("partial_rotary_factor", 1.0)),
        **_rope_fields(cfg),
    )
    if arch == "LlamaForCausalLM":
        common["o_proj_bias"] = common["attention_bias"]
        common["mlp_bias"] = bool(cfg.get("mlp_bias", False))
    if arch == "MistralForCausalLM":
        common["sliding_window"] = cfg.get("sliding_window")
    if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        common["qk_norm"] = True
        if cfg.get("use_sliding_window"):
            raise ConfigError(f"{source}: use_sliding_window=true is not supported for {arch}.")
    if arch == "Qwen3MoeForCausalLM":
        num_experts = cfg.get("num_experts", cfg.get("num_local_experts"))
        if num_experts is None:
            raise ConfigError(f"{source}: missing field 'num_experts' needed by {arch}.")
        common["moe"] = MoEConfig(
            num_experts=num_experts,
            num_experts_per_tok=_require(cfg, "num_experts_per_tok", source),
            moe_intermediate_size=_require(cfg, "moe_intermediate_size", source),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
            decoder_sparse_step=cfg.get("decoder_sparse_step", 1) or 1,
            mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
        )
    return _build(common, source)


def _build(fields: dict[str, Any], source: str) -> ModelConfig:
    try:
        return ModelConfig(**fields)
    except TypeError as e:  # a field of the wrong kind
        raise ConfigError(f"{source}: {e}.") from e


def load_hf_config(path: Path) -> ModelConfig:
    """Read config.json (a file or the folder holding it)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{file}: no config.json here; a Hugging Face checkpoint folder has one.")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{file}: not valid JSON ({e}).") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a JSON object.")
    return from_hf_config(data, source=str(file))


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""

"""ModelConfig: the architecture of one decoder, with field names taken from Hugging Face config.json.

The shape every decoder has (widths, heads, layers, RoPE base, activation, the layer pattern)
is ModelConfig's own fields; each mechanism a family may switch on is a field of one of its
groups (subconfigs.py: attention, mlp, norm, residual, positions, embedding, moe,
linear_attention), which the decoder reads once, where it builds the matching part.

Pure Python (no torch), so presets and the CLI's help load instantly and the runtime can read a
config from a manifest without the exporter's dependencies. How each family's config.json maps
to it lives in that family's module (llm_onnx/families/).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.modeling.subconfigs import (
    GROUPS,
    AttentionConfig,
    EmbeddingConfig,
    LinearAttentionConfig,
    MLPConfig,
    MoEConfig,
    NormConfig,
    PositionConfig,
    ResidualConfig,
)

__all__ = ["AttentionConfig", "EmbeddingConfig", "LAYER_TYPES", "LinearAttentionConfig",
           "MLPConfig", "ModelConfig", "MoEConfig", "NormConfig", "PositionConfig",
           "ResidualConfig", "longrope_attention_factor"]

LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
_ACTIVATIONS = {"silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu"}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a decoder-only transformer; no dtype, no paths, no export options.

    Args:
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads:
            as in Hugging Face config.json.
        head_dim: explicit (Qwen3-0.6B has 128, not hidden_size // heads).
        intermediate_size: width of the dense MLP.
        rope_scaling: Hugging Face's dict ({"rope_type": "llama3", ...}) or None.
        hidden_act: "silu", "relu" (OPT) or a GELU variant: "gelu" (exact, erf), "gelu_new",
            "gelu_pytorch_tanh", "gelu_fast" (the tanh approximation).
        sliding_window: Mistral: each query attends to its last ``sliding_window`` keys, itself
            included; with ``layer_types``, only the "sliding_attention" layers do.
        layer_types: Gemma 3, gpt-oss: "sliding_attention" or "full_attention" per layer
            (sliding layers attend to their last ``sliding_window`` keys and take RoPE base
            ``positions.rope_local_theta``); Qwen3.5: "linear_attention" or "full_attention".
        final_logit_softcapping: logits = c * tanh(logits / c) (Gemma), or None.
        attention, mlp, norm, residual, positions, embedding: the groups of family switches
            (subconfigs.py); their defaults are Llama's.
        moe: routed experts; None for a dense model.
        linear_attention: the Gated DeltaNet layers' shape (Qwen3.5, Qwen3-Next); their layers
            are those ``layer_types`` names "linear_attention".

    A group's field can be named without its group where fields are given flat (``replace``,
    ``from_fields``): ``cfg.replace(qk_norm=True)`` sets ``attention.qk_norm``.
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
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    final_logit_softcapping: float | None = None
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    mlp: MLPConfig = field(default_factory=MLPConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    residual: ResidualConfig = field(default_factory=ResidualConfig)
    positions: PositionConfig = field(default_factory=PositionConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    moe: MoEConfig | None = None
    linear_attention: LinearAttentionConfig | None = None
    architecture: str = "LlamaForCausalLM"  # the Hugging Face class this config mirrors

    def __post_init__(self) -> None:
        problems = self._shape_problems()
        for name in (*GROUPS, "moe", "linear_attention"):
            group = getattr(self, name)
            if group is not None:
                problems += group.problems()
        if not problems:
            problems += self._layer_problems()
        if not problems:
            problems += self._mechanism_problems()
        if problems:
            raise ConfigError("Invalid model config: " + "; ".join(problems) + ".")

    def _shape_problems(self) -> list[str]:
        problems = []
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if not problems and self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                            f"num_key_value_heads ({self.num_key_value_heads})")
        if self.hidden_act not in _ACTIVATIONS:
            problems.append(f"hidden_act {self.hidden_act!r} is not supported; supported: "
                            f"{', '.join(sorted(_ACTIVATIONS))}")
        if self.sliding_window is not None and (
                not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            problems.append(f"sliding_window must be a positive integer or None, got "
                            f"{self.sliding_window!r}")
        return problems

    def _layer_problems(self) -> list[str]:
        """The per-layer lists: layer_types, no_rope_layers, the linear-attention layers."""
        problems = []
        if self.layer_types is not None and (
                len(self.layer_types) != self.num_hidden_layers
                or set(self.layer_types) - set(LAYER_TYPES)):
            problems.append(f"layer_types must name {', '.join(LAYER_TYPES)} for each layer")
        elif self.layer_types is not None and "linear_attention" in self.layer_types \
                and self.linear_attention is None:
            problems.append("layer_types names linear_attention layers but linear_attention "
                            "(their shape) is not given")
        nope = self.positions.no_rope_layers
        if nope is not None and (
                not isinstance(nope, tuple) or len(nope) != self.num_hidden_layers
                or any(type(v) is not int or v not in (0, 1) for v in nope)):
            problems.append(f"no_rope_layers must give 1 (RoPE) or 0 (no RoPE) for each of the "
                            f"{self.num_hidden_layers} layers, got {nope!r}")
        if self.linear_attention is not None and (
                self.layer_types is None or "linear_attention" not in self.layer_types):
            problems.append("linear_attention is given but layer_types names no "
                            "linear_attention layer")
        return problems

    def _mechanism_problems(self) -> list[str]:
        """The groups' fields against each other and against the shape."""
        problems = []
        att, emb, res = self.attention, self.embedding, self.residual
        pos = self.positions
        if pos.position_embedding_type == "rope" and self.rotary_dim % 2:
            problems.append(f"rotary dimension {self.rotary_dim} must be even")
        if emb.embedding_layernorm and pos.position_embedding_type == "learned":
            problems.append("embedding_layernorm with learned positions is not supported")
        if pos.position_padding_idx is not None:
            rows = self.max_position_embeddings + pos.position_offset
            if (not isinstance(pos.position_padding_idx, int)
                    or isinstance(pos.position_padding_idx, bool)
                    or not 0 <= pos.position_padding_idx < rows):
                problems.append(f"position_padding_idx must be a row of the position table "
                                f"(0 to {rows - 1}), got {pos.position_padding_idx!r}")
        if res.topology == "post" and emb.embedding_layernorm:
            problems.append("the post-norm topology with an embedding norm is not supported")
        # Gemma 4's mechanisms live in its (sandwich) layer
        gemma4 = [name for name, on in (("enable_moe_block", self.mlp.enable_moe_block),
                                        ("hidden_size_per_layer_input",
                                         emb.hidden_size_per_layer_input),
                                        ("layer_scalar", res.layer_scalar)) if on]
        if gemma4 and res.topology != "sandwich":
            problems.append(f"{', '.join(gemma4)} need the sandwich topology")
        if att.num_global_key_value_heads is not None and \
                self.num_attention_heads % att.num_global_key_value_heads:
            problems.append("num_attention_heads must be a multiple of "
                            "num_global_key_value_heads")
        shared = att.num_kv_shared_layers
        if shared >= self.num_hidden_layers:
            problems.append(f"num_kv_shared_layers must be 0 to {self.num_hidden_layers - 1}, "
                            f"got {shared!r}")
        elif shared and self.linear_attention is not None:
            problems.append("num_kv_shared_layers with linear-attention layers is not supported")
        elif shared:
            for i in range(self.num_hidden_layers - shared, self.num_hidden_layers):
                if self._own_kv_source(i) is None:
                    kind = self.layer_types[i] if self.layer_types else "full_attention"
                    problems.append(f"KV-shared layer {i} ({kind}) has no earlier layer of its "
                                    "kind to read")
                    break
        if self.mlp.enable_moe_block and self.moe is None:
            problems.append("enable_moe_block needs moe (the experts' shape)")
        return problems

    # -------------------------------------------------------------- per-layer questions

    def is_linear_layer(self, layer: int) -> bool:
        """Whether ``layer`` is a Gated DeltaNet layer (a recurrent state, no KV cache)."""
        return self.layer_types is not None and self.layer_types[layer] == "linear_attention"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that attend over a KV cache (all of them but linear-attention layers)."""
        return tuple(i for i in range(self.num_hidden_layers) if not self.is_linear_layer(i))

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if self.is_linear_layer(i))

    def layer_window(self, layer: int) -> int | None:
        """The attention window of ``layer`` (None: the whole context)."""
        if self.layer_types is not None and self.layer_types[layer] == "full_attention":
            return None
        return self.sliding_window

    def layer_uses_rope(self, layer: int) -> bool:
        """Whether ``layer``'s attention rotates q and k (SmolLM3's NoPE layers do not)."""
        nope = self.positions.no_rope_layers
        return self.positions.position_embedding_type == "rope" and (
            nope is None or bool(nope[layer]))

    def layer_is_local(self, layer: int) -> bool:
        """Whether ``layer`` takes the local RoPE tables (Gemma 3's sliding layers)."""
        return (self.positions.rope_local_theta is not None and self.layer_types is not None
                and self.layer_types[layer] == "sliding_attention")

    def layer_head_dim(self, layer: int) -> int:
        """The head size of ``layer`` (Gemma 4's full-attention layers: global_head_dim)."""
        if self.attention.global_head_dim is not None and self.layer_window(layer) is None:
            return self.attention.global_head_dim
        return self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        """The KV head count of ``layer`` (Gemma 4's full-attention layers may have fewer)."""
        heads = self.attention.num_global_key_value_heads
        if heads is not None and self.layer_window(layer) is None:
            return heads
        return self.num_key_value_heads

    def layer_k_eq_v(self, layer: int) -> bool:
        """Whether ``layer``'s values are its keys' projection (Gemma 4's full layers)."""
        return self.attention.attention_k_eq_v and self.layer_window(layer) is None

    def _own_kv_source(self, layer: int) -> int | None:
        first = self.num_hidden_layers - self.attention.num_kv_shared_layers
        if layer < first:
            return layer
        kind = self.layer_types[layer] if self.layer_types else None
        for j in range(first - 1, -1, -1):
            if (self.layer_types[j] if self.layer_types else None) == kind:
                return j
        return None

    def kv_source(self, layer: int) -> int:
        """The layer whose KV cache ``layer`` attends over: itself, or for Gemma 4's last
        ``attention.num_kv_shared_layers`` layers the last earlier layer of the same kind."""
        source = self._own_kv_source(layer)
        assert source is not None
        return source

    def is_kv_shared(self, layer: int) -> bool:
        return self.kv_source(layer) != layer

    @property
    def shares_kv(self) -> bool:
        """Whether some layers attend over an earlier layer's cache (Gemma 4)."""
        return self.attention.num_kv_shared_layers > 0

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The layers that own state tensors (a KV buffer, or a linear-attention layer's
        states): every layer but Gemma 4's KV-shared ones."""
        return tuple(i for i in range(self.num_hidden_layers) if not self.is_kv_shared(i))

    @property
    def cache_layers(self) -> tuple[int, ...]:
        """The attention layers that own a KV buffer."""
        return tuple(i for i in self.attention_layers if not self.is_kv_shared(i))

    def layer_kv_shape(self, layer: int) -> tuple[int, int]:
        """(KV heads, head size) of ``layer``'s cache buffer."""
        return self.layer_kv_heads(layer), self.layer_head_dim(layer)

    def layer_intermediate(self, layer: int) -> int:
        """The dense MLP's width in ``layer`` (Gemma 4 E2B: doubled in KV-shared layers)."""
        wide = self.mlp.use_double_wide_mlp and self.is_kv_shared(layer)
        return self.intermediate_size * (2 if wide else 1)

    @property
    def embed_width(self) -> int:
        """Width of the token embedding and the LM head (OPT-350m's 512; else hidden_size)."""
        return self.embedding.embed_dim or self.hidden_size

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is the sparse one (Gemma 4's experts beside a dense MLP are
        not: ``mlp.enable_moe_block``)."""
        moe = self.moe
        return (moe is not None and not self.mlp.enable_moe_block
                and layer not in moe.mlp_only_layers
                and (layer + 1) % moe.decoder_sparse_step == 0)

    # -------------------------------------------------------------- building and reading

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes``: ModelConfig's fields, or a group's fields by their own name
        (``replace(qk_norm=True)``); ConfigError naming an unknown one."""
        return ModelConfig(**_grouped(changes, self))

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> ModelConfig:
        """A config from flat fields, as a family's config_fields gives them: ModelConfig's own
        and each group's by its own name, the rest Llama's defaults."""
        return cls(**_grouped(fields, None))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of to_dict (used by the manifest). Also reads the flat form that manifests
        written before the groups hold (every field at the top, the residual topology as
        booleans: ``legacy_fields``)."""
        data = legacy_fields(dict(data))
        for name in ("layer_types", "no_rope_layers"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        for name, kind in GROUPS.items():
            if isinstance(data.get(name), dict):
                data[name] = _group_from_dict(kind, name, data[name])
        if data.get("moe") is not None:
            moe = dict(data["moe"])
            moe["mlp_only_layers"] = tuple(moe.get("mlp_only_layers", ()))
            data["moe"] = _group_from_dict(MoEConfig, "moe", moe)
        if data.get("linear_attention") is not None:
            data["linear_attention"] = _group_from_dict(LinearAttentionConfig, "linear_attention",
                                                        data["linear_attention"])
        return cls.from_fields(data)


_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
# group field name -> its group (the names are unique across groups and ModelConfig's own)
_OWNER = {f.name: group for group, kind in GROUPS.items() for f in dataclasses.fields(kind)}
assert not set(_OWNER) & _FIELDS and len(_OWNER) == sum(
    len(dataclasses.fields(kind)) for kind in GROUPS.values())
# The residual topology as the flat manifests before the groups wrote it
_LEGACY_TOPOLOGY = {"post_layernorm": "post", "parallel_attn": "parallel",
                    "sandwich_norm": "sandwich"}


def _grouped(fields: dict[str, Any], base: ModelConfig | None) -> dict[str, Any]:
    """ModelConfig's keyword arguments from flat ``fields`` over ``base`` (None: the defaults)."""
    unknown = sorted(set(fields) - _FIELDS - set(_OWNER))
    if unknown:
        raise ConfigError(f"Unknown model config fields: {', '.join(unknown)}.")
    out = {k: v for k, v in fields.items() if k in _FIELDS}
    if base is not None:
        out = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)} | out
    by_group: dict[str, dict[str, Any]] = {}
    for name, value in fields.items():
        if name in _OWNER:
            by_group.setdefault(_OWNER[name], {})[name] = value
    for group, changes in by_group.items():
        current = out.get(group, GROUPS[group]())
        out[group] = dataclasses.replace(current, **changes)
    return out


def _group_from_dict(kind: type, name: str, data: dict[str, Any]) -> Any:
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        names = ", ".join(f"{name}.{u}" for u in unknown)
        raise ConfigError(f"Unknown model config fields: {names}.")
    if name == "positions" and data.get("no_rope_layers") is not None:
        data = dict(data, no_rope_layers=tuple(data["no_rope_layers"]))
    return kind(**data)


def legacy_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict in the flat form manifests were written in before the groups (every field
    at the top; ``post_layernorm``, ``parallel_attn``, ``sandwich_norm`` for the residual
    topology) as flat fields ``from_fields`` takes; any other dict unchanged."""
    legacy = {k: data.pop(k) for k in list(data) if k in _LEGACY_TOPOLOGY}
    chosen = [_LEGACY_TOPOLOGY[k] for k, on in legacy.items() if on]
    if len(chosen) > 1:
        raise ConfigError(f"Invalid model config: {' and '.join(chosen)} topologies at once.")
    if legacy:
        data["topology"] = chosen[0] if chosen else "pre"
    return data


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's attention factor when a config names none: sqrt(1 + ln(factor) / ln(original
    context)) for a context stretched by ``factor``, else 1 (transformers' default, which
    llama.cpp's converter also writes into GGUF files)."""
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))

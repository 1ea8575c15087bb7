"""ModelConfig: the architecture of one decoder, with field names taken from Hugging Face config.json.

Pure Python (no torch), so presets and the CLI's help load instantly and the runtime can read a
config from a manifest without the exporter's dependencies. How each family's config.json maps
to it lives in that family's module (llm_onnx/families/).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
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
    # Qwen3.5-MoE, Qwen3-Next: a SwiGLU expert every token takes, scaled by sigmoid(x . w) of a
    # learned (1, D) gate and added to the routed sum; None: no shared expert
    shared_expert_intermediate_size: int | None = None
    # gpt-oss: biases on the router and on every expert's projections
    bias: bool = False
    # The experts' gated activation, ONNX Runtime's SwiGLU attributes: gate clamped to at most
    # ``swiglu_limit`` and up to +-``swiglu_limit`` (None: no clamp), then
    # gate * sigmoid(swiglu_alpha * gate) * (up + swiglu_beta). Qwen3-MoE's silu(gate) * up is
    # (1, 0, None); gpt-oss's is (1.702, 1, 7).
    swiglu_alpha: float = 1.0
    swiglu_beta: float = 0.0
    swiglu_limit: float | None = None


@dataclass(frozen=True, kw_only=True)
class LinearAttentionConfig:
    """Gated DeltaNet linear attention (Qwen3.5, Qwen3.6, Qwen3-Next): a causal depthwise
    convolution over the projected q, k, v, then the gated delta rule over a (value_heads,
    key_head_dim, value_head_dim) state per row. Its memory of the past is that fixed-size state
    and the convolution's last ``conv_kernel - 1`` inputs, not a cache per position."""

    num_key_heads: int  # q and k heads; value head h reads key head h // (value / key heads)
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v side by side."""
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a decoder-only transformer; no dtype, no paths, no export options.

    Args:
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads:
            as in Hugging Face config.json.
        head_dim: explicit (Qwen3-0.6B has 128, not hidden_size // heads).
        intermediate_size: width of the dense MLP.
        hidden_act: "silu", "relu" (OPT) or a GELU variant: "gelu" (exact, erf), "gelu_new",
            "gelu_pytorch_tanh", "gelu_fast" (the tanh approximation).
        gated_mlp: down(act(gate(x)) * up(x)) (Llama's SwiGLU) or down(act(up(x))) (GPT-2, BLOOM,
            Falcon).
        qk_norm: Qwen3's per-head RMSNorm on q and k, before RoPE.
        moe: Qwen3-MoE experts; None for a dense model.
        rope_scaling: Hugging Face's dict ({"rope_type": "llama3", ...}) or None.
        position_embedding_type: "rope", "learned" (GPT-2's table of absolute positions),
            "alibi" (BLOOM's per-head linear attention bias) or "sinusoidal" (XGLM's fixed table,
            computed, not loaded).
        norm_type: "rms" (eps ``rms_norm_eps``) or "layer" (LayerNorm with bias, eps
            ``layer_norm_epsilon``).
        parallel_attn: attention and MLP both read the block's normed input and are added to the
            residual together (Falcon-7B); ``parallel_attn_shared_norm`` False gives the MLP its
            own norm (``post_attention_layernorm``) of the same input.
        sliding_window: Mistral: each query attends to its last ``sliding_window`` keys, itself
            included.
        position_offset: OPT, XGLM: the position table has this many leading rows that no
            position uses (position p reads row p + offset).
        position_padding_idx: XGLM: the row of the sinusoidal table that is zero (transformers
            zeroes row ``pad_token_id``, offset rows included, so pad_token_id 2 zeroes
            position 0's row); None: no row is zeroed.
        embedding_multiplier: XGLM, Gemma 3 (sqrt of the width): the token embeddings are scaled
            by it.
        layer_types: Gemma 3: "sliding_attention" or "full_attention" per layer; sliding layers
            attend to their last ``sliding_window`` keys and take RoPE base
            ``rope_local_theta`` (unscaled), full layers ``rope_theta`` and ``rope_scaling``.
            Qwen3.5: "linear_attention" or "full_attention" per layer.
        linear_attention: the Gated DeltaNet layers' shape (Qwen3.5, Qwen3-Next); their layers
            are those ``layer_types`` names "linear_attention".
        attention_output_gate: Qwen3.5: q_proj emits each head's query and a gate of the same
            width ([query_h | gate_h] per head); the attention's output is multiplied by
            sigmoid(gate) before o_proj.
        attention_sinks: gpt-oss: a learned logit per query head joins every softmax over the
            keys (softmax over [scores, sink], the sink's share dropped), so a head can attend
            to nothing.
        attention_scale: the attention's score scale when it is not head_dim ** -0.5 (Gemma 3:
            query_pre_attn_scalar ** -0.5).
        sandwich_norm: Gemma 3: four norms per layer, on the attention's output and on the MLP's
            output too, before each residual sum.
        final_logit_softcapping: logits = c * tanh(logits / c) (Gemma), or None.
        post_layernorm: OPT-350m (``do_layer_norm_before=False``): each sub-block's output is
            normalized after the residual sum, x = norm(x + f(x)), and there is no final norm.
        embed_dim: OPT-350m (``word_embed_proj_dim``): the embedding and LM head width when it is
            not ``hidden_size``; ``project_in`` / ``project_out`` map between the two.
        no_rope_layers: SmolLM3 (Hugging Face's name and form): per layer, 1 if its attention
            applies RoPE, 0 if it attends without positions (NoPE); None: every layer rotates.
        global_head_dim, num_global_key_value_heads: Gemma 4: the head size and KV head count
            of the full-attention layers when they differ from the sliding ones' (None: the
            same as ``head_dim``, ``num_key_value_heads``).
        attention_k_eq_v: Gemma 4: full-attention layers have no v_proj; the key projection's
            output (before k_norm and RoPE) is the value.
        value_norm: Gemma 4: values get a weightless RMSNorm over each head (``v_norm``).
        num_kv_shared_layers: Gemma 4: the last N layers compute no keys and values; each reads
            the cache of the last earlier layer of its own kind (``kv_source``), which owns the
            buffer. Their graphs have no cache inputs of their own.
        hidden_size_per_layer_input: Gemma 4 (E2B, E4B): the width of the per-layer embeddings
            (a second token table, [vocab, layers x width], plus a projection of the token
            embedding), gated into each layer after its MLP; 0: none.
        layer_scalar: Gemma 4: each layer's output is multiplied by a stored scalar
            (``model.layers.N.layer_scalar``).
        enable_moe_block: Gemma 4 (26B-A4B): ``moe``'s experts (GeGLU, ``hidden_act``) run beside
            the dense MLP, from the residual stream through their own norms; the router reads
            RMSNorm(residual) times a learned scale, and each expert's output is scaled by a
            learned factor (folded into its down_proj when loading).
        use_double_wide_mlp: Gemma 4 (E2B): the KV-shared layers' MLPs are twice as wide.
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
    position_embedding_type: str = "rope"  # "rope" | "learned" | "alibi" | "sinusoidal"
    norm_type: str = "rms"  # "rms" | "layer"
    layer_norm_epsilon: float = 1e-5  # used when norm_type == "layer"
    embedding_layernorm: bool = False  # BLOOM: LayerNorm right after the embedding
    parallel_attn: bool = False  # GPT-J / Falcon: attention and MLP read the same normed input
    parallel_attn_shared_norm: bool = True  # Falcon-7B: one norm feeds both branches
    sliding_window: int | None = None  # Mistral: attend to at most this many keys
    position_offset: int = 0  # OPT, XGLM: position p reads row p + 2 of the position table
    position_padding_idx: int | None = None  # XGLM: this row of the table is zero
    embedding_multiplier: float = 1.0  # XGLM, Gemma 3: token embeddings times sqrt(width)
    layer_types: tuple[str, ...] | None = None  # Gemma 3, Qwen3.5: the kind of each layer
    linear_attention: LinearAttentionConfig | None = None  # Qwen3.5: Gated DeltaNet layers
    attention_output_gate: bool = False  # Qwen3.5: output * sigmoid(gate from q_proj)
    attention_sinks: bool = False  # gpt-oss: a learned per-head logit in every softmax
    rope_local_theta: float | None = None  # Gemma 3: RoPE base of the sliding layers
    attention_scale: float | None = None  # None: head_dim ** -0.5
    sandwich_norm: bool = False  # Gemma 3: norms after attention and MLP as well as before
    final_logit_softcapping: float | None = None  # Gemma: c * tanh(logits / c)
    post_layernorm: bool = False  # OPT-350m: x = norm(x + f(x)), no final norm
    embed_dim: int | None = None  # OPT-350m: embedding / head width, projected to hidden_size
    no_rope_layers: tuple[int, ...] | None = None  # SmolLM3: 1 = the layer rotates, 0 = NoPE
    # Gemma 4 (see the docstring)
    global_head_dim: int | None = None  # full-attention layers' head size
    num_global_key_value_heads: int | None = None  # full-attention layers' KV heads
    attention_k_eq_v: bool = False  # full layers: the keys are the values
    value_norm: bool = False  # weightless RMSNorm on the values
    num_kv_shared_layers: int = 0  # the last N layers read an earlier layer's cache
    hidden_size_per_layer_input: int = 0  # per-layer embeddings' width (0: none)
    layer_scalar: bool = False  # each layer's output times a stored scalar
    enable_moe_block: bool = False  # experts beside the dense MLP (Gemma 4's form)
    use_double_wide_mlp: bool = False  # the KV-shared layers' MLPs twice as wide
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
        if self.position_embedding_type not in ("rope", "learned", "alibi", "sinusoidal"):
            problems.append(f"position_embedding_type must be rope, learned, alibi or "
                            f"sinusoidal, got {self.position_embedding_type!r}")
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
        if self.position_offset and self.position_embedding_type not in ("learned", "sinusoidal"):
            problems.append("position_offset needs a table of positions (learned or sinusoidal)")
        if self.position_padding_idx is not None:
            rows = self.max_position_embeddings + self.position_offset
            if self.position_embedding_type != "sinusoidal":
                problems.append("position_padding_idx needs a sinusoidal position table")
            elif (not isinstance(self.position_padding_idx, int)
                  or isinstance(self.position_padding_idx, bool)
                  or not 0 <= self.position_padding_idx < rows):
                problems.append(f"position_padding_idx must be a row of the position table "
                                f"(0 to {rows - 1}), got {self.position_padding_idx!r}")
        if self.post_layernorm and (self.parallel_attn or self.embedding_layernorm):
            problems.append("post_layernorm with parallel attention or an embedding norm is not "
                            "supported")
        if self.embed_dim is not None and (not isinstance(self.embed_dim, int) or self.embed_dim <= 0):
            problems.append(f"embed_dim must be a positive integer or None, got {self.embed_dim!r}")
        if self.layer_types is not None and (
                len(self.layer_types) != self.num_hidden_layers
                or set(self.layer_types) - set(LAYER_TYPES)):
            problems.append(f"layer_types must name {', '.join(LAYER_TYPES)} for each layer")
        elif self.layer_types is not None and "linear_attention" in self.layer_types \
                and self.linear_attention is None:
            problems.append("layer_types names linear_attention layers but linear_attention "
                            "(their shape) is not given")
        if self.no_rope_layers is not None and (
                not isinstance(self.no_rope_layers, tuple)
                or len(self.no_rope_layers) != self.num_hidden_layers
                or any(type(v) is not int or v not in (0, 1) for v in self.no_rope_layers)):
            problems.append(f"no_rope_layers must give 1 (RoPE) or 0 (no RoPE) for each of the "
                            f"{self.num_hidden_layers} layers, got {self.no_rope_layers!r}")
        elif self.no_rope_layers is not None and self.position_embedding_type != "rope":
            problems.append("no_rope_layers needs RoPE (position_embedding_type rope)")
        la = self.linear_attention
        if la is not None:
            for name in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim",
                         "conv_kernel"):
                value = getattr(la, name)
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    problems.append(f"linear_attention.{name} must be a positive integer, got "
                                    f"{value!r}")
            if not problems and la.num_value_heads % la.num_key_heads:
                problems.append(f"linear_attention.num_value_heads ({la.num_value_heads}) must be "
                                f"a multiple of num_key_heads ({la.num_key_heads})")
            if self.layer_types is None or "linear_attention" not in self.layer_types:
                problems.append("linear_attention is given but layer_types names no "
                                "linear_attention layer")
        for name in ("global_head_dim", "num_global_key_value_heads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value <= 0):
                problems.append(f"{name} must be a positive integer or None, got {value!r}")
        if not problems and self.num_global_key_value_heads is not None and \
                self.num_attention_heads % self.num_global_key_value_heads:
            problems.append("num_attention_heads must be a multiple of "
                            "num_global_key_value_heads")
        shared = self.num_kv_shared_layers
        if not isinstance(shared, int) or isinstance(shared, bool) or \
                not 0 <= shared < self.num_hidden_layers:
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
        if self.enable_moe_block and self.moe is None:
            problems.append("enable_moe_block needs moe (the experts' shape)")
        if self.moe is not None and self.moe.num_experts_per_tok > self.moe.num_experts:
            problems.append("moe.num_experts_per_tok exceeds moe.num_experts")
        if problems:
            raise ConfigError("Invalid model config: " + "; ".join(problems) + ".")

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
        return self.position_embedding_type == "rope" and (
            self.no_rope_layers is None or bool(self.no_rope_layers[layer]))

    def layer_is_local(self, layer: int) -> bool:
        """Whether ``layer`` takes the local RoPE tables (Gemma 3's sliding layers)."""
        return (self.rope_local_theta is not None and self.layer_types is not None
                and self.layer_types[layer] == "sliding_attention")

    def layer_head_dim(self, layer: int) -> int:
        """The head size of ``layer`` (Gemma 4's full-attention layers: global_head_dim)."""
        if self.global_head_dim is not None and self.layer_window(layer) is None:
            return self.global_head_dim
        return self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        """The KV head count of ``layer`` (Gemma 4's full-attention layers may have fewer)."""
        if self.num_global_key_value_heads is not None and self.layer_window(layer) is None:
            return self.num_global_key_value_heads
        return self.num_key_value_heads

    def layer_k_eq_v(self, layer: int) -> bool:
        """Whether ``layer``'s values are its keys' projection (Gemma 4's full layers)."""
        return self.attention_k_eq_v and self.layer_window(layer) is None

    def _own_kv_source(self, layer: int) -> int | None:
        first = self.num_hidden_layers - self.num_kv_shared_layers
        if layer < first:
            return layer
        kind = self.layer_types[layer] if self.layer_types else None
        for j in range(first - 1, -1, -1):
            if (self.layer_types[j] if self.layer_types else None) == kind:
                return j
        return None

    def kv_source(self, layer: int) -> int:
        """The layer whose KV cache ``layer`` attends over: itself, or for Gemma 4's last
        ``num_kv_shared_layers`` layers the last earlier layer of the same kind."""
        source = self._own_kv_source(layer)
        assert source is not None
        return source

    def is_kv_shared(self, layer: int) -> bool:
        return self.kv_source(layer) != layer

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
        wide = self.use_double_wide_mlp and self.is_kv_shared(layer)
        return self.intermediate_size * (2 if wide else 1)

    @property
    def embed_width(self) -> int:
        """Width of the token embedding and the LM head (OPT-350m's 512; else hidden_size)."""
        return self.embed_dim or self.hidden_size

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether ``layer``'s MLP is the sparse one (Gemma 4's experts beside a dense MLP are
        not: ``enable_moe_block``)."""
        moe = self.moe
        return (moe is not None and not self.enable_moe_block and layer not in moe.mlp_only_layers
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
        for name in ("layer_types", "no_rope_layers"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        if data.get("moe") is not None:
            moe = dict(data["moe"])
            moe["mlp_only_layers"] = tuple(moe.get("mlp_only_layers", ()))
            data["moe"] = MoEConfig(**moe)
        if data.get("linear_attention") is not None:
            data["linear_attention"] = LinearAttentionConfig(**data["linear_attention"])
        return cls(**data)


def longrope_attention_factor(factor: float, original: int) -> float:
    """LongRoPE's attention factor when a config names none: sqrt(1 + ln(factor) / ln(original
    context)) for a context stretched by ``factor``, else 1 (transformers' default, which
    llama.cpp's converter also writes into GGUF files)."""
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
_ACTIVATIONS = {"silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu"}

"""The parts of ModelConfig: one frozen dataclass per mechanism a family may switch on.

Each group's defaults are Llama's, so a family names only the groups it changes; the decoder
reads each group where it builds the matching part (``layer.py`` says which part reads which).
Field names are Hugging Face config.json's where one maps 1:1, and unique across the groups, so
``ModelConfig.replace(qk_norm=True)`` and a family's flat ``config_fields`` can name a field
without its group. Pure Python.

    AttentionConfig        attention variants: biases, q/k norms, output gate, sinks, score
                           scale, value norm, keys as values, Gemma 4's full-layer head shape
                           and its KV-shared layers
    MLPConfig              the dense feed-forward: gated or not, biases, Gemma 4's experts
                           beside it, its doubled width in KV-shared layers
    NormConfig             RMSNorm or LayerNorm
    ResidualConfig         the residual topology (pre-norm, post-norm, parallel, sandwich) and
                           Gemma 4's layer scalar
    PositionConfig         RoPE, learned, ALiBi or sinusoidal positions, and per-layer RoPE
    EmbeddingConfig        the token embedding's width, scale and norm; per-layer embeddings
    MoEConfig              routed experts (Qwen3-MoE, gpt-oss, Qwen3.5-MoE; Gemma 4's block)
    LinearAttentionConfig  the Gated DeltaNet layers' shape (Qwen3.5, Qwen3-Next)
"""

from __future__ import annotations

from dataclasses import dataclass

POSITION_TYPES = ("rope", "learned", "alibi", "sinusoidal")
NORM_TYPES = ("rms", "layer")
# pre: x += f(norm(x)) (Llama); post: x = norm(x + f(x)) (OPT-350m); parallel: x += attn(norm(x))
# + mlp(norm(x)) (GPT-J, Falcon); sandwich: x += norm(f(norm(x))) (Gemma)
TOPOLOGIES = ("pre", "post", "parallel", "sandwich")


def _positive(value: object, allow_none: bool = False) -> bool:
    if value is None:
        return allow_none
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """The attention's variants beyond Llama's grouped-query attention.

    Args:
        attention_bias, o_proj_bias: biases on the q/k/v projections, on o_proj.
        qk_norm: Qwen3's per-head RMSNorm on q and k, before RoPE.
        attention_scale: the score scale when it is not head_dim ** -0.5 (Gemma 3:
            query_pre_attn_scalar ** -0.5).
        attention_output_gate: Qwen3.5: q_proj emits each head's query and a gate of the same
            width ([query_h | gate_h] per head); the output is multiplied by sigmoid(gate)
            before o_proj.
        attention_sinks: gpt-oss: a learned logit per query head joins every softmax over the
            keys (its share dropped), so a head can attend to nothing.
        value_norm: Gemma 4: values get a weightless RMSNorm over each head (``v_norm``).
        attention_k_eq_v: Gemma 4: full-attention layers have no v_proj; the key projection's
            output (before k_norm and RoPE) is the value.
        global_head_dim, num_global_key_value_heads: Gemma 4: the head size and KV head count
            of the full-attention layers when they differ from the sliding ones' (None: the
            same as ``head_dim``, ``num_key_value_heads``).
        num_kv_shared_layers: Gemma 4: the last N layers compute no keys and values; each
            attends over the cache of the last earlier layer of its own kind
            (``ModelConfig.kv_source``), which owns the buffer.
    """

    attention_bias: bool = False
    o_proj_bias: bool = False
    qk_norm: bool = False
    attention_scale: float | None = None
    attention_output_gate: bool = False
    attention_sinks: bool = False
    value_norm: bool = False
    attention_k_eq_v: bool = False
    global_head_dim: int | None = None
    num_global_key_value_heads: int | None = None
    num_kv_shared_layers: int = 0

    def problems(self) -> list[str]:
        out = [f"{name} must be a positive integer or None, got {getattr(self, name)!r}"
               for name in ("global_head_dim", "num_global_key_value_heads")
               if not _positive(getattr(self, name), allow_none=True)]
        shared = self.num_kv_shared_layers
        if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
            out.append(f"num_kv_shared_layers must be a non-negative integer, got {shared!r}")
        return out


@dataclass(frozen=True, kw_only=True)
class MLPConfig:
    """The dense feed-forward.

    Args:
        gated_mlp: down(act(gate(x)) * up(x)) (Llama's SwiGLU) or down(act(up(x))) (GPT-2,
            BLOOM, Falcon).
        mlp_bias: biases on its projections.
        enable_moe_block: Gemma 4 (26B-A4B): ``moe``'s experts (GeGLU, ``hidden_act``) run beside
            the dense MLP, from the residual stream through their own norms; the router reads
            RMSNorm(residual) times a learned scale, and each expert's output is scaled by a
            learned factor (folded into its down_proj when loading).
        use_double_wide_mlp: Gemma 4 (E2B): the KV-shared layers' MLPs are twice as wide.
    """

    gated_mlp: bool = True
    mlp_bias: bool = False
    enable_moe_block: bool = False
    use_double_wide_mlp: bool = False

    def problems(self) -> list[str]:
        return []


@dataclass(frozen=True, kw_only=True)
class NormConfig:
    """Which norm the layers use: "rms" (eps ``ModelConfig.rms_norm_eps``) or "layer"
    (LayerNorm with bias, eps ``layer_norm_epsilon``)."""

    norm_type: str = "rms"
    layer_norm_epsilon: float = 1e-5

    def problems(self) -> list[str]:
        if self.norm_type not in NORM_TYPES:
            return [f"norm_type must be 'rms' or 'layer', got {self.norm_type!r}"]
        return []


@dataclass(frozen=True, kw_only=True)
class ResidualConfig:
    """How each layer adds its attention and feed-forward to the residual stream.

    Args:
        topology: "pre" (Llama: x += f(norm(x))), "post" (OPT-350m, ``do_layer_norm_before``
            false: x = norm(x + f(x)) and no final norm), "parallel" (GPT-J, Falcon: attention
            and MLP read the same normed input and are added together) or "sandwich" (Gemma:
            four norms per layer, on each sub-block's output too).
        parallel_attn_shared_norm: "parallel": one norm feeds both branches (Falcon-7B); False
            gives the MLP its own norm (``post_attention_layernorm``) of the same input.
        layer_scalar: Gemma 4: each layer's output is multiplied by a stored scalar
            (``model.layers.N.layer_scalar``).
    """

    topology: str = "pre"
    parallel_attn_shared_norm: bool = True
    layer_scalar: bool = False

    def problems(self) -> list[str]:
        if self.topology not in TOPOLOGIES:
            return [f"topology must be one of {', '.join(TOPOLOGIES)}, got {self.topology!r}"]
        return []


@dataclass(frozen=True, kw_only=True)
class PositionConfig:
    """How positions enter the model.

    Args:
        position_embedding_type: "rope", "learned" (GPT-2's table of absolute positions),
            "alibi" (BLOOM's per-head linear attention bias) or "sinusoidal" (XGLM's fixed
            table, computed, not loaded).
        position_offset: OPT, XGLM: the position table has this many leading rows that no
            position uses (position p reads row p + offset).
        position_padding_idx: XGLM: the row of the sinusoidal table that is zero (transformers
            zeroes row ``pad_token_id``, offset rows included); None: no row is zeroed.
        rope_local_theta: Gemma 3, Gemma 4: the RoPE base of the sliding layers (unscaled).
        no_rope_layers: SmolLM3 (Hugging Face's name and form): per layer, 1 if its attention
            applies RoPE, 0 if it attends without positions (NoPE); None: every layer rotates.
    """

    position_embedding_type: str = "rope"
    position_offset: int = 0
    position_padding_idx: int | None = None
    rope_local_theta: float | None = None
    no_rope_layers: tuple[int, ...] | None = None

    def problems(self) -> list[str]:
        out = []
        kind = self.position_embedding_type
        if kind not in POSITION_TYPES:
            out.append(f"position_embedding_type must be rope, learned, alibi or sinusoidal, "
                       f"got {kind!r}")
        if self.position_offset and kind not in ("learned", "sinusoidal"):
            out.append("position_offset needs a table of positions (learned or sinusoidal)")
        if self.position_padding_idx is not None and kind != "sinusoidal":
            out.append("position_padding_idx needs a sinusoidal position table")
        if self.no_rope_layers is not None and kind != "rope" and isinstance(
                self.no_rope_layers, tuple):
            out.append("no_rope_layers needs RoPE (position_embedding_type rope)")
        return out


@dataclass(frozen=True, kw_only=True)
class EmbeddingConfig:
    """The token embedding.

    Args:
        embed_dim: OPT-350m (``word_embed_proj_dim``): the embedding and LM head width when it
            is not ``hidden_size``; ``project_in`` / ``project_out`` map between the two.
        embedding_multiplier: XGLM, Gemma (sqrt of the width): the token embeddings are scaled
            by it.
        embedding_layernorm: BLOOM: a norm right after the embedding.
        hidden_size_per_layer_input: Gemma 4 (E2B, E4B): the width of the per-layer embeddings
            (a second token table, [vocab, layers x width], plus a projection of the token
            embedding), gated into each layer after its MLP; 0: none.
    """

    embed_dim: int | None = None
    embedding_multiplier: float = 1.0
    embedding_layernorm: bool = False
    hidden_size_per_layer_input: int = 0

    def problems(self) -> list[str]:
        out = []
        if not _positive(self.embed_dim, allow_none=True):
            out.append(f"embed_dim must be a positive integer or None, got {self.embed_dim!r}")
        width = self.hidden_size_per_layer_input
        if not isinstance(width, int) or isinstance(width, bool) or width < 0:
            out.append(f"hidden_size_per_layer_input must be a non-negative integer, got "
                       f"{width!r}")
        return out


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

    def problems(self) -> list[str]:
        if self.num_experts_per_tok > self.num_experts:
            return ["moe.num_experts_per_tok exceeds moe.num_experts"]
        return []


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

    def problems(self) -> list[str]:
        out = [f"linear_attention.{name} must be a positive integer, got {getattr(self, name)!r}"
               for name in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim",
                            "conv_kernel") if not _positive(getattr(self, name))]
        if not out and self.num_value_heads % self.num_key_heads:
            out.append(f"linear_attention.num_value_heads ({self.num_value_heads}) must be a "
                       f"multiple of num_key_heads ({self.num_key_heads})")
        return out


# The groups whose fields may be named without their group (ModelConfig.replace, from_fields);
# moe and linear_attention are given whole (None: no such layers).
GROUPS: dict[str, type] = {"attention": AttentionConfig, "mlp": MLPConfig, "norm": NormConfig,
                           "residual": ResidualConfig, "positions": PositionConfig,
                           "embedding": EmbeddingConfig}

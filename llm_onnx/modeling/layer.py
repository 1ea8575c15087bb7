"""One decoder layer: a residual topology around a token mixer and a feed-forward, all three
chosen once, when the layer is built (``make_layer``), from the config:

    token mixer   MIXERS, by ``mixer_kind``: attention over the layer's own KV cache
                  (attention.Attention), attention over an earlier layer's cache (Gemma 4's
                  KV-shared layers: attention.SharedKVAttention), or Gated DeltaNet linear
                  attention over a recurrent state (Qwen3.5, Qwen3-Next:
                  linear_attention.GatedDeltaNet). A Mamba2 or short-convolution mixer is one
                  more module with the same call and one more row here.
    feed-forward  ``make_feed_forward``: a dense MLP (plain, gated, packed: mlp.make_mlp) or
                  routed experts (with or without a shared expert: mlp.make_moe). Gemma 4's
                  dense MLP with experts beside it (``mlp.enable_moe_block``) is the sandwich
                  layer's ``dense_plus_experts``: its router, experts and norms sit on the layer
                  itself, as Hugging Face names them.
    topology      TOPOLOGIES, by ``residual.topology``: PreNormLayer (Llama), PostNormLayer
                  (OPT-350m), ParallelLayer (GPT-J, Falcon), SandwichLayer (Gemma; Gemma 4's
                  per-layer input and layer scalar are steps after its feed-forward).

Every mixer is called the same way, ``mixer(x, inputs, past_a, past_b, reuse)`` ->
``(out, present_a, present_b)``: (past_a, past_b) is an attention layer's KV cache or a
linear-attention layer's (conv, recurrent) states; ``reuse`` a KV-shared layer's source keys
and values.

A layer advances the residual stream lazily: it takes and returns (branch, residual), the
fp32 stream and what the layer before it adds to it (None at first), so the next norm fuses the
sum (SkipSimplifiedLayerNormalization). Module attributes keep Hugging Face's names
(``self_attn``, ``mlp``, ``post_attention_layernorm``, ...), so checkpoints load by name and
ONNX initializers read ``model.layers.N.self_attn.q_proj.weight``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from llm_onnx.modeling.attention import Attention, SharedKVAttention, attention_spec
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.layers import Fusion, Linear, MixerInputs, make_norm
from llm_onnx.modeling.linear_attention import GatedDeltaNet
from llm_onnx.modeling.mlp import _ACT, GeGLUExperts, Gemma4Router, make_mlp, make_moe

# ----------------------------------------------------------------------------- the parts

MixerFactory = Callable[[ModelConfig, int, torch.dtype, Fusion, bool], nn.Module]


def _attention(cfg: ModelConfig, i: int, dtype: torch.dtype, fusion: Fusion,
               kv_int8: bool) -> nn.Module:
    return Attention(attention_spec(cfg, i, fusion, kv_int8), cfg.hidden_size, dtype)


def _shared_kv_attention(cfg: ModelConfig, i: int, dtype: torch.dtype, fusion: Fusion,
                         kv_int8: bool) -> nn.Module:
    return SharedKVAttention(attention_spec(cfg, i, fusion, kv_int8), cfg.hidden_size, dtype)


def _gated_delta_net(cfg: ModelConfig, i: int, dtype: torch.dtype, fusion: Fusion,
                     kv_int8: bool) -> nn.Module:
    return GatedDeltaNet(cfg, dtype)


# mixer kind -> (its attribute on the layer, its factory)
MIXERS: dict[str, tuple[str, MixerFactory]] = {
    "attention": ("self_attn", _attention),
    "shared_kv_attention": ("self_attn", _shared_kv_attention),
    "gated_delta_net": ("linear_attn", _gated_delta_net),
}


def mixer_kind(cfg: ModelConfig, i: int) -> str:
    """Layer ``i``'s token mixer (a key of MIXERS)."""
    if cfg.is_linear_layer(i):
        return "gated_delta_net"
    return "shared_kv_attention" if cfg.is_kv_shared(i) else "attention"


def make_feed_forward(cfg: ModelConfig, i: int, dtype: torch.dtype, fusion: Fusion) -> nn.Module:
    """Layer ``i``'s feed-forward (``mlp``): routed experts where ``cfg.is_moe_layer``, else the
    dense MLP at the layer's width."""
    if cfg.is_moe_layer(i):
        return make_moe(cfg, dtype, fusion.gate_up)
    return make_mlp(cfg, dtype, fusion.gate_up, cfg.layer_intermediate(i))


# ----------------------------------------------------------------------------- the layers

Stream = tuple[Tensor | None, Tensor, Tensor, Tensor]  # (branch, residual, present a, present b)


class DecoderLayer(nn.Module):
    """A residual topology (the subclasses' ``forward``) around a token mixer and a
    feed-forward. Subclasses add the norms their topology needs (``add_norms``), in the order
    Hugging Face's checkpoints list them."""

    final_norm = True  # whether the stack ends in a norm after the last layer

    def __init__(self, cfg: ModelConfig, index: int, dtype: torch.dtype, fusion: Fusion,
                 kv_int8: bool = False) -> None:
        super().__init__()
        self.dtype = dtype
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.mixer_kind = mixer_kind(cfg, index)
        self.mixer_name, build = MIXERS[self.mixer_kind]
        self.add_module(self.mixer_name, build(cfg, index, dtype, fusion, kv_int8))
        self.add_norms(cfg)
        self.mlp = make_feed_forward(cfg, index, dtype, fusion)

    def add_norms(self, cfg: ModelConfig) -> None:
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)

    @property
    def mixer(self) -> nn.Module:
        return self._modules[self.mixer_name]  # type: ignore[return-value]

    @property
    def linear(self) -> bool:
        """Whether the mixer is linear attention (states, not a KV cache)."""
        return self.mixer_kind == "gated_delta_net"

    @property
    def new_kv(self) -> tuple[Tensor | None, Tensor | None]:
        """The new keys and values the last forward's attention handed its kernel (what Gemma
        4's KV-shared layers reuse)."""
        return self.self_attn.new_kv  # type: ignore[return-value]

    def norm_in(self, branch: Tensor | None, residual: Tensor) -> tuple[Tensor, Tensor]:
        """input_layernorm over the stream, adding the branch first (None: nothing to add)."""
        if branch is None:
            return self.input_layernorm(residual), residual
        return self.input_layernorm.add(branch.float(), residual)

    def forward(self, branch: Tensor | None, residual: Tensor, inputs: MixerInputs,
                past_key: Tensor, past_value: Tensor, reuse: tuple[Tensor, Tensor] | None = None,
                per_layer: Tensor | None = None) -> Stream:
        """branch: what the previous layer adds to the residual stream (None: nothing);
        residual: the fp32 stream; reuse: a KV-shared layer's source keys and values (Gemma 4);
        per_layer: this layer's per-layer input (B, T, P) (Gemma 4). Returns (branch, residual,
        the mixer's two presents)."""
        raise NotImplementedError


class PreNormLayer(DecoderLayer):
    """Llama: x += attn(norm(x)); x += mlp(norm(x))."""

    def forward(self, branch, residual, inputs, past_key, past_value, reuse=None,
                per_layer=None) -> Stream:
        h, residual = self.norm_in(branch, residual)
        attn, pk, pv = self.mixer(h.to(self.dtype), inputs, past_key, past_value, reuse)
        h, residual = self.post_attention_layernorm.add(attn.float(), residual)
        return self.mlp(h.to(self.dtype)), residual, pk, pv


class PostNormLayer(DecoderLayer):
    """OPT-350m: x = norm(x + attn(x)); x = norm(x + mlp(x)); the stack has no final norm."""

    final_norm = False

    def forward(self, branch, residual, inputs, past_key, past_value, reuse=None,
                per_layer=None) -> Stream:
        if branch is not None:  # layer 0: the position embeddings
            residual = residual + branch.float()
        attn, pk, pv = self.mixer(residual.to(self.dtype), inputs, past_key, past_value, reuse)
        h, _ = self.input_layernorm.add(attn.float(), residual)
        out, _ = self.post_attention_layernorm.add(self.mlp(h.to(self.dtype)).float(), h)
        return None, out, pk, pv


class ParallelLayer(DecoderLayer):
    """GPT-J, Falcon-7B: x + attn(norm(x)) + mlp(norm(x)), one norm feeding both."""

    def add_norms(self, cfg: ModelConfig) -> None:
        pass

    def mlp_input(self, h: Tensor, residual: Tensor) -> Tensor:
        return h

    def forward(self, branch, residual, inputs, past_key, past_value, reuse=None,
                per_layer=None) -> Stream:
        h, residual = self.norm_in(branch, residual)
        attn, pk, pv = self.mixer(h.to(self.dtype), inputs, past_key, past_value, reuse)
        h = self.mlp_input(h, residual)
        return attn.float() + self.mlp(h.to(self.dtype)).float(), residual, pk, pv


class ParallelTwoNormLayer(ParallelLayer):
    """Parallel, the MLP with a norm of its own (post_attention_layernorm) of the same input."""

    def add_norms(self, cfg: ModelConfig) -> None:
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)

    def mlp_input(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.post_attention_layernorm(residual)


AfterStep = Callable[["SandwichLayer", Tensor, Tensor, Tensor | None], tuple[Tensor, Tensor]]


class SandwichLayer(DecoderLayer):
    """Gemma: x += norm(attn(norm(x))); x += norm(ffn(norm(x))), four norms per layer.

    Gemma 4 adds, each only where its config asks: experts beside the dense MLP
    (``dense_plus_experts``), then the per-layer input as a third residual sub-block and the
    layer scalar (the ``after`` steps)."""

    def __init__(self, cfg: ModelConfig, index: int, dtype: torch.dtype, fusion: Fusion,
                 kv_int8: bool = False) -> None:
        super().__init__(cfg, index, dtype, fusion, kv_int8)
        self.feed_forward = _dense
        if cfg.mlp.enable_moe_block:  # Gemma 4: experts beside the dense MLP, each branch normed
            moe = cfg.moe
            assert moe is not None
            self.router = Gemma4Router(cfg, dtype)
            self.experts = GeGLUExperts(moe.num_experts, cfg.hidden_size,
                                        moe.moe_intermediate_size, dtype)
            self.pre_feedforward_layernorm_2 = make_norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm_1 = make_norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm_2 = make_norm(cfg, cfg.hidden_size)
            self.feed_forward = _dense_plus_experts
        after: list[AfterStep] = []
        width = cfg.embedding.hidden_size_per_layer_input
        if width:  # Gemma 4: the per-layer embedding, gated in after the feed-forward
            self.per_layer_input_gate = Linear(cfg.hidden_size, width, False, dtype)
            self.per_layer_projection = Linear(width, cfg.hidden_size, False, dtype)
            self.post_per_layer_input_norm = make_norm(cfg, cfg.hidden_size)
            self.act = _ACT[cfg.hidden_act]
            after.append(_add_per_layer_input)
        if cfg.residual.layer_scalar:  # Gemma 4: the layer's output times a stored scalar
            self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)
            after.append(_scale)
        self.after = tuple(after)

    def add_norms(self, cfg: ModelConfig) -> None:
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
        self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
        self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)

    def forward(self, branch, residual, inputs, past_key, past_value, reuse=None,
                per_layer=None) -> Stream:
        h, residual = self.norm_in(branch, residual)
        attn, pk, pv = self.mixer(h.to(self.dtype), inputs, past_key, past_value, reuse)
        h, residual = self.pre_feedforward_layernorm.add(
            self.post_attention_layernorm(attn.float()), residual)
        branch = self.post_feedforward_layernorm(self.feed_forward(self, h, residual))
        for step in self.after:
            branch, residual = step(self, branch, residual, per_layer)
        return branch, residual, pk, pv


def _dense(self: SandwichLayer, h: Tensor, residual: Tensor) -> Tensor:
    return self.mlp(h.to(self.dtype)).float()


def _dense_plus_experts(self: SandwichLayer, h: Tensor, residual: Tensor) -> Tensor:
    """Gemma 4's MoE block: norm(mlp(h)) + norm(experts(norm(x))), the experts routed from the
    residual stream x itself."""
    out = self.post_feedforward_layernorm_1(self.mlp(h.to(self.dtype)).float())
    b, t, d = residual.shape
    flat = residual.reshape(b * t, d)  # (N, D) fp32
    index, weight = self.router(flat)
    routed = self.experts(self.pre_feedforward_layernorm_2(flat).to(self.dtype), index,
                          weight).float()
    return out + self.post_feedforward_layernorm_2(routed.reshape(b, t, d))


def _add_per_layer_input(self: SandwichLayer, branch: Tensor, residual: Tensor,
                         per_layer: Tensor | None) -> tuple[Tensor, Tensor]:
    """Gemma 4: x += norm(proj(act(gate(x)) * per_layer_input))."""
    assert per_layer is not None
    residual = residual + branch
    gated = self.act(self.per_layer_input_gate(residual.to(self.dtype))) \
        * per_layer.to(self.dtype)
    return self.post_per_layer_input_norm(self.per_layer_projection(gated).float()), residual


def _scale(self: SandwichLayer, branch: Tensor, residual: Tensor,
           per_layer: Tensor | None) -> tuple[Tensor, Tensor]:
    """Gemma 4: (residual + branch) * layer_scalar."""
    return branch * self.layer_scalar, residual * self.layer_scalar


def _parallel(cfg: ModelConfig) -> type[DecoderLayer]:
    return ParallelLayer if cfg.residual.parallel_attn_shared_norm else ParallelTwoNormLayer


# residual.topology -> the layer class (a function of the config where a topology has forms)
TOPOLOGIES: dict[str, Callable[[ModelConfig], type[DecoderLayer]]] = {
    "pre": lambda cfg: PreNormLayer,
    "post": lambda cfg: PostNormLayer,
    "parallel": _parallel,
    "sandwich": lambda cfg: SandwichLayer,
}


def layer_class(cfg: ModelConfig) -> type[DecoderLayer]:
    """The DecoderLayer subclass of ``cfg``'s residual topology."""
    return TOPOLOGIES[cfg.residual.topology](cfg)


def make_layer(cfg: ModelConfig, index: int, dtype: torch.dtype, fusion: Fusion,
               kv_int8: bool = False) -> DecoderLayer:
    """Layer ``index`` of ``cfg``: its topology's class around its mixer and feed-forward."""
    return layer_class(cfg)(cfg, index, dtype, fusion, kv_int8)

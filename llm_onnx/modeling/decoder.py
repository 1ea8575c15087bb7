"""The decoder: the stack every supported family (llm_onnx/families/) is built as.

This module is the stack: the token embedding and what comes with it (learned, sinusoidal or
ALiBi positions, the RoPE tables, BLOOM's embedding norm, OPT-350m's projections, Gemma 4's
per-layer embeddings), the layers, the final norm and the LM head. Each layer is assembled in
layer.py from parts chosen once, from the config, when it is built: a residual topology
(pre-norm, post-norm, parallel, sandwich) around a token mixer (attention, KV-shared
attention, Gated DeltaNet) and a feed-forward (dense MLP, routed experts, Gemma 4's dense MLP
with experts beside it). The parts live beside it:

    layer.py      DecoderLayer and its topologies; MIXERS and make_feed_forward choose the parts
    attention.py  Attention, SharedKVAttention (AttentionSpec), and attention_form (which form
                  ONNX Runtime runs for a config)
    linear_attention.py  GatedDeltaNet, the linear-attention mixer of Qwen3.5 and Qwen3-Next
    mlp.py        the dense MLPs, the routed experts (with a shared expert), Gemma 4's router and
                  GeGLU experts
    layers.py     Linear, RMSNorm, LayerNorm; Fusion and MixerInputs
    positions.py  the computed position tables (RoPE's caches, XGLM's sinusoidal table)

The model is a pure function

    forward(input_ids, seqlens_k, total_sequence_length, past) -> (logits, *present)

with no cache buffers of its own, so prefill and decode are the same code traced with different
shapes. ``past`` is [key_0, value_0, key_1, value_1, ...], each (B, Hkv, P, D) (see ops.py for the
position conventions); a linear-attention layer's pair is its conv state (B, K-1, C) and its
recurrent state (B, Hv, dk, dv) instead, which ``valid_tokens`` (B,) says how far to advance.
Module attributes copy Hugging Face's names, so checkpoints load by name and ONNX initializers
read ``model.layers.0.self_attn.q_proj...``.

A decoder built with a ``vision`` config (a tower beside it: Qwen3-VL, Qwen3.5, Gemma 3 and 4)
also takes keyword inputs: the image embeddings to place, ``position_ids`` (3, B, T) for Qwen's
multimodal RoPE, ``attend_until`` (B, T) where Gemma's image tokens see each other both ways
(multimodal.py); without them it runs text with positions from ``seqlens_k``.

Precision: the residual stream, norms, router softmax and logits stay fp32; projections and
attention run in ``dtype`` (fp32 or fp16). With fp32 every cast below is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from llm_onnx.modeling import ops
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig, bidirectional_layers
from llm_onnx.modeling.layer import layer_class, make_layer
from llm_onnx.modeling.layers import Fusion, Linear, MixerInputs, make_norm
from llm_onnx.modeling.linear_attention import state_shapes
from llm_onnx.modeling.multimodal import ImageInputs, image_attend_until, mrope_tables
from llm_onnx.modeling.positions import RotaryCache, SinusoidalPositions, global_rope, local_rope

__all__ = ["Decoder", "DecoderModel", "Fusion", "LayerInputs", "owned_states"]


def owned_states(cfg: ModelConfig, present):
    """``present`` (two per layer, every layer) less Gemma 4's KV-shared layers' pairs: what the
    next step takes as its past (works on lists of tensors or of numpy arrays)."""
    if not cfg.shares_kv:
        return list(present)
    return [t for i in range(cfg.num_hidden_layers) if not cfg.is_kv_shared(i)
            for t in present[2 * i:2 * i + 2]]


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, fusion: Fusion,
                 max_positions: int, kv_int8: bool = False,
                 plain_layers: tuple[int, ...] = ()) -> None:
        super().__init__()
        pos, emb = cfg.positions, cfg.embedding
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.embed_width, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        if emb.embed_dim is not None:  # OPT-350m: embeddings narrower than the layers
            self.project_in = Linear(emb.embed_dim, cfg.hidden_size, False, dtype)
            self.project_out = Linear(cfg.hidden_size, emb.embed_dim, False, dtype)
        if pos.position_embedding_type == "rope":  # (Gemma 4: at its full layers' head size)
            self.rotary = RotaryCache(global_rope(cfg), max_positions, dtype)
            if pos.rope_local_theta is not None:  # Gemma 3's sliding layers
                self.rotary_local = RotaryCache(local_rope(cfg), max_positions, dtype)
        if pos.position_embedding_type == "learned":  # GPT-2, OPT: a table of absolute positions
            self.embed_positions = nn.Embedding(cfg.max_position_embeddings + pos.position_offset,
                                                cfg.hidden_size, dtype=torch.float32)
            self.embed_positions.weight.requires_grad_(False)
        if pos.position_embedding_type == "sinusoidal":  # XGLM
            self.embed_positions = SinusoidalPositions(
                cfg.max_position_embeddings + pos.position_offset, cfg.hidden_size,
                pos.position_padding_idx)
        if emb.embedding_layernorm:  # BLOOM
            self.embed_layernorm = make_norm(cfg, cfg.hidden_size)
        if emb.hidden_size_per_layer_input:  # Gemma 4: per-layer embeddings, one packed table
            width = cfg.num_hidden_layers * emb.hidden_size_per_layer_input
            self.embed_tokens_per_layer = nn.Embedding(cfg.vocab_size, width, dtype=dtype)
            self.embed_tokens_per_layer.weight.requires_grad_(False)
            self.per_layer_model_projection = Linear(cfg.hidden_size, width, False, dtype)
            self.per_layer_projection_norm = make_norm(cfg, emb.hidden_size_per_layer_input)
        plain = replace(fusion, plain_attention=True)  # plain_layers: attention in plain ops
        self.layers = nn.ModuleList(
            make_layer(cfg, i, dtype, plain if i in plain_layers else fusion, kv_int8)
            for i in range(cfg.num_hidden_layers))
        if layer_class(cfg).final_norm:  # (post-norm layers end normalized)
            self.norm = make_norm(cfg, cfg.hidden_size)


@dataclass
class LayerInputs:
    """What flows into the layers: the branch the previous layer adds to the residual stream
    (None at first, or the position embeddings), the fp32 residual stream, the positions, each
    row's last index, the RoPE tables (global, local; None without RoPE), ALiBi's bias and the
    tokens each row really runs (linear-attention layers advance their state over those only)."""

    branch: Tensor | None
    residual: Tensor
    positions: Tensor
    last: Tensor
    rope: tuple[Tensor | None, Tensor | None]
    local: tuple[Tensor | None, Tensor | None]
    bias: Tensor | None
    valid: Tensor | None = None
    per_layer: Tensor | None = None  # Gemma 4: (B, T, layers, P) per-layer inputs
    images: ImageInputs | None = None  # a decoder with a vision tower: DeepStack's features


class Decoder(nn.Module):
    """A decoder-only causal LM (see the module docstring for the forward contract)."""

    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype = torch.float32,
                 fusion: Fusion | None = None, max_positions: int | None = None,
                 head: bool = True, kv_int8: bool = False,
                 vision: AnyVisionConfig | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.fusion = fusion or Fusion()
        # a vision tower beside it. Qwen: multimodal RoPE turns each token by three positions,
        # so RoPE runs as its own op over per-token tables (multimodal.py). Gemma: the layers
        # where an image's tokens see each other both ways run plain attention, the one
        # kernel that lets a token see later keys (attend_until)
        self.vision = vision
        self.bidirectional: tuple[int, ...] = ()
        if vision is not None:
            vision.check_decoder(cfg.hidden_size, cfg.rotary_dim, cfg.num_hidden_layers)
            if vision.mrope_section:
                self.fusion = replace(self.fusion, rotary=False)
            self.bidirectional = bidirectional_layers(vision, cfg)
        self.max_positions = max_positions or cfg.max_position_embeddings
        # kv_int8: attention layers keep keys and values in int8 with per-channel scales
        # (their k_scale/v_scale), as GroupQueryAttention's quantized cache does
        self.kv_int8 = kv_int8
        self.model = DecoderModel(cfg, dtype, self.fusion, self.max_positions, kv_int8,
                                  self.bidirectional)
        if head:  # (an embedding model has none: EmbeddingDecoder)
            self.lm_head = Linear(cfg.embed_width, cfg.vocab_size, False, dtype)
            if cfg.tie_word_embeddings:
                self.lm_head.weight = self.model.embed_tokens.weight
        self.alibi_slopes = (ops.alibi_slopes(cfg.num_attention_heads)
                             if cfg.positions.position_embedding_type == "alibi" else [])

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV buffers' dtype: int8 with kv_int8, else the compute dtype."""
        return torch.int8 if self.kv_int8 else self.dtype

    def embed(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
              valid_tokens: Tensor | None = None,
              images: ImageInputs | None = None) -> LayerInputs:
        """Everything before the layers: the residual stream and what every layer takes."""
        cfg, m = self.config, self.model
        pos, emb = cfg.positions, cfg.embedding
        positions, last = ops.device_positions(input_ids, seqlens_k)
        rope = local = (None, None)
        vision = self.vision
        if images is not None and vision is not None and vision.image_pad_token_id is not None:
            # Gemma: the text embeddings read the pad id at image positions (Gemma 4's
            # per-layer table keeps that row; the token embeddings are replaced below)
            input_ids = torch.where(input_ids == vision.image_token_id,
                                    vision.image_pad_token_id, input_ids)
        if pos.position_embedding_type == "rope":
            rope = (m.rotary.cos_cache, m.rotary.sin_cache)
            if pos.rope_local_theta is not None:
                local = (m.rotary_local.cos_cache, m.rotary_local.sin_cache)
        residual = m.embed_tokens(input_ids).float()  # (B, T, D) fp32 residual stream
        if emb.embedding_multiplier != 1.0:  # XGLM: sqrt(d_model)
            residual = residual * emb.embedding_multiplier
        if images is not None:  # a vision tower beside it (multimodal.py)
            assert vision is not None
            residual = images.place(residual)
            if vision.mrope_section:  # Qwen
                assert images.position_ids is not None
                cos, sin, positions = mrope_tables(*rope, images.position_ids,  # type: ignore
                                                   vision.mrope_section)
                rope = (cos, sin)
        if emb.embed_dim is not None:  # OPT-350m
            residual = m.project_in(residual.to(self.dtype)).float()
        branch: Tensor | None = None
        if pos.position_embedding_type in ("learned", "sinusoidal"):  # added by layer 0
            branch = m.embed_positions(positions + pos.position_offset if pos.position_offset
                                       else positions)
        if emb.embedding_layernorm:  # BLOOM
            residual = m.embed_layernorm(residual)
        bias = None
        if pos.position_embedding_type == "alibi":  # BLOOM: one bias for all layers
            bias = ops.alibi_bias(input_ids, total_sequence_length, self.alibi_slopes).to(self.dtype)
        valid = None
        if cfg.linear_attention is not None:  # default: up to each row's last new token
            valid = (last + 1).to(torch.int32) if valid_tokens is None else valid_tokens
        per_layer = None
        if emb.hidden_size_per_layer_input:  # Gemma 4
            per_layer = self.per_layer_inputs(input_ids, residual)
        return LayerInputs(branch, residual, positions, last, rope, local, bias, valid, per_layer,
                           images)

    def per_layer_inputs(self, input_ids: Tensor, embedded: Tensor) -> Tensor:
        """Gemma 4's per-layer inputs (B, T, layers, P), fp32: (RMSNorm(the scaled token
        embedding projected, / sqrt(D)) + the per-layer table's row * sqrt(P)) / sqrt(2)."""
        cfg, m = self.config, self.model
        b, t = input_ids.shape
        p = cfg.embedding.hidden_size_per_layer_input
        table = m.embed_tokens_per_layer(input_ids).float() * p ** 0.5
        proj = m.per_layer_model_projection(embedded.to(self.dtype)).float() \
            * cfg.hidden_size ** -0.5
        proj = m.per_layer_projection_norm(proj.reshape(b, t, cfg.num_hidden_layers, p))
        return (proj + table.reshape(b, t, cfg.num_hidden_layers, p)) * 2 ** -0.5

    def run_layer(self, i: int, x: LayerInputs, seqlens_k: Tensor, total_sequence_length: Tensor,
                  past_key: Tensor, past_value: Tensor,
                  reuse: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Layer ``i`` on ``x``, which it advances (branch, residual); returns its present KV.
        A KV-shared layer (Gemma 4) takes its source's present cache as ``past_key``/
        ``past_value`` and the source's new keys and values as ``reuse``."""
        cos, sin = x.local if self.config.layer_is_local(i) else x.rope
        per_layer = x.per_layer[:, :, i] if x.per_layer is not None else None
        attend = x.images.attend_until if x.images is not None and i in self.bidirectional \
            else None  # Gemma: an image's tokens see the whole image
        inputs = MixerInputs(seqlens_k, total_sequence_length, x.positions, cos, sin, x.bias,
                             x.valid, attend)
        x.branch, x.residual, pk, pv = self.model.layers[i](
            x.branch, x.residual, inputs, past_key, past_value, reuse, per_layer)
        return pk, pv

    def forward(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
                *past: Tensor, last_only: bool = False, logits_window: Tensor | None = None,
                valid_tokens: Tensor | None = None, position_ids: Tensor | None = None,
                image_embeds: Tensor | None = None, image_token_index: Tensor | None = None,
                deepstack_embeds: Tensor | None = None,
                attend_until: Tensor | None = None) -> tuple[Tensor, ...]:
        """Logits (B, T, V) fp32 (or (B, 1, V) at each row's last new token when ``last_only``)
        and the updated caches, two per layer in layer order (``past`` less Gemma 4's KV-shared
        layers, whose presents are their source's buffer again: ``next_cache``).

        ``logits_window`` (with ``last_only``): a (W,) tensor whose length alone counts: the
        logits of each row's last W new tokens, (B, W, V) (a speculative verify step reads the
        k + 1 it ran; W = 1 is ``last_only``).

        ``valid_tokens`` (B,) int32 (models with linear-attention layers): how many of its T new
        tokens each row really runs; the others (padding, a row riding along in a batched
        step) leave its states as they were. Default: up to each row's last new token.

        ``position_ids`` (3, B, T), ``image_embeds`` (M, D), ``image_token_index`` (M,),
        ``deepstack_embeds`` (K, M, D), ``attend_until`` (B, T): a decoder with a vision tower
        (multimodal.py); by default text at the positions ``seqlens_k`` gives, no images."""
        cfg, m = self.config, self.model
        images = self.image_inputs(input_ids, seqlens_k, total_sequence_length, position_ids,
                                   image_embeds, image_token_index, deepstack_embeds,
                                   attend_until)
        h, last, present = self.hidden_states(input_ids, seqlens_k, total_sequence_length, *past,
                                              valid_tokens=valid_tokens, images=images)
        if last_only and logits_window is not None:  # each row's last W new tokens
            # W on the device from the values (as ops.device_positions does for T): a host value
            # in device arithmetic would make ONNX Runtime copy it over, ruling out CUDA graphs.
            w = torch.arange(logits_window.shape[0], device=h.device, dtype=torch.int64)
            count = (logits_window * 0 + 1).sum()
            index = (last[:, None] + 1 - count + w[None, :]).clamp_min(0)
            h = h.gather(1, index[:, :, None].expand(-1, -1, h.shape[-1]))  # (B, W, D)
        elif last_only:  # row b's last new token (clamped for padded decode rows)
            h = h.gather(1, last[:, None, None].expand(-1, 1, h.shape[-1]))  # (B, 1, D)
        if cfg.embedding.embed_dim is not None:
            h = m.project_out(h.to(self.dtype))
        logits = self.lm_head(h.to(self.dtype)).float()  # type: ignore[operator]
        if cfg.final_logit_softcapping is not None:  # Gemma
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return (logits, *present)

    def image_inputs(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
                     position_ids: Tensor | None, image_embeds: Tensor | None,
                     image_token_index: Tensor | None, deepstack_embeds: Tensor | None,
                     attend_until: Tensor | None = None) -> ImageInputs | None:
        """The image inputs of a decoder with a vision tower (None without one); left out,
        text at the positions ``seqlens_k`` gives each row (as a decoder without images),
        and Gemma's ``attend_until`` from the image ids in ``input_ids``."""
        vision = self.vision
        if vision is None:
            return None
        if position_ids is None and vision.mrope_section:  # (Gemma: plain 1-D positions)
            rows = ops.device_positions(input_ids, seqlens_k)[0]  # (B, T)
            position_ids = rows[None].expand(3, *rows.shape)
        if image_embeds is None or image_token_index is None:
            image_embeds = torch.zeros(0, self.config.hidden_size, device=input_ids.device)
            image_token_index = torch.zeros(0, dtype=torch.int64, device=input_ids.device)
        if deepstack_embeds is None and vision.deepstack_layers:
            deepstack_embeds = torch.zeros(vision.deepstack_layers, *image_embeds.shape,
                                           device=input_ids.device)
        if attend_until is None and self.bidirectional:
            positions, _ = ops.device_positions(input_ids, seqlens_k)
            attend_until = image_attend_until(input_ids == vision.image_token_id, positions)
        return ImageInputs(position_ids, image_embeds, image_token_index, deepstack_embeds,
                           attend_until)

    def hidden_states(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
                      *past: Tensor, valid_tokens: Tensor | None = None,
                      images: ImageInputs | None = None) -> tuple[Tensor, Tensor, list[Tensor]]:
        """The final hidden states (B, T, D) fp32, after the final norm (the LM head's input),
        each row's last new index (B,) and the updated caches, in the order of ``past``."""
        cfg = self.config
        x = self.embed(input_ids, seqlens_k, total_sequence_length, valid_tokens, images)
        present: list[Tensor] = []
        slots = iter(past)  # two per layer that owns state (cfg.state_layers)
        # Gemma 4: a KV-shared layer attends over its source's cache: its kernel takes the
        # source's past (the same buffer, bound in place) and the new keys and values the source
        # handed its own kernel, writes them again at the same positions, unchanged, and
        # attends. Its present is the source's buffer once more: the runtime binds it there, so
        # nothing is copied (shared_presents); the cache owns no buffer for it.
        sources: dict[int, tuple[Tensor, Tensor, Tensor, Tensor]] = {}
        for i in range(len(self.model.layers)):
            if cfg.is_kv_shared(i):
                nk, nv, pk, pv = sources[cfg.kv_source(i)]
                present += self.run_layer(i, x, seqlens_k, total_sequence_length, pk, pv,
                                          reuse=(nk, nv))
                continue
            past_k, past_v = next(slots), next(slots)
            present += self.run_layer(i, x, seqlens_k, total_sequence_length, past_k, past_v)
            if x.images is not None:  # Qwen3-VL: DeepStack's features after the first layers
                x.residual = x.images.deepstack(x.residual, i)
            if cfg.shares_kv and not cfg.is_linear_layer(i):
                sources[i] = (*self.model.layers[i].new_kv, past_k, past_v)
        if not layer_class(cfg).final_norm:  # the last layer's output is already normalized
            return x.residual, x.last, present
        assert x.branch is not None
        h, _ = self.model.norm.add(x.branch.float(), x.residual)
        return h, x.last, present

    def new_layer_cache(self, i: int, batch: int, length: int) -> list[Tensor]:
        """Layer ``i``'s two zeroed state tensors (see new_cache)."""
        cfg = self.config
        if cfg.is_linear_layer(i):
            assert cfg.linear_attention is not None
            return [torch.zeros((batch, *shape)) for shape in state_shapes(cfg.linear_attention)]
        heads, head_dim = cfg.layer_kv_shape(i)  # (Gemma 4: per layer kind)
        shape = (batch, heads, length, head_dim)
        return [torch.zeros(shape, dtype=self.cache_dtype) for _ in range(2)]

    def next_cache(self, present: list[Tensor] | tuple[Tensor, ...]) -> list[Tensor]:
        """The past of the next step from a forward's presents: those of the layers that own
        state (Gemma 4's KV-shared layers return their source's buffer again, as a present the
        runtime binds to that buffer, but take no past)."""
        return owned_states(self.config, present)

    def new_cache(self, batch: int, length: int) -> list[Tensor]:
        """Zeroed KV buffers (B, Hkv, length, D) for every layer that owns one (a
        linear-attention layer's states, float32, instead), in the order forward expects."""
        return [t for i in self.config.state_layers
                for t in self.new_layer_cache(i, batch, length)]

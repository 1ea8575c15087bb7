"""Trace the prefill and decode graphs of a (meta-device, export-form) Decoder into ONNX.

prefill: input_ids (B, T), any T; logits of each row's last new token (or every position). Its
         input logits_window (W,) asks for the last W instead: only its length counts, and an
         initializer of the same name (length 1) stands in when the caller does not bind it, so
         a run that binds nothing gets the last token's logits, as before (ONNX Runtime treats an
         initializer that is also a graph input as a default the caller may override).
decode:  input_ids (B, 1); the same computation with T fixed to 1 (batch and cache length stay
         symbolic). It serves RuntimeOptions(sessions="pair") and the parity gate's decode
         steps. CUDA graphs do not need it: one session over prefill.onnx captures a graph per
         decode batch size (fixed shapes at replay come from fixed bindings, not from the file).
Both take the KV cache as one max-length buffer per layer, (B, Hkv, max_len, D), which ORT's
GroupQueryAttention updates in place when the runtime binds past and present to the same memory.
A linear-attention layer (Qwen3.5) takes its conv and recurrent states instead, (B, K-1, C) and
(B, Hv, dk, dv), also updated in place, and the graphs take valid_tokens (B,): how many of each
row's new tokens advance those states.
A decoder that takes images adds image_embeds (M, D) and image_token_index (M,) to both, and
Qwen's position_ids (3, B, T) and DeepStack's deepstack_embeds (K, M, D) (Qwen3-VL, Qwen3.5),
or Gemma's attend_until (B, T) (Gemma 3, Gemma 4 with bidirectional image attention).
vision:  Qwen: one image's patches (N, C*T*P*P) and their bookkeeping (position_index,
         position_weight, rotary_cos, rotary_sin) in; image_embeds (N / merge², D) out (and
         deepstack_embeds); N dynamic, in whole tokens. Gemma 3: pixel_values (I, 3, S, S) in,
         image_embeds (I * tokens, D) out. Gemma 4: one image's patches (N, P*P*3) and
         pixel_position_ids (N, 2) in, image_embeds (N / k², D) out.
embed:   input_ids (B, T) right-padded and sequence_lengths (B,); embeddings (B, E), each row's
         final hidden states pooled over its real tokens (llm_onnx/modeling/embedding.py). The
         attention's keys and values live for the one run: no cache goes in or out.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx_ir as ir
import torch
from torch import nn

from llm_onnx import model_folder as names
from llm_onnx.export.custom_ops import fix_domains, translation_table
from llm_onnx.export.kv_int8_attention import inline_branch_calls
from llm_onnx.modeling.decoder import Decoder
from llm_onnx.modeling.embedding import EmbeddingDecoder
from llm_onnx.modeling.linear_attention import state_shapes

GRAPHS = ("prefill", "decode")


def _example_inputs(model: Decoder, seq_len: int) -> tuple[torch.Tensor, ...]:
    cfg = model.config
    b, p = 2, 8  # example sizes only; batch, sequence and cache length are dynamic
    states: list[torch.Tensor] = []
    for i in cfg.state_layers:  # (Gemma 4's KV-shared layers own none)
        if cfg.is_linear_layer(i):  # float32 states, whatever the compute dtype
            assert cfg.linear_attention is not None
            states += [torch.zeros((b, *shape), device="meta")
                       for shape in state_shapes(cfg.linear_attention)]
        else:
            heads, head_dim = cfg.layer_kv_shape(i)  # (Gemma 4: per layer kind)
            states += [torch.zeros((b, heads, p, head_dim), dtype=model.cache_dtype,
                                   device="meta")
                       for _ in range(2)]
    return (
        torch.zeros(b, seq_len, dtype=torch.int64, device="meta"),
        torch.zeros(b, dtype=torch.int32, device="meta"),
        torch.tensor(seq_len, dtype=torch.int32, device="meta"),
        *states,
    )


def trace_graph(model: Decoder, kind: str, *, all_logits: bool = False) -> ir.Model:
    """Export one graph; initializers keep the module names and hold no data yet."""
    if kind not in GRAPHS:
        raise ValueError(kind)
    cfg = model.config
    layers, linear = cfg.num_hidden_layers, cfg.linear_layers
    shared = tuple(i for i in range(layers) if cfg.is_kv_shared(i))
    batch = torch.export.Dim("batch")
    max_len = torch.export.Dim("max_len")
    ids_dims = {0: batch, 1: torch.export.Dim("sequence")} if kind == "prefill" else {0: batch}
    past_dims = tuple({0: batch} if i in linear else {0: batch, 2: max_len}
                      for i in cfg.state_layers for _ in range(2))
    dynamic = {"input_ids": ids_dims, "seqlens_k": {0: batch}, "total_sequence_length": None,
               "past": past_dims, "last_only": None}
    example = _example_inputs(model, 3 if kind == "prefill" else 1)
    last_only = kind == "prefill" and not all_logits
    kwargs: dict = {"last_only": last_only}
    inputs = names.input_names(layers, linear, shared)
    if linear:  # how many new tokens of each row advance the linear-attention states
        kwargs["valid_tokens"] = torch.zeros(2, dtype=torch.int32, device="meta")
        dynamic["valid_tokens"] = {0: batch}
        inputs.append(names.VALID_TOKENS)
    if last_only:  # example length 2: torch.export would fix a length of 1 as a constant
        kwargs["logits_window"] = torch.zeros(2, dtype=torch.int64, device="meta")
        dynamic["logits_window"] = {0: torch.export.Dim("window")}
        inputs.append(names.LOGITS_WINDOW)
    if model.vision is not None:  # a decoder that takes images (modeling/multimodal.py)
        _image_inputs(model, kwargs, dynamic, inputs, batch, ids_dims.get(1),
                      example[0].shape[1])
    with warnings.catch_warnings(), _quiet_exporter():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model, example, kwargs=kwargs,
            dynamo=True, dynamic_shapes=dynamic, optimize=False, verbose=False,
            custom_translation_table=translation_table(),
            input_names=inputs, output_names=names.output_names(layers, linear),
        )
    graph_model = program.model
    if last_only:
        _default_window(graph_model)
    inline_branch_calls(graph_model)
    fix_domains(graph_model)
    _static_vocab(graph_model, model)
    graph_model.graph.name = kind
    graph_model.producer_name = "llm-onnx"
    return graph_model


def _image_inputs(model: Decoder, kwargs: dict, dynamic: dict, inputs: list[str], batch,
                  sequence, seq_len: int) -> None:
    """The image inputs' examples, dynamic dims and names (after the others: torch.export
    orders keyword inputs as given)."""
    vision = model.vision
    assert vision is not None
    width, count = model.config.hidden_size, torch.export.Dim("image_tokens")
    rows = {0: batch, 1: sequence} if sequence is not None else {0: batch}
    if vision.mrope_section:  # Qwen: three position rows
        kwargs["position_ids"] = torch.zeros(3, 2, seq_len, dtype=torch.int64, device="meta")
        dynamic["position_ids"] = {k + 1: d for k, d in rows.items()}
    kwargs["image_embeds"] = torch.zeros(2, width, device="meta")
    dynamic["image_embeds"] = {0: count}
    kwargs["image_token_index"] = torch.zeros(2, dtype=torch.int64, device="meta")
    dynamic["image_token_index"] = {0: count}
    if vision.deepstack_layers:
        kwargs["deepstack_embeds"] = torch.zeros(vision.deepstack_layers, 2, width,
                                                 device="meta")
        dynamic["deepstack_embeds"] = {1: count}
    if model.bidirectional:  # Gemma: where an image's tokens see each other both ways
        kwargs["attend_until"] = torch.zeros(2, seq_len, dtype=torch.int64, device="meta")
        dynamic["attend_until"] = rows
    inputs += names.image_input_names(bool(vision.deepstack_layers), bool(vision.mrope_section),
                                      bool(model.bidirectional))


def _vision_examples(cfg) -> tuple[tuple[torch.Tensor, ...], tuple[dict, ...]]:
    """vision.onnx's example inputs and dynamic dims, by the tower's kind:

        qwen_vl  one image's patches (a whole number of tokens) and their bookkeeping
        gemma3   (I, 3, S, S) pixels of I images, each image_size square
        gemma4   one image's N patches and their (column, row), N a whole number of tokens
                 (from 2 tokens: torch.export takes a size of 1 for a constant)"""
    if cfg.kind == "gemma3":
        s = cfg.image_size
        return (torch.zeros(2, cfg.num_channels, s, s, device="meta"),), \
            ({0: torch.export.Dim("images")},)
    if cfg.kind == "gemma4":
        tokens = torch.export.Dim("image_tokens", min=2)
        patches = cfg.pool_area * tokens
        n = 2 * cfg.pool_area
        return (torch.zeros(n, cfg.patch_width, device="meta"),
                torch.zeros(n, 2, dtype=torch.int64, device="meta")), \
            ({0: patches}, {0: patches})
    tokens = torch.export.Dim("image_tokens")
    patches = cfg.merge_unit * tokens
    n = 2 * cfg.merge_unit
    return (torch.zeros(n, cfg.patch_width, device="meta"),
            torch.zeros(n, 4, dtype=torch.int64, device="meta"),
            torch.zeros(n, 4, device="meta"),
            torch.zeros(n, cfg.head_dim // 2, device="meta"),
            torch.zeros(n, cfg.head_dim // 2, device="meta")), tuple({0: patches} for _ in range(5))


def trace_vision(model: nn.Module) -> ir.Model:
    """Export the vision graph (its inputs by the tower's kind: _vision_examples); initializers
    keep the module names (model.visual.*, model.vision_tower.*, ...) and hold no data yet."""
    cfg = model.config
    example, dims = _vision_examples(cfg)
    inputs = list(names.VISION_INPUTS_BY_KIND[cfg.kind])
    deepstack = bool(cfg.deepstack_layers)
    with warnings.catch_warnings(), _quiet_exporter():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model, example, dynamo=True, dynamic_shapes=dims, optimize=False, verbose=False,
            custom_translation_table=translation_table(), input_names=inputs,
            output_names=names.vision_output_names(deepstack))
    graph_model = program.model
    fix_domains(graph_model)
    for value in graph_model.graph.outputs:  # the width is the decoder's, not a symbol
        shape = list(value.shape)
        shape[-1] = cfg.out_hidden_size
        value.shape = ir.Shape(shape)
    graph_model.graph.name = "vision"
    graph_model.producer_name = "llm-onnx"
    return graph_model


def trace_embed(model: EmbeddingDecoder) -> ir.Model:
    """Export the embedding graph (batch and sequence length dynamic); initializers keep the
    module names and hold no data yet."""
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    example = (torch.zeros(2, 3, dtype=torch.int64, device="meta"),
               torch.zeros(2, dtype=torch.int32, device="meta"))
    dynamic = {"input_ids": {0: batch, 1: sequence}, "sequence_lengths": {0: batch}}
    with warnings.catch_warnings(), _quiet_exporter():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model, example, dynamo=True, dynamic_shapes=dynamic, optimize=False, verbose=False,
            custom_translation_table=translation_table(),
            input_names=[names.INPUT_IDS, names.SEQUENCE_LENGTHS],
            output_names=[names.EMBEDDINGS])
    graph_model = program.model
    fix_domains(graph_model)
    out = next(v for v in graph_model.graph.outputs if v.name == names.EMBEDDINGS)
    out.shape = ir.Shape([out.shape[0], model.config.embed_width])
    graph_model.graph.name = "embed"
    graph_model.producer_name = "llm-onnx"
    return graph_model


def _default_window(model: ir.Model) -> None:
    """logits_window defaults to one position: an initializer of the input's name (it holds its
    data in the graph file, unlike the weights)."""
    value = next(v for v in model.graph.inputs if v.name == names.LOGITS_WINDOW)
    value.const_value = ir.tensor(np.zeros(1, dtype=np.int64), name=names.LOGITS_WINDOW)
    model.graph.register_initializer(value)


def _static_vocab(model: ir.Model, decoder: Decoder) -> None:
    """The logits output's last dimension is the vocabulary size, not a symbol."""
    cfg = decoder.config
    for value in (*model.graph.inputs, *model.graph.outputs):
        if value.name == names.LOGITS:
            shape = list(value.shape)
            shape[-1] = cfg.vocab_size
            value.shape = ir.Shape(shape)


class _quiet_exporter:
    """torch.onnx prints progress lines and warnings per export; the CLI has its own progress bar."""

    def __enter__(self):
        self._loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo",
                                                          "torch.fx.experimental.symbolic_shapes")]
        self._levels = [lg.level for lg in self._loggers]
        for lg in self._loggers:
            lg.setLevel(logging.ERROR)
        import contextlib
        import io

        self._stdout = contextlib.redirect_stdout(io.StringIO())
        self._stdout.__enter__()
        return self

    def __exit__(self, *exc):
        self._stdout.__exit__(*exc)
        for lg, level in zip(self._loggers, self._levels):
            lg.setLevel(level)
        return False

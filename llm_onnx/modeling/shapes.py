"""The tensors a Hugging Face checkpoint of a given ModelConfig holds: names and shapes.

This is the contract between checkpoints and the decoder: loaders check a checkpoint against it
(missing, extra and wrongly shaped tensors), the random source generates exactly these tensors.
Pure Python.
"""

from __future__ import annotations

from llm_onnx.modeling.config import ModelConfig

Shape = tuple[int, ...]


def _linear(out: dict[str, Shape], prefix: str, n_out: int, n_in: int, bias: bool) -> None:
    out[f"{prefix}.weight"] = (n_out, n_in)
    if bias:
        out[f"{prefix}.bias"] = (n_out,)


def _norm(out: dict[str, Shape], prefix: str, cfg: ModelConfig, width: int) -> None:
    out[f"{prefix}.weight"] = (width,)
    if cfg.norm.norm_type == "layer":
        out[f"{prefix}.bias"] = (width,)


def layer_shapes(cfg: ModelConfig, i: int) -> dict[str, Shape]:
    """Tensors of decoder layer i, Hugging Face Llama/Qwen3 naming."""
    d, hd = cfg.hidden_size, cfg.layer_head_dim(i)  # (Gemma 4: per layer kind)
    q_width, kv_width = cfg.num_attention_heads * hd, cfg.layer_kv_heads(i) * hd
    shared = cfg.is_kv_shared(i)  # Gemma 4: queries only
    p = f"model.layers.{i}"
    out: dict[str, Shape] = {}
    _norm(out, f"{p}.input_layernorm", cfg, d)
    la = cfg.linear_attention
    if cfg.is_linear_layer(i):  # Qwen3.5: Gated DeltaNet in place of attention
        assert la is not None
        _linear(out, f"{p}.linear_attn.in_proj_qkv", la.conv_dim, d, False)
        _linear(out, f"{p}.linear_attn.in_proj_z", la.value_dim, d, False)
        _linear(out, f"{p}.linear_attn.in_proj_b", la.num_value_heads, d, False)
        _linear(out, f"{p}.linear_attn.in_proj_a", la.num_value_heads, d, False)
        out[f"{p}.linear_attn.conv1d.weight"] = (la.conv_dim, 1, la.conv_kernel)
        out[f"{p}.linear_attn.A_log"] = (la.num_value_heads,)
        out[f"{p}.linear_attn.dt_bias"] = (la.num_value_heads,)
        out[f"{p}.linear_attn.norm.weight"] = (la.value_head_dim,)
        _linear(out, f"{p}.linear_attn.out_proj", d, la.value_dim, False)
    else:
        att = cfg.attention
        gated = 2 if att.attention_output_gate else 1  # Qwen3.5: a gate beside each query head
        _linear(out, f"{p}.self_attn.q_proj", gated * q_width, d, att.attention_bias)
        if not shared:
            _linear(out, f"{p}.self_attn.k_proj", kv_width, d, att.attention_bias)
        if not (shared or cfg.layer_k_eq_v(i)):  # (Gemma 4's k_eq_v: the keys are the values)
            _linear(out, f"{p}.self_attn.v_proj", kv_width, d, att.attention_bias)
        _linear(out, f"{p}.self_attn.o_proj", d, q_width, att.o_proj_bias)
        if att.attention_sinks:  # gpt-oss
            out[f"{p}.self_attn.sinks"] = (cfg.num_attention_heads,)
        if att.qk_norm:
            out[f"{p}.self_attn.q_norm.weight"] = (hd,)
            if not shared:
                out[f"{p}.self_attn.k_norm.weight"] = (hd,)
    topology = cfg.residual.topology
    if not (topology == "parallel" and cfg.residual.parallel_attn_shared_norm):
        # (OPT post-LN: after the MLP; Gemma 3: on attention's output)
        _norm(out, f"{p}.post_attention_layernorm", cfg, d)
    if topology == "sandwich":
        _norm(out, f"{p}.pre_feedforward_layernorm", cfg, d)
        _norm(out, f"{p}.post_feedforward_layernorm", cfg, d)
    if cfg.is_moe_layer(i):
        moe = cfg.moe
        assert moe is not None
        _linear(out, f"{p}.mlp.gate", moe.num_experts, d, moe.bias)  # (gpt-oss: biases)
        for e in range(moe.num_experts):
            _linear(out, f"{p}.mlp.experts.{e}.gate_proj", moe.moe_intermediate_size, d, moe.bias)
            _linear(out, f"{p}.mlp.experts.{e}.up_proj", moe.moe_intermediate_size, d, moe.bias)
            _linear(out, f"{p}.mlp.experts.{e}.down_proj", d, moe.moe_intermediate_size, moe.bias)
        if moe.shared_expert_intermediate_size is not None:
            width = moe.shared_expert_intermediate_size
            _linear(out, f"{p}.mlp.shared_expert.gate_proj", width, d, False)
            _linear(out, f"{p}.mlp.shared_expert.up_proj", width, d, False)
            _linear(out, f"{p}.mlp.shared_expert.down_proj", d, width, False)
            out[f"{p}.mlp.shared_expert_gate.weight"] = (1, d)
    else:
        width = cfg.layer_intermediate(i)  # (Gemma 4 E2B: KV-shared layers' doubled)
        bias = cfg.mlp.mlp_bias
        if cfg.mlp.gated_mlp:
            _linear(out, f"{p}.mlp.gate_proj", width, d, bias)
        _linear(out, f"{p}.mlp.up_proj", width, d, bias)
        _linear(out, f"{p}.mlp.down_proj", d, width, bias)
    if cfg.mlp.enable_moe_block:  # Gemma 4: experts beside the dense MLP, stacked
        moe = cfg.moe
        assert moe is not None
        e, w = moe.num_experts, moe.moe_intermediate_size
        _linear(out, f"{p}.router.proj", e, d, False)
        out[f"{p}.router.scale"] = (d,)
        out[f"{p}.router.per_expert_scale"] = (e,)
        out[f"{p}.experts.gate_up_proj"] = (e, 2 * w, d)
        out[f"{p}.experts.down_proj"] = (e, d, w)
        for norm in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                     "post_feedforward_layernorm_2"):
            _norm(out, f"{p}.{norm}", cfg, d)
    per_layer = cfg.embedding.hidden_size_per_layer_input
    if per_layer:  # Gemma 4's per-layer embeddings
        _linear(out, f"{p}.per_layer_input_gate", per_layer, d, False)
        _linear(out, f"{p}.per_layer_projection", d, per_layer, False)
        _norm(out, f"{p}.post_per_layer_input_norm", cfg, d)
    if cfg.residual.layer_scalar:
        out[f"{p}.layer_scalar"] = (1,)
    return out


def checkpoint_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    """All tensors of a checkpoint, in a stable order (embeddings, layers, final norm, head)."""
    emb, pos = cfg.embedding, cfg.positions
    out: dict[str, Shape] = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.embed_width)}
    if emb.embed_dim is not None:  # OPT-350m
        out["model.project_in.weight"] = (cfg.hidden_size, emb.embed_dim)
    if pos.position_embedding_type == "learned":  # (a sinusoidal table is computed, not stored)
        out["model.embed_positions.weight"] = (cfg.max_position_embeddings + pos.position_offset,
                                               cfg.hidden_size)
    if emb.embedding_layernorm:
        _norm(out, "model.embed_layernorm", cfg, cfg.hidden_size)
    if emb.hidden_size_per_layer_input:  # Gemma 4: one table packing every layer's rows
        width = cfg.num_hidden_layers * emb.hidden_size_per_layer_input
        out["model.embed_tokens_per_layer.weight"] = (cfg.vocab_size, width)
        _linear(out, "model.per_layer_model_projection", width, cfg.hidden_size, False)
        _norm(out, "model.per_layer_projection_norm", cfg, emb.hidden_size_per_layer_input)
    for i in range(cfg.num_hidden_layers):
        out.update(layer_shapes(cfg, i))
    if cfg.residual.topology != "post":  # post-LN layers end normalized: no final norm
        _norm(out, "model.norm", cfg, cfg.hidden_size)
    if emb.embed_dim is not None:
        out["model.project_out.weight"] = (emb.embed_dim, cfg.hidden_size)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, cfg.embed_width)
    return out


def num_parameters(cfg: ModelConfig) -> int:
    """Parameter count of the checkpoint ``cfg`` describes (tied weights counted once)."""
    total = 0
    for shape in checkpoint_shapes(cfg).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total

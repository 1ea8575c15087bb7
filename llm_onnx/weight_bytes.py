"""What a model folder's decode step reads, in bytes, from its manifest alone (bench's
bandwidth ceiling): all of weights.data less an untied embedding table's other rows and the
experts a step's tokens did not choose. Pure Python."""

from __future__ import annotations

from llm_onnx.model_folder import Manifest, fitting_block


def weight_bytes_read(m: Manifest, batch: int = 1) -> int:
    """Weights a decode step of ``batch`` rows reads: all of weights.data, less what it does not
    touch. An untied embedding table is only gathered (a row per token); of a mixture of
    experts' expert tensors a row reads its top-k experts, k/E of them, and ``batch`` rows routed
    independently of one another 1 - (1 - k/E)^batch (the attention, norms, routers and the LM
    head are read whole; so are Gemma 4's experts in their GPU form, every expert densely)."""
    cfg = m.config
    weights = m.weights.bytes
    if not cfg.tie_word_embeddings:
        table = embedding_bytes(m)
        weights -= table - table * min(batch, cfg.vocab_size) // cfg.vocab_size
    quant = m.precision.quantization  # (Gemma 4's GPU form reads every expert: "densely")
    if cfg.moe is not None and not (quant and any("densely" in q for q in quant.quantized)):
        unread = (1 - cfg.moe.num_experts_per_tok / cfg.moe.num_experts) ** batch
        weights -= round(expert_bytes(m) * unread)
    return weights


def _float_size(m: Manifest) -> int:
    """Bytes of a float weight (and of a quantized block's scale): float16 graphs store float16."""
    return 2 if m.kv_cache.dtype == "float16" or m.precision.precision == "fp16" else 4


def embedding_bytes(m: Manifest) -> int:
    """Bytes of the token table in weights.data: float, or GatherBlockQuantized's codes and one
    scale per block."""
    cfg, quant = m.config, m.precision.quantization
    width, size = cfg.embed_width, _float_size(m)
    bits = quant.embedding_bits if quant is not None else None
    block = fitting_block((width,), quant.block_size) if quant is not None else None
    if bits is None or block is None:
        return cfg.vocab_size * width * size
    return cfg.vocab_size * (width * bits // 8 + width // block * size)


def expert_bytes(m: Manifest) -> int:
    """Bytes of every layer's experts in weights.data (0 without experts): gate/up (E, 2I, D)
    and down (E, D, I), float or QMoE's codes and one scale per block (Gemma 4's experts, beside
    every layer's dense MLP: MatMulNBits' codes, each projection blocked along its own input)."""
    cfg, quant = m.config, m.precision.quantization
    if cfg.moe is None:
        return 0
    d, i, e = cfg.hidden_size, cfg.moe.moe_intermediate_size, cfg.moe.num_experts
    per_layer = e * 3 * i * d  # weights
    size = _float_size(m)
    beside = cfg.mlp.enable_moe_block  # Gemma 4: experts beside every layer's dense MLP
    layers = sum(beside or cfg.is_moe_layer(n) for n in range(cfg.num_hidden_layers))
    if quant is None:
        per_layer *= size
        return per_layer * layers
    asked = quant.experts.block_size if quant.experts is not None else quant.block_size
    zero_points = quant.experts is not None and quant.experts.scheme == "zero_point"
    if beside:
        up, down = fitting_block((d,), asked), fitting_block((i,), asked)
        assert up is not None and down is not None  # the exporter refuses experts without
        per_layer = e * (2 * i * (d * quant.bits // 8 + d // up * size)
                         + d * (i * quant.bits // 8 + i // down * size))
    else:
        block = fitting_block((d, i), asked)
        assert block is not None  # the exporter refuses experts without one
        per_layer = per_layer * quant.bits // 8 + per_layer // block * size
        if zero_points:  # a row's zero points packed like its codes, rounded up to a byte
            per_layer += e * (2 * i * -(-(d // block) * quant.bits // 8)
                              + d * -(-(i // block) * quant.bits // 8))
    return per_layer * layers


__all__ = ["embedding_bytes", "expert_bytes", "weight_bytes_read"]

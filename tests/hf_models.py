"""Tiny random Hugging Face checkpoints of our presets, made with transformers (the independent
reference of the parity tests)."""

from __future__ import annotations

from pathlib import Path

import torch

from llm_onnx.build_model.config import ModelConfig


def hf_config_dict(cfg: ModelConfig) -> dict:
    """config.json fields for transformers' class of the same architecture."""
    d = dict(
        architectures=[cfg.architecture], vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=cfg.attention_bias,
        hidden_act=cfg.hidden_act,
    )
    if cfg.moe is not None:
        d.update(num_experts=cfg.moe.num_experts, num_experts_per_tok=cfg.moe.num_experts_per_tok,
                 moe_intermediate_size=cfg.moe.moe_intermediate_size,
                 norm_topk_prob=cfg.moe.norm_topk_prob, decoder_sparse_step=cfg.moe.decoder_sparse_step,
                 mlp_only_layers=list(cfg.moe.mlp_only_layers))
    return d


def make_hf_model(cfg: ModelConfig, seed: int = 0):
    """A transformers model of ``cfg`` with random weights spread wide enough to expose bugs
    (norm weights are not all ones, attention is not uniform)."""
    import transformers

    hf_cfg_cls = {"LlamaForCausalLM": transformers.LlamaConfig,
                  "Qwen3ForCausalLM": transformers.Qwen3Config,
                  "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig}[cfg.architecture]
    fields = hf_config_dict(cfg)
    fields.pop("architectures")
    hf_cfg = hf_cfg_cls(**fields)
    hf_cfg.architectures = [cfg.architecture]
    torch.manual_seed(seed)
    model = getattr(transformers, cfg.architecture)(hf_cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
    return model


def save_hf_checkpoint(cfg: ModelConfig, folder: Path, seed: int = 0):
    model = make_hf_model(cfg, seed)
    model.save_pretrained(folder)
    return model

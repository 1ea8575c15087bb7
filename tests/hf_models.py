"""Tiny random Hugging Face checkpoints of our presets, made with transformers (the independent
reference of the parity tests)."""

from __future__ import annotations

from pathlib import Path

import torch

from llm_onnx.model.config import ModelConfig


def hf_config_dict(cfg: ModelConfig) -> dict:
    """config.json fields for transformers' class of the same architecture."""
    older = {"GPT2LMHeadModel": _gpt2, "BloomForCausalLM": _bloom, "FalconForCausalLM": _falcon}
    if cfg.architecture in older:  # no bos/eos: their defaults lie outside a tiny vocabulary
        return dict(architectures=[cfg.architecture], bos_token_id=None, eos_token_id=None,
                    **older[cfg.architecture](cfg))
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
    if cfg.sliding_window is not None:
        d.update(sliding_window=cfg.sliding_window)
    return d


def _gpt2(cfg: ModelConfig) -> dict:
    return dict(vocab_size=cfg.vocab_size, n_embd=cfg.hidden_size, n_layer=cfg.num_hidden_layers,
                n_head=cfg.num_attention_heads, n_inner=cfg.intermediate_size,
                n_positions=cfg.max_position_embeddings, activation_function=cfg.hidden_act,
                layer_norm_epsilon=cfg.layer_norm_epsilon,
                tie_word_embeddings=cfg.tie_word_embeddings)


def _bloom(cfg: ModelConfig) -> dict:
    assert cfg.intermediate_size == 4 * cfg.hidden_size  # BLOOM's MLP width is fixed
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                layer_norm_epsilon=cfg.layer_norm_epsilon,
                tie_word_embeddings=cfg.tie_word_embeddings)


def _falcon(cfg: ModelConfig) -> dict:
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                num_hidden_layers=cfg.num_hidden_layers,
                num_attention_heads=cfg.num_attention_heads,
                multi_query=cfg.num_key_value_heads == 1, new_decoder_architecture=False,
                parallel_attn=cfg.parallel_attn, alibi=False, bias=cfg.attention_bias,
                ffn_hidden_size=cfg.intermediate_size, activation=cfg.hidden_act,
                max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
                layer_norm_epsilon=cfg.layer_norm_epsilon,
                tie_word_embeddings=cfg.tie_word_embeddings)


def make_hf_model(cfg: ModelConfig, seed: int = 0):
    """A transformers model of ``cfg`` with random weights spread wide enough to expose bugs
    (norm weights are not all ones, attention is not uniform)."""
    import transformers

    hf_cfg_cls = {"LlamaForCausalLM": transformers.LlamaConfig,
                  "MistralForCausalLM": transformers.MistralConfig,
                  "Qwen3ForCausalLM": transformers.Qwen3Config,
                  "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
                  "GPT2LMHeadModel": transformers.GPT2Config,
                  "BloomForCausalLM": transformers.BloomConfig,
                  "FalconForCausalLM": transformers.FalconConfig}[cfg.architecture]
    fields = hf_config_dict(cfg)
    fields.pop("architectures")
    hf_cfg = hf_cfg_cls(**fields)
    hf_cfg.architectures = [cfg.architecture]
    torch.manual_seed(seed)
    model = getattr(transformers, cfg.architecture)(hf_cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("norm" in name or ".ln_" in name) and name.endswith(".weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
    return model


def save_hf_checkpoint(cfg: ModelConfig, folder: Path, seed: int = 0, tokenizer: bool = False):
    """``tokenizer``: also write a word-level tokenizer.json ("t0" ... "t{V-1}", split on
    whitespace), so the folder works with text prompts."""
    model = make_hf_model(cfg, seed)
    model.save_pretrained(folder)
    if tokenizer:
        save_word_tokenizer(Path(folder), cfg.vocab_size)
    return model


def save_word_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))

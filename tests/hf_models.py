"""Tiny random Hugging Face checkpoints of our presets, made with transformers (the independent
reference of the parity tests)."""

from __future__ import annotations

from pathlib import Path

import torch

from llm_onnx.families import family
from llm_onnx.modeling.config import ModelConfig


def hf_config_dict(cfg: ModelConfig) -> dict:
    """config.json fields for transformers' class of the same architecture (its family says)."""
    return family(cfg.architecture).hf_config(cfg)


def make_hf_model(cfg: ModelConfig, seed: int = 0):
    """A transformers model of ``cfg`` with random weights spread wide enough to expose bugs
    (norm weights are not all ones, attention is not uniform)."""
    import transformers

    hf_cfg_cls = getattr(transformers, family(cfg.architecture).hf_config_class)
    fields = hf_config_dict(cfg)
    fields.pop("architectures")
    hf_cfg = hf_cfg_cls(**fields)
    hf_cfg.architectures = [cfg.architecture]
    torch.manual_seed(seed)
    model = getattr(transformers, cfg.architecture)(hf_cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    offset = family(cfg.architecture).norm_weight_offset  # Gemma: (1 + w) norms
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")) and cfg.attention.attention_scale == 1.0:
                # Gemma 4 scores q . k unscaled: its q/k norm weights set the softmax's
                # temperature, drawn here as head_dim ** -0.5 (split between q and k) gives it
                # (around 1, a head of 32 scores to +-30 and the softmax amplifies any rounding)
                p.copy_(p.shape[0] ** -0.25 * (1.0 + 0.2 * torch.randn(p.shape, generator=gen)))
            elif ("norm" in name or ".ln_" in name) and name.endswith(".weight"):
                p.copy_(1.0 - offset + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("router.per_expert_scale"):  # Gemma 4: around 1
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("router.scale"):
                # Gemma 4's router reads RMSNorm(x) * scale / sqrt(hidden): a scale around
                # sqrt(hidden) makes its logits spread as a trained router's do, so tokens
                # route clearly (around 0.08 every token sits on a near-tie, which int8
                # activations' rounding flips)
                width = model.config.hidden_size
                p.copy_(width ** 0.5 * (1.0 + 0.2 * torch.randn(p.shape, generator=gen)))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4: stored per layer, not always 1
                b.copy_(1.0 + 0.2 * torch.randn(b.shape, generator=gen))
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

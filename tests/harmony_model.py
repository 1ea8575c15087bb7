"""A tiny random gpt-oss (gpt_oss_tiny: sinks, windows, biased MoE) that speaks harmony (its chat
format) with a tokenizer that can spell anything: byte-level BPE (one token per byte) plus
harmony's markers as special tokens, gpt-oss's own chat template, and ``<|return|>`` and
``<|call|>`` as end-of-sequence tokens as gpt-oss's generation config has them.

Vocabulary (272 ids): 0 <|endoftext|>  1 <|start|>  2 <|end|>  3 <|message|>  4 <|channel|>
                      5 <|constrain|>  6 <|return|> (eos)  7 <|call|> (eos)   special
                      then the 256 bytes; the rest unused.

tests/fixtures/chat_templates/gpt-oss.jinja is the ``chat_template`` of openai/gpt-oss-20b and
-120b (Apache-2.0), as llama.cpp keeps it in models/templates/openai-gpt-oss-120b.jinja.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.byte_model import CONTEXT, VOCAB, _bytes_to_unicode

MARKERS = ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
           "<|constrain|>", "<|return|>", "<|call|>"]
EOS = [6, 7]
GPT_OSS_TEMPLATE = Path(__file__).parent / "fixtures" / "chat_templates" / "gpt-oss.jinja"


def save_harmony_tokenizer(folder: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(MARKERS)}
    for b, char in sorted(_bytes_to_unicode().items()):
        vocab[char] = len(MARKERS) + b
    tok = Tokenizer(models.BPE(vocab, [], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MARKERS])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": GPT_OSS_TEMPLATE.read_text(encoding="utf-8"),
        "bos_token": "<|startoftext|>", "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>"}), encoding="utf-8")


def make_harmony_checkpoint(folder: Path, preset: str = "gpt_oss_tiny", seed: int = 7):
    """A tiny random ``preset`` model with the harmony tokenizer; returns the transformers model."""
    from llm_onnx.families import get_config
    from tests.hf_models import make_hf_model

    config = get_config(preset).replace(vocab_size=VOCAB, max_position_embeddings=CONTEXT)
    model = make_hf_model(config, seed)
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.bos_token_id, config.pad_token_id = list(EOS), None, 0
    model.save_pretrained(folder)
    save_harmony_tokenizer(folder)
    return model


_MADE: dict[str, Path] = {}


def export_harmony_model(tmp_path_factory, preset: str = "gpt_oss_tiny") -> Path:
    """The exported fp32 folder (made once per session for each ``preset``)."""
    if preset not in _MADE:
        from llm_onnx.checkpoints import open_checkpoint
        from llm_onnx.export import ExportOptions, export_model

        name = "tiny-harmony" + ("" if preset == "gpt_oss_tiny" else f"-{preset}")
        ckpt = tmp_path_factory.mktemp(f"{name}-ckpt") / name
        make_harmony_checkpoint(ckpt, preset)
        out = tmp_path_factory.mktemp(name) / name
        export_model(open_checkpoint(ckpt), out,
                     ExportOptions(precision="fp32", max_seq_len=CONTEXT), progress=False)
        _MADE[preset] = out
    return _MADE[preset]

"""A tiny random Gemma 4 (gemma4_tiny: every switch on) that speaks Gemma 4's chat format: a
byte-level tokenizer (one token per byte) plus Gemma 4's markers, as its tokenizer has them
(control tokens special; the thought, tool-call and string markers added tokens that decode as
text), Gemma 4's own chat template, and ``<eos>``, ``<turn|>`` and ``<|tool_response>`` as
end-of-sequence tokens as Gemma 4's generation config has them (1, 106 and 50 there).

Vocabulary (272 ids): 0 <pad>  1 <eos> (eos)  2 <bos>  3 <|turn>  4 <turn|> (eos)  5 <|think|>
                      6 <|tool>  7 <tool|>                                            special
                      8 <|tool_call>  9 <tool_call|>  10 <|tool_response> (eos)
                      11 <tool_response|>  12 <|"|>  13 <|channel>  14 <channel|>     added
                      then the 256 bytes; the rest unused.

tests/fixtures/chat_templates/gemma4.jinja is the ``chat_template`` of google/gemma-4-31B-it
(Apache-2.0), as llama.cpp keeps it in models/templates/google-gemma-4-31B-it.jinja (the copy
vendored in llama-cpp-python 0.3.36's sdist; no hub is reachable here). Token types are those
of llama.cpp's models/ggml-vocab-gemma-4.gguf (control: special; user-defined: added).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.byte_model import CONTEXT, VOCAB, _bytes_to_unicode

SPECIAL = ["<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|think|>", "<|tool>", "<tool|>"]
ADDED = ["<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>',
         "<|channel>", "<channel|>"]
EOS = [1, 4, 10]
GEMMA4_TEMPLATE = Path(__file__).parent / "fixtures" / "chat_templates" / "gemma4.jinja"
# tokenizer_config.json's special tokens, as the template sees them
SPECIAL_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}


def save_gemma4_tokenizer(folder: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    markers = SPECIAL + ADDED
    vocab = {token: i for i, token in enumerate(markers)}
    for b, char in sorted(_bytes_to_unicode().items()):
        vocab[char] = len(markers) + b
    tok = Tokenizer(models.BPE(vocab, [], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": GEMMA4_TEMPLATE.read_text(encoding="utf-8"), **SPECIAL_TOKENS}),
        encoding="utf-8")


def make_gemma4_chat_checkpoint(folder: Path, seed: int = 9):
    """The tiny random gemma4_tiny with this tokenizer; returns the transformers model."""
    from llm_onnx.families import get_config
    from tests.hf_models import make_hf_model

    config = get_config("gemma4_tiny").replace(vocab_size=VOCAB, max_position_embeddings=CONTEXT)
    model = make_hf_model(config, seed)
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.bos_token_id, config.pad_token_id = list(EOS), 2, 0
    model.save_pretrained(folder)
    save_gemma4_tokenizer(folder)
    return model


_MADE: dict[str, Path] = {}


def export_gemma4_chat_model(tmp_path_factory) -> Path:
    """The exported fp32 folder (made once per session)."""
    if "folder" not in _MADE:
        from llm_onnx.checkpoints import open_checkpoint
        from llm_onnx.export import ExportOptions, export_model

        ckpt = tmp_path_factory.mktemp("tiny-gemma4-chat-ckpt") / "tiny-gemma4-chat"
        make_gemma4_chat_checkpoint(ckpt)
        out = tmp_path_factory.mktemp("tiny-gemma4-chat") / "tiny-gemma4-chat"
        export_model(open_checkpoint(ckpt), out,
                     ExportOptions(precision="fp32", max_seq_len=CONTEXT), progress=False)
        _MADE["folder"] = out
    return _MADE["folder"]

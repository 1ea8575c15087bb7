"""A tiny random model whose tokenizer can spell anything: byte-level BPE (one token per byte,
GPT-2's byte alphabet, no merges) plus ChatML's special tokens and Hermes' tool-call tags as
added tokens. Structured output needs it: a JSON document, a regex or a tool call must be
writable token by token, which the word tokenizers of the other tiny models cannot do.

Vocabulary (272 ids): 0 <|endoftext|>  1 <|im_start|>  2 <|im_end|> (eos)   special
                      3 <tool_call>  4 </tool_call>  5 <tool_response>  6 </tool_response>
                      [7 <think>  8 </think>  with think=True]                added, not special
                      then the 256 bytes; the rest unused (the model's logits are wider).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
THINK_TAGS = ["<think>", "</think>"]
VOCAB = 272
EOS = 2
CONTEXT = 4096  # a tools prompt is several hundred byte tokens; Ray's tests run for seconds
TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
# The package's ChatML tools template (what `--chat-template chatml-tools` names)
HERMES_TEMPLATE = Path(__file__).parents[1] / "llm_onnx" / "runtime" / "chat" / "templates" / \
    "chatml-tools.jinja"
# The folder's own template: ChatML without tools (a tools template comes by --chat-template).
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what ByteLevel pre-tokenizers emit)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def added_tokens(think: bool) -> list[str]:
    return SPECIAL + TOOL_TAGS + (THINK_TAGS if think else [])


def save_byte_tokenizer(folder: Path, think: bool = False) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    added = added_tokens(think)
    vocab = {token: i for i, token in enumerate(added)}
    for b, char in sorted(_bytes_to_unicode().items()):
        vocab[char] = len(added) + b
    tok = Tokenizer(models.BPE(vocab, [], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added[3:]])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>"}), encoding="utf-8")


def make_byte_checkpoint(folder: Path, seed: int = 5, think: bool = False,
                         preset: str = "qwen3_tiny"):
    """A tiny random Qwen3 (or another family's ``preset``) with the byte tokenizer (eos 2);
    returns the transformers model."""
    from llm_onnx.families import get_config
    from tests.hf_models import make_hf_model

    config = get_config(preset).replace(vocab_size=VOCAB, max_position_embeddings=CONTEXT)
    model = make_hf_model(config, seed)
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.bos_token_id, config.pad_token_id = EOS, None, 0
    model.save_pretrained(folder)
    save_byte_tokenizer(folder, think)
    return model


_MADE: dict[tuple[bool, str, str], Path] = {}


def export_byte_model(tmp_path_factory, think: bool = False, preset: str = "qwen3_tiny",
                      kv_cache: str = "float") -> Path:
    """The exported fp32 folder (made once per session for each ``think``, ``preset`` and
    ``kv_cache``)."""
    if (think, preset, kv_cache) not in _MADE:
        from llm_onnx.checkpoints import open_checkpoint
        from llm_onnx.export import ExportOptions, export_model

        name = ("tiny-bytes-think" if think else "tiny-bytes") + \
            ("" if preset == "qwen3_tiny" else f"-{preset}") + \
            ("" if kv_cache == "float" else f"-kv-{kv_cache}")
        ckpt = tmp_path_factory.mktemp(f"{name}-ckpt") / name
        make_byte_checkpoint(ckpt, think=think, preset=preset)
        out = tmp_path_factory.mktemp(name) / name
        export_model(open_checkpoint(ckpt), out,
                     ExportOptions(precision="fp32", max_seq_len=CONTEXT, kv_cache=kv_cache),
                     progress=False)
        _MADE[(think, preset, kv_cache)] = out
    return _MADE[(think, preset, kv_cache)]

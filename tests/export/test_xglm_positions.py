"""XGLM's position table follows transformers for every pad_token_id: transformers zeroes row
``pad_token_id`` of the sinusoidal table (its padding_idx) and reads position p at row p + 2, so
pad_token_id 2 zeroes the first position's row, 1 (the vendors' value) and 0 rows no position
reads, a negative one a row counted from the end, and null none. Checked on the table itself
and end to end: a transformers model exported and generating greedily through the runtime."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_onnx.errors import ConfigError
from llm_onnx.families import from_hf_config
from tests.runtime.test_runtime_models import hf_greedy_run

ABSENT = object()  # config.json without a pad_token_id field: XGLMConfig's default applies
SMALL = dict(vocab_size=256, d_model=64, attention_heads=4, ffn_dim=96, num_layers=1,
             max_position_embeddings=128)


def _hf_fields(pad) -> dict:
    return dict(SMALL) if pad is ABSENT else dict(SMALL, pad_token_id=pad)


@pytest.mark.parametrize("pad", [ABSENT, None, 0, 1, 2, 3, 9, 129, -1, -2, -130],
                         ids=lambda p: "absent" if p is ABSENT else str(p))
def test_the_table_is_transformers_for_every_pad_token_id(pad):
    """Our computed table (as the decoder holds it) equals transformers' own XGLMModel's table,
    row for row: the rows positions read (from 2 on) and the two offset rows."""
    import transformers

    from llm_onnx.checkpoints import build_model

    fields = _hf_fields(pad)
    want = transformers.XGLMModel(transformers.XGLMConfig(**fields)).embed_positions.weights
    cfg = from_hf_config(dict(fields, architectures=["XGLMForCausalLM"]))
    got = build_model(cfg).model.embed_positions.weight  # no weights: the table is computed
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-4  # theirs is computed in float32
    zero_rows = [int(i) for i in torch.nonzero(want.abs().sum(1) == 0)]
    assert [int(i) for i in torch.nonzero(got.abs().sum(1) == 0)] == zero_rows
    assert zero_rows == ([] if pad is None else [(1 if pad is ABSENT else pad) % 130])


@pytest.mark.parametrize("pad", [130, 255, -131])
def test_a_pad_token_id_outside_the_table_is_refused(pad):
    """transformers cannot build these either (the row to zero does not exist)."""
    import transformers

    with pytest.raises(IndexError):
        transformers.XGLMModel(transformers.XGLMConfig(**_hf_fields(pad)))
    with pytest.raises(ConfigError) as e:
        from_hf_config(dict(_hf_fields(pad), architectures=["XGLMForCausalLM"]),
                       source="x/config.json")
    assert f"pad_token_id={pad}" in str(e.value) and "x/config.json" in str(e.value)
    assert "\n" not in str(e.value)


def test_pad_token_id_2_greedy_tokens_equal_transformers(tmp_path):
    """pad_token_id 2 zeroes the row of position 0: prompts of 5, 7, 10 and 12 tokens (one
    right-padded batch through the runtime) generate transformers' greedy tokens."""
    import transformers

    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.runtime import Model
    from tests.hf_models import save_word_tokenizer

    config = transformers.XGLMConfig(
        vocab_size=49152, d_model=64, attention_heads=4, ffn_dim=128, num_layers=2,
        max_position_embeddings=256, init_std=0.3, pad_token_id=2)
    torch.manual_seed(0)
    hf = transformers.XGLMForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "hf")
    save_word_tokenizer(tmp_path / "hf", config.vocab_size)
    out = tmp_path / "onnx"
    export_model(open_checkpoint(tmp_path / "hf"), out,
                 ExportOptions(precision="fp32", max_seq_len=32), progress=False)
    model = Model.load(out, provider="cpu")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, config.vocab_size, n).tolist() for n in (5, 7, 10, 12)]
    results = model.generate(prompts, max_new_tokens=8, temperature=0)
    for prompt, result in zip(prompts, results):
        tokens, reason = hf_greedy_run(hf, prompt, 8, model.eos_token_ids)
        assert (result.token_ids, result.finish_reason) == (tokens, reason)

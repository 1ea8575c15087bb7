"""An int8 KV cache (--kv-cache int8) through the runtime's paths that reuse or share the cache,
on the tiny byte model (tests/byte_model.py): greedy generation, rows of a continuous batch,
prefix reuse across requests, a rewind, a chat session's next turn and speculative verify runs
each give the tokens of a fresh run (the tests are gpt-oss's, test_gpt_oss_runtime.py). The
scales are per layer, not per row, so copying a row's int8 positions or cutting them back is
exact. The cache holds a quarter of fp32's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.runtime import Model
from tests.byte_model import export_byte_model
from tests.runtime.test_gpt_oss_runtime import (  # noqa: F401  (collected here too)
    _fresh,
    _ids,
    test_a_chat_session_answers_as_a_fresh_chat,
    test_a_rewind_past_the_window_continues_as_a_fresh_run,
    test_scheduled_rows_with_shared_prefixes_equal_fresh_runs,
    test_speculative_verify_runs_equal_plain_decoding,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = export_byte_model(tmp_path_factory, kv_cache="int8")
    return Model.load(folder, provider="cpu", threads=1, speculative="off")


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    return Model.load(export_byte_model(tmp_path_factory), provider="cpu", threads=1,
                      speculative="off")


def test_the_cache_is_int8_a_quarter_of_float32(model, float_model):
    assert model.engine.layout.dtype == np.int8
    assert model.engine.kv_bytes_per_position * 4 == float_model.engine.kv_bytes_per_position
    prompt = _ids(20, 2)
    tokens = _fresh(model, prompt, 12)
    assert len(tokens) == 12
    # a random model's near-ties aside, int8 keeps most of the float cache's greedy tokens
    same = sum(a == b for a, b in zip(tokens, _fresh(float_model, prompt, 12)))
    assert same >= 4  # 5 of 12 with the scales' headroom (2026-11-25)

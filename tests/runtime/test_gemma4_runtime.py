"""Gemma 4 through the runtime's paths that reuse or share a KV cache, on the tiny preset with
Gemma 4's chat template and markers over a byte tokenizer (tests/gemma4_chat_model.py, the
export the server's Gemma 4 tests use too): the cache has buffers of two shapes (sliding layers'
(2, 16), full layers' (1, 32)) and two layers that own none (they read layers 0 and 1's). The
tests are gpt-oss's (test_gpt_oss_runtime.py): rows of a continuous batch with shared prefixes,
a rewind past the window, a chat session's next turn and speculative verify runs each give the
tokens of a fresh run (whose greedy tokens equal transformers': test_runtime_models.py)."""

from __future__ import annotations

import pytest

from llm_onnx.runtime import Model
from tests.runtime.test_gpt_oss_runtime import (  # noqa: F401  (collected here too)
    test_a_chat_session_answers_as_a_fresh_chat,
    test_a_rewind_past_the_window_continues_as_a_fresh_run,
    test_scheduled_rows_with_shared_prefixes_equal_fresh_runs,
    test_speculative_verify_runs_equal_plain_decoding,
)


@pytest.fixture(scope="module")
def model(gemma4_chat_model_folder):
    return Model.load(gemma4_chat_model_folder, provider="cpu", threads=1, speculative="off")


def test_the_cache_owns_buffers_of_two_shapes_and_none_for_shared_layers(model):
    kv = model.engine.manifest.kv_cache
    assert kv.layer_indices == (0, 1) and kv.sources == {"2": 0, "3": 1}
    cache = model.engine.new_cache(2, 16)
    shapes = [cache.host_view(i).shape for i in range(4)]
    assert shapes == [(2, 2, 16, 16)] * 2 + [(2, 1, 16, 32)] * 2
    assert model.engine.kv_bytes_per_position == 2 * (2 * 16 + 32) * 4

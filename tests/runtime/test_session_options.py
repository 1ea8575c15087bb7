"""The engine's CPU sessions: options chosen by measurement (docs/performance.md)."""

from __future__ import annotations

import pytest

from llm_onnx.runtime import Model


@pytest.mark.parametrize("sessions", ["single", "pair"])
def test_cpu_sessions_run_without_a_memory_pattern(tiny_export, sessions):
    # With ONNX Runtime's default, a second run of a long prompt took the recorded pattern as a
    # new block beside the arena's chunks: peaks 137-299 MiB higher on SmolLM2 at 6,000 tokens.
    model = Model.load(tiny_export("llama_tiny", "fp32"), provider="cpu", threads=1,
                       sessions=sessions)
    engine = model.engine
    found = {id(s): s for s in (engine.prefill_session, engine.decode_session)}
    assert len(found) == (1 if sessions == "single" else 2)
    for session in found.values():
        assert session.get_providers() == ["CPUExecutionProvider"]
        assert session.get_session_options().enable_mem_pattern is False
    # and the model still generates, twice over the same prompt (the pattern's case)
    first = model.generate([1, 2, 3, 4, 5], max_new_tokens=4, temperature=0.0)
    assert model.generate([1, 2, 3, 4, 5], max_new_tokens=4, temperature=0.0).token_ids == first.token_ids

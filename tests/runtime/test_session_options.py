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


def test_every_run_names_its_graph_id_so_onnxruntime_finds_it_without_an_exception(
        tiny_export, monkeypatch):
    # onnxruntime's Python run()/run_with_iobinding look "gpu_graph_id" up at each run; a
    # missing entry costs an exception raised and caught, 42 us a run (0.3 us when set).
    import onnxruntime as ort

    seen = []
    real = ort.InferenceSession.run_with_iobinding

    def recording(self, iobinding, run_options=None):
        seen.append(run_options)
        return real(self, iobinding, run_options)

    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", recording)
    model = Model.load(tiny_export("llama_tiny", "fp32"), provider="cpu", threads=1)
    gen = model.generator(model.options(max_new_tokens=3, temperature=0.0))
    gen.append_tokens([1, 2, 3])
    list(gen.events())
    assert len(seen) >= 3  # the prompt, then decode steps
    assert all(o is not None and o.get_run_config_entry("gpu_graph_id") == "0" for o in seen)
    assert all(o.log_severity_level == 3 for o in seen)

"""Provider selection: CUDA only when a CUDA session really comes up, clear errors otherwise."""

from __future__ import annotations

import pytest

from llm_onnx.errors import ProviderError
from llm_onnx.runtime.core import providers


@pytest.fixture(autouse=True)
def fresh_probe():
    providers.cuda_status.cache_clear()
    yield
    providers.cuda_status.cache_clear()


class FakeSession:
    def __init__(self, came_up: list[str]):
        self._providers = came_up

    def get_providers(self):
        return self._providers


def fake_ort(monkeypatch, listed, came_up, log=""):
    monkeypatch.setattr(providers.ort, "get_available_providers", lambda: listed)

    def session(model, so, providers=None):
        import os

        if log:
            os.write(2, log.encode())
        return FakeSession(came_up)

    monkeypatch.setattr(providers.ort, "InferenceSession", session)


def test_listed_but_falling_back_means_cpu_with_the_reason(monkeypatch):
    fake_ort(monkeypatch, [providers.CUDA, providers.CPU], [providers.CPU],
             log="Failed to load library libonnxruntime_providers_cuda.so with error: "
                 "libcublasLt.so.13: cannot open shared object file\n")
    assert providers.resolve_provider("auto") == providers.CPU
    with pytest.raises(ProviderError) as e:
        providers.resolve_provider("cuda")
    assert "libcublasLt.so.13" in str(e.value) and "--provider cpu" in str(e.value)


def test_cuda_chosen_when_the_session_comes_up(monkeypatch):
    fake_ort(monkeypatch, [providers.CUDA, providers.CPU], [providers.CUDA, providers.CPU])
    assert providers.resolve_provider("auto") == providers.CUDA
    assert providers.resolve_provider("cuda") == providers.CUDA


def test_build_without_cuda(monkeypatch):
    fake_ort(monkeypatch, [providers.CPU], [providers.CPU])
    assert providers.resolve_provider("auto") == providers.CPU
    with pytest.raises(ProviderError, match="no CUDA execution provider"):
        providers.resolve_provider("cuda")


def test_cpu_always_works_and_unknown_is_refused():
    assert providers.resolve_provider("cpu") == providers.CPU
    with pytest.raises(ProviderError, match="choose one of auto, cpu, cuda"):
        providers.resolve_provider("tpu")


def test_real_probe_on_this_machine_is_quiet(capfd):
    """The real onnxruntime here: whatever the answer, ORT's own log lines do not leak."""
    usable, reason = providers.cuda_status()
    assert isinstance(usable, bool) and reason
    captured = capfd.readouterr()
    assert "onnxruntime" not in captured.err

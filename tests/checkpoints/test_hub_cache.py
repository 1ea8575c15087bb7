"""--config NAME without --checkpoint finds the vendor's weights in the local Hugging Face cache
(never the network), and says what to do when they are absent."""

from __future__ import annotations

import pytest

from llm_onnx.errors import ConfigError
from llm_onnx.cli import resolve_checkpoint
from llm_onnx.families import get_config
from tests.hf_models import save_hf_checkpoint


@pytest.fixture(autouse=True)
def no_real_cache(tmp_path, monkeypatch):
    """Never read the real ~/.cache/huggingface: HOME and every cache variable point into
    tmp_path unless a test sets its own."""
    monkeypatch.setenv("HOME", str(tmp_path / "home-dir"))
    for name in ("HF_HUB_CACHE", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)


def test_finds_the_snapshot_in_hf_hub_cache(tmp_path, monkeypatch):
    repo = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    snapshot = repo / "snapshots" / "0123abc"
    save_hf_checkpoint(get_config("smollm2_tiny"), snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    ckpt = resolve_checkpoint("smollm2_135m", None, False)
    assert ckpt.path == snapshot and ckpt.name == "smollm2_135m"


def test_absent_weights_offer_the_two_ways_out(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    with pytest.raises(ConfigError) as e:
        resolve_checkpoint("qwen3_8b", None, False)
    msg = str(e.value)
    assert "Qwen/Qwen3-8B is not in the Hugging Face cache" in msg
    assert "--checkpoint PATH" in msg and "--random-weights" in msg and "\n" not in msg


def test_finds_the_snapshot_under_home_when_no_variable_is_set(tmp_path):
    """The last place looked in is ~/.cache/huggingface/hub (HOME is tmp_path's here)."""
    repo = tmp_path / "home-dir" / ".cache" / "huggingface" / "hub" / \
        "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    snapshot = repo / "snapshots" / "feed42"
    save_hf_checkpoint(get_config("smollm2_tiny"), snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("feed42")
    assert resolve_checkpoint("smollm2_135m", None, False).path == snapshot

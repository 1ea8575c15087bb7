"""--config NAME without --checkpoint reads the vendor's weights from the local Hugging Face cache
(found as huggingface_hub finds it), and says what to do when they are absent and downloads are
off. Downloads themselves: tests/checkpoints/test_hub.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llm_onnx.checkpoints.hub_cache import hub_cache_dir
from llm_onnx.cli import resolve_checkpoint
from llm_onnx.errors import CheckpointError
from llm_onnx.families import get_config
from tests.hf_models import save_hf_checkpoint

CACHE_VARIABLES = ("HF_HUB_CACHE", "HF_HOME", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME",
                   "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture(autouse=True)
def no_real_cache(tmp_path, monkeypatch):
    """Never read the real ~/.cache/huggingface nor reach a hub: HOME and every cache variable
    point into tmp_path unless a test sets its own, HF_ENDPOINT at a closed local port."""
    monkeypatch.setenv("HOME", str(tmp_path / "home-dir"))
    for name in CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


def _snapshot(cache, commit="0123abc"):
    repo = cache / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    snapshot = repo / "snapshots" / commit
    save_hf_checkpoint(get_config("smollm2_tiny"), snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_finds_the_snapshot_in_hf_hub_cache(tmp_path, monkeypatch):
    snapshot = _snapshot(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    ckpt = resolve_checkpoint("smollm2_135m", None, False)
    assert ckpt.path == snapshot and ckpt.name == "smollm2_135m"


def test_absent_weights_offline_say_how_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    with pytest.raises(CheckpointError) as e:
        resolve_checkpoint("qwen3_8b", None, False, offline=True)
    msg = str(e.value)
    assert f"Qwen/Qwen3-8B is not in the Hugging Face cache ({tmp_path / 'empty'})" in msg
    assert "`hf download Qwen/Qwen3-8B --include '*.safetensors'" in msg
    assert "drop --offline" in msg and "\n" not in msg


def test_finds_the_snapshot_under_home_when_no_variable_is_set(tmp_path):
    """The last place looked in is ~/.cache/huggingface/hub (HOME is tmp_path's here)."""
    snapshot = _snapshot(tmp_path / "home-dir" / ".cache" / "huggingface" / "hub", "feed42")
    assert resolve_checkpoint("smollm2_135m", None, False, offline=True).path == snapshot


def test_finds_the_snapshot_under_xdg_cache_home(tmp_path, monkeypatch):
    """`hf download` with XDG_CACHE_HOME set puts the files under it: found there."""
    snapshot = _snapshot(tmp_path / "xdg" / "huggingface" / "hub")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_checkpoint("smollm2_135m", None, False, offline=True).path == snapshot


def test_an_incomplete_snapshot_is_not_taken(tmp_path, monkeypatch):
    """A snapshot without its weights (a download cut short, `hf download org/name
    config.json`) is not a checkpoint: offline, that is the not-cached error."""
    snapshot = _snapshot(tmp_path / "hub")
    (snapshot / "model.safetensors").unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointError, match="is not in the Hugging Face cache"):
        resolve_checkpoint("smollm2_135m", None, False, offline=True)


def test_hf_hub_offline_is_read_as_huggingface_hub_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "yes")
    with pytest.raises(CheckpointError, match=r"\(HF_HUB_OFFLINE=1\).*unset HF_HUB_OFFLINE"):
        resolve_checkpoint("qwen3_8b", None, False)


@pytest.mark.parametrize("env", [
    {},
    {"XDG_CACHE_HOME": "{tmp}/xdg"},
    {"XDG_CACHE_HOME": "{tmp}/xdg", "HF_HOME": "{tmp}/hfhome"},
    {"HF_HOME": "~/hfhome"},
    {"HF_HOME": "{tmp}/hfhome", "HF_HUB_CACHE": "{tmp}/hubcache"},
    {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy", "XDG_CACHE_HOME": "{tmp}/xdg"},
    {"HUGGINGFACE_HUB_CACHE": "{tmp}/legacy", "HF_HUB_CACHE": "$HOME/vars"},
])
def test_the_cache_folder_is_huggingface_hubs(env, tmp_path, monkeypatch):
    """The same folder as huggingface_hub's own constants compute for the same environment (a
    fresh process: they are read once, at import)."""
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = "import json, huggingface_hub.constants as c; print(json.dumps(c.HF_HUB_CACHE))"
    theirs = json.loads(subprocess.run([sys.executable, "-c", code], check=True,
                                       capture_output=True, text=True).stdout)
    assert str(hub_cache_dir()) == theirs

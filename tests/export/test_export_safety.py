"""Exports are atomic: a failure or interruption leaves no partial folder and never damages an
existing one; bad output paths are refused with one-line errors."""

from __future__ import annotations

import errno
import json

import pytest

from llm_onnx.checkpoints import open_checkpoint, random_checkpoint
from llm_onnx.errors import ExportError
from llm_onnx.export import ExportOptions, export_model
from llm_onnx.export import weights as weights_module
from llm_onnx.families import get_config
from tests.hf_models import save_hf_checkpoint

FAST = ExportOptions(precision="fp32", max_seq_len=32, validate=False)


@pytest.fixture
def ckpt():
    return random_checkpoint(get_config("llama_tiny"), "llama_tiny")


def leftovers(parent):
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_interrupt_leaves_nothing_and_keeps_the_old_folder(ckpt, tmp_path, monkeypatch):
    out = tmp_path / "model"
    export_model(ckpt, out, FAST, progress=False)
    before = json.loads((out / "manifest.json").read_text())["files"]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("llm_onnx.export.export.write_weights", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_model(ckpt, out, FAST, force=True, progress=False)
    assert json.loads((out / "manifest.json").read_text())["files"] == before
    assert leftovers(tmp_path) == []


def test_failure_leaves_no_partial_folder(ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr("llm_onnx.export.export.write_weights",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        export_model(ckpt, tmp_path / "model", FAST, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_disk_full_is_a_clear_error(ckpt, tmp_path, monkeypatch):
    real_open = open

    class FullFile:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += 1
            if self.n > 3:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return FullFile(f) if str(path).endswith("weights.data") and "w" in mode else f

    monkeypatch.setattr(weights_module, "open", fake_open, raising=False)
    with pytest.raises(ExportError, match=r"cannot write weights \(No space left on device\); is the disk full"):
        export_model(ckpt, tmp_path / "model", FAST, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_existing_out_needs_force(ckpt, tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="already exists; pass --force"):
        export_model(ckpt, out, FAST, progress=False)
    assert (out / "keep.txt").read_text() == "mine"
    export_model(ckpt, out, FAST, force=True, progress=False)
    assert not (out / "keep.txt").exists() and (out / "manifest.json").is_file()
    assert leftovers(tmp_path) == []


def test_out_inside_checkpoint_folder_is_refused(tmp_path):
    folder = tmp_path / "hf"
    save_hf_checkpoint(get_config("llama_tiny"), folder)
    with pytest.raises(ExportError, match="inside the checkpoint folder"):
        export_model(open_checkpoint(folder), folder / "onnx", FAST, progress=False)


def scratch_gate(monkeypatch, experts: int | None = None) -> None:
    """The parity gate takes its scratch route for any model: the first 100 vocabulary rows (and
    the first ``experts`` experts)."""
    import llm_onnx.export.parity as export_module

    monkeypatch.setattr(export_module, "FULL_VALIDATION_PARAMS", 0)
    monkeypatch.setattr(export_module, "SCRATCH_VOCAB", 100)
    if experts is not None:
        monkeypatch.setattr(export_module, "SCRATCH_EXPERTS", experts)


def test_large_models_are_checked_on_a_scratch_export(tmp_path, monkeypatch):
    """Above the size limit the gate exports the first layer, first vocabulary rows and first
    experts of the same checkpoint and compares those."""
    scratch_gate(monkeypatch, experts=2)
    ckpt = random_checkpoint(get_config("qwen3_moe_tiny"), "moe")
    out = export_model(ckpt, tmp_path / "m", ExportOptions(precision="fp32", max_seq_len=32),
                       progress=False)
    parity = json.loads((out / "manifest.json").read_text())["parity"]
    assert parity["scope"].startswith("first 1 layer(s), first 100 vocabulary rows, first 2 experts")
    assert parity["kl_divergence"] < 1e-6 and leftovers(tmp_path) == []


def test_the_scratch_export_of_a_hybrid_keeps_its_first_layers_kind(tmp_path, monkeypatch):
    """A hybrid model (Qwen3.5-MoE, linear then full attention) too large to validate whole:
    the scratch config cuts layer_types with the layers (its first layer is linear attention)."""
    scratch_gate(monkeypatch, experts=2)
    ckpt = random_checkpoint(get_config("qwen3_5_moe_tiny"), "hybrid")
    out = export_model(ckpt, tmp_path / "m", ExportOptions(precision="int4", max_seq_len=32),
                       progress=False)
    parity = json.loads((out / "manifest.json").read_text())["parity"]
    assert parity["scope"].startswith("first 1 layer(s), first 100 vocabulary rows, first 2 experts")
    assert parity["greedy_agreement"] > 0 and leftovers(tmp_path) == []


def test_the_scratch_export_of_gemma4_cuts_its_experts_and_per_layer_tables(tmp_path, monkeypatch):
    """Gemma 4 too large to validate whole: the scratch model's first layer keeps the first
    experts of its stacked tensors (and their per-expert scales, the router's rows) and the
    first layer's share of the packed per-layer table and its projection."""
    import llm_onnx.export.parity as export_module

    monkeypatch.setattr(export_module, "FULL_VALIDATION_PARAMS", 0)
    monkeypatch.setattr(export_module, "SCRATCH_VOCAB", 100)
    monkeypatch.setattr(export_module, "SCRATCH_EXPERTS", 2)
    ckpt = random_checkpoint(get_config("gemma4_tiny"), "gemma4")
    out = export_model(ckpt, tmp_path / "m", ExportOptions(precision="int8", max_seq_len=32),
                       progress=False)
    parity = json.loads((out / "manifest.json").read_text())["parity"]
    assert parity["scope"].startswith("first 1 layer(s), first 100 vocabulary rows, first 2 experts")
    assert parity["greedy_agreement"] > 0 and leftovers(tmp_path) == []


def test_the_scratch_export_of_an_awq_model_reuses_its_calibration(tmp_path, monkeypatch):
    """int4 from a float source (awq): the scratch model's first layer gets the scales decided
    for the whole model (it has no layer 1 to fold into) and passes the gate."""
    scratch_gate(monkeypatch)
    ckpt = random_checkpoint(get_config("llama_tiny"), "tiny")
    out = export_model(ckpt, tmp_path / "m", ExportOptions(precision="int4", max_seq_len=32),
                       progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"]["quantization"]["method"] == "awq"
    assert manifest["parity"]["scope"].startswith("first 1 layer(s), first 100 vocabulary rows")
    assert leftovers(tmp_path) == []

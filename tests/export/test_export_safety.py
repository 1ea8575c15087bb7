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
    export_model(ckpt, out, FAST, progress=False)
    with pytest.raises(ExportError, match="already exists; pass --force"):
        export_model(ckpt, out, FAST, progress=False)
    first = (out / "manifest.json").stat().st_mtime_ns
    export_model(ckpt, out, FAST, force=True, progress=False)  # a model folder: replaced
    assert (out / "manifest.json").stat().st_mtime_ns != first
    assert leftovers(tmp_path) == []


def test_force_never_replaces_a_folder_of_the_users(ckpt, tmp_path):
    """The data loss of issue 61: --force replaced any folder, notes.txt and all."""
    out = tmp_path / "userdir"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"userdir: it is not a model folder made by "
                                          r"`llm-onnx export` \(it holds notes.txt\)"):
        export_model(ckpt, out, FAST, force=True, progress=False)
    assert (out / "notes.txt").read_text() == "mine" and leftovers(tmp_path) == []


def test_force_replaces_an_empty_folder(ckpt, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    export_model(ckpt, out, FAST, force=True, progress=False)
    assert (out / "manifest.json").is_file()


def test_force_refuses_a_model_folder_holding_more_than_its_manifest_lists(ckpt, tmp_path):
    out = tmp_path / "model"
    export_model(ckpt, out, FAST, progress=False)
    (out / "my-eval.txt").write_text("results")
    with pytest.raises(ExportError, match="also holds my-eval.txt, which its manifest.json"):
        export_model(ckpt, out, FAST, force=True, progress=False)
    assert (out / "my-eval.txt").read_text() == "results"


def test_force_refuses_a_foreign_manifest(ckpt, tmp_path):
    out = tmp_path / "other"
    out.mkdir()
    (out / "manifest.json").write_text('{"name": "some other tool"}')
    with pytest.raises(ExportError, match="not a model folder made by"):
        export_model(ckpt, out, FAST, force=True, progress=False)
    assert (out / "manifest.json").read_text() == '{"name": "some other tool"}'


def test_force_refuses_the_working_directory(ckpt, tmp_path, monkeypatch):
    """`--out . --force` would have deleted the folder the user stands in; even an exported
    model folder is not replaced from inside it."""
    export_model(ckpt, tmp_path / "model", FAST, progress=False)
    for where, out in [(tmp_path, "."), (tmp_path / "model", "."), (tmp_path / "model", "..")]:
        monkeypatch.chdir(where)
        with pytest.raises(ExportError, match="working directory"):
            export_model(ckpt, out, FAST, force=True, progress=False)
    assert (tmp_path / "model" / "manifest.json").is_file()


def test_force_refuses_a_symlink(ckpt, tmp_path):
    export_model(ckpt, tmp_path / "model", FAST, progress=False)
    link = tmp_path / "current"
    link.symlink_to(tmp_path / "model", target_is_directory=True)
    for force in (False, True):
        with pytest.raises(ExportError, match="is a symbolic link"):
            export_model(ckpt, link, FAST, force=force, progress=False)
    assert link.is_symlink() and (tmp_path / "model" / "manifest.json").is_file()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ExportError, match="is a symbolic link"):
        export_model(ckpt, dangling, FAST, progress=False)


def test_a_file_put_into_out_during_the_export_is_kept(ckpt, tmp_path, monkeypatch):
    """The check is made again when the new folder is complete: a file the user put into the
    old folder meanwhile is not deleted with it."""
    from llm_onnx.export import export as export_module

    out = tmp_path / "model"
    export_model(ckpt, out, FAST, progress=False)
    real = export_module.write_folder

    def write_and_meddle(*args, **kwargs):
        (out / "notes.txt").write_text("written meanwhile")
        return real(*args, **kwargs)

    monkeypatch.setattr(export_module, "write_folder", write_and_meddle)
    with pytest.raises(ExportError, match="changed while the export ran"):
        export_model(ckpt, out, FAST, force=True, progress=False)
    assert (out / "notes.txt").read_text() == "written meanwhile"
    assert (out / "manifest.json").is_file() and leftovers(tmp_path) == []


def test_cli_refuses_out_before_opening_the_checkpoint(tmp_path, monkeypatch):
    """A bad --out fails at once, not after the checkpoint has been read."""
    from click.testing import CliRunner

    from llm_onnx.cli import main

    def never(*args, **kwargs):
        raise AssertionError("the checkpoint was opened")

    monkeypatch.setattr("llm_onnx.checkpoints.load.open_checkpoint", never)
    monkeypatch.setattr("llm_onnx.checkpoints.load.random_checkpoint", never)
    out = tmp_path / "userdir"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for extra in ([], ["--force"]):
        result = CliRunner().invoke(main, ["export", "--config", "llama_tiny", "--random-weights",
                                           "--out", str(out), *extra])
        assert result.exit_code == 1, result.output
        assert "already exists" in result.output if not extra else \
            "not a model folder made by" in result.output
    assert (out / "notes.txt").read_text() == "mine"


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

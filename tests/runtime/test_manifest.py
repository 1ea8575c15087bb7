"""The runtime refuses model folders it cannot trust: missing files, unknown format versions,
checksum mismatches."""

from __future__ import annotations

import json
import shutil

import pytest

from llm_onnx.errors import ModelFolderError
from llm_onnx.model_folder import FORMAT_VERSION, load_manifest
from llm_onnx.runtime import Model


@pytest.fixture
def folder(tiny_export, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(tiny_export("llama_tiny", "fp32"), copy)
    return copy


def edit_manifest(folder, change):
    data = json.loads((folder / "manifest.json").read_text())
    change(data)
    (folder / "manifest.json").write_text(json.dumps(data))


def test_good_folder_loads(folder):
    assert load_manifest(folder).num_layers == 2


def test_missing_file(folder):
    (folder / "decode.onnx").unlink()
    with pytest.raises(ModelFolderError, match="decode.onnx listed in manifest.json is missing"):
        Model.load(folder)


def test_unknown_format_version(folder):
    edit_manifest(folder, lambda d: d.update(format_version=99))
    with pytest.raises(ModelFolderError, match=f"format_version 99; this llm-onnx reads version "
                                               f"{FORMAT_VERSION}. Re-export"):
        Model.load(folder)


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d.pop("kv_cache"), "lacks the 'kv_cache' section"),
    (lambda d: d["kv_cache"].update(num_layers="two"), "section 'kv_cache'.*expected int"),
    (lambda d: d["tokenizer"].update(colour="red"), "tokenizer.colour is not a known field"),
    (lambda d: d["config"].update(hidden_size=-1), "section 'config'"),
])
def test_a_malformed_section_is_named(folder, change, fragment):
    edit_manifest(folder, change)
    with pytest.raises(ModelFolderError, match=fragment) as e:
        Model.load(folder)
    assert "\n" not in str(e.value)


def test_the_runtime_reads_special_tokens_from_the_manifest(folder):
    """The tokenizer section carries what chat templates need; tokenizer_config.json is not
    read again at load time."""
    edit_manifest(folder, lambda d: d["tokenizer"].update(special_tokens={"bos_token": "<s>"}))
    (folder / "tokenizer_config.json").unlink(missing_ok=True)
    edit_manifest(folder, lambda d: d["files"].pop("tokenizer_config.json", None))
    assert Model.load(folder).special_tokens == {"bos_token": "<s>"}


def test_checksum_mismatch(folder):
    data = bytearray((folder / "weights.data").read_bytes())
    data[100] ^= 0xFF
    (folder / "weights.data").write_bytes(bytes(data))
    with pytest.raises(ModelFolderError, match="weights.data does not match its sha256"):
        Model.load(folder)


def test_truncated_file(folder):
    with open(folder / "weights.data", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelFolderError, match="weights.data has 1000 bytes"):
        Model.load(folder)


def test_not_a_model_folder(tmp_path):
    with pytest.raises(ModelFolderError, match="no manifest.json"):
        Model.load(tmp_path)
    with pytest.raises(ModelFolderError, match="no such model folder"):
        Model.load(tmp_path / "nope")


def test_listed_file_outside_the_folder(folder):
    edit_manifest(folder, lambda d: d["files"].update({"../escape": {"bytes": 1, "sha256": "x"}}))
    with pytest.raises(ModelFolderError, match="outside the model folder"):
        Model.load(folder)


def test_a_recurrent_state_it_does_not_know_is_refused(tiny_export, tmp_path):
    """A hybrid folder names its state's kind; a kind this runtime has no cache for is refused in
    one line naming it, before any session runs a graph with state it would not carry."""
    folder = tmp_path / "hybrid"
    shutil.copytree(tiny_export("qwen3_5_tiny", "fp32"), folder)
    state = load_manifest(folder).recurrent_state
    assert state is not None and state.kind == "gated_delta" and state.layers == (0,)
    edit_manifest(folder, lambda d: d["recurrent_state"].update(kind="mamba2"))
    with pytest.raises(ModelFolderError, match="recurrent state of kind 'mamba2'.*knows "
                                               "gated_delta") as e:
        Model.load(folder)
    assert "\n" not in str(e.value)

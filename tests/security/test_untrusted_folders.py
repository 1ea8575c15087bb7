"""Untrusted model folders: external-data paths that escape the folder (relative, absolute,
symlinks) are refused before ONNX Runtime opens anything."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from llm_onnx.errors import ModelFolderError
from llm_onnx.runtime import Model
from llm_onnx.runtime.core.onnx_check import check_external_data, external_data_locations


def graph_with_location(folder, location: str, in_attribute: bool = False):
    tensor = numpy_helper.from_array(np.zeros(4, np.float32), "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        tensor.external_data.add(key=k, value=v)
    if in_attribute:  # hidden in a Constant node inside an If branch
        const = helper.make_node("Constant", [], ["c"], value=tensor)
        branch = helper.make_graph([const], "b", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])])
        node = helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    else:
        node = helper.make_node("Identity", ["w"], ["y"])
        graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                                  [tensor])
    path = folder / "m.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    return path


@pytest.mark.parametrize("in_attribute", [False, True])
@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_escaping_locations_are_refused(tmp_path, location, in_attribute):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    path = graph_with_location(folder, location, in_attribute)
    assert set(external_data_locations(path.read_bytes())) == {location}
    with pytest.raises(ModelFolderError, match="outside the model folder"):
        check_external_data(path)


def test_symlink_out_of_the_folder_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    os.symlink(tmp_path / "secret.bin", folder / "weights.data")
    path = graph_with_location(folder, "weights.data")
    with pytest.raises(ModelFolderError, match="outside the model folder"):
        check_external_data(path)


def test_locations_of_a_real_export_match_onnx(tiny_export):
    path = tiny_export("qwen3_tiny", "fp32") / "prefill.onnx"
    proto = onnx.load(str(path), load_external_data=False)
    expected = [dict((e.key, e.value) for e in t.external_data)["location"]
                for t in proto.graph.initializer if t.external_data]
    assert external_data_locations(path.read_bytes()) == expected
    check_external_data(path)


def test_model_refuses_a_tampered_folder(tiny_export, tmp_path):
    """A folder whose graph points outside it is refused even with a matching manifest."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_export("llama_tiny", "fp32"), folder)
    (tmp_path / "secret.bin").write_bytes(os.urandom(1 << 20))
    proto = onnx.load(str(folder / "prefill.onnx"), load_external_data=False)
    for init in proto.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../secret.bin"
    onnx.save(proto, str(folder / "prefill.onnx"))
    manifest = json.loads((folder / "manifest.json").read_text())
    from llm_onnx.model_folder import sha256_file

    manifest["files"]["prefill.onnx"] = {"bytes": (folder / "prefill.onnx").stat().st_size,
                                         "sha256": sha256_file(folder / "prefill.onnx")}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelFolderError, match="outside the model folder"):
        Model.load(folder)


def test_manifest_file_that_is_a_link_outside(tiny_export, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_export("llama_tiny", "fp32"), folder)
    outside = tmp_path / "tokenizer_config.json"
    target = folder / "generation_config.json"
    assert target.is_file()  # every export writes it; the test must not pass vacuously
    shutil.move(target, outside)
    os.symlink(outside, target)
    with pytest.raises(ModelFolderError, match="outside the model folder"):
        Model.load(folder)

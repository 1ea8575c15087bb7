"""Exporting a checkpoint with a vision tower (tiny random Qwen3-VL, Qwen3.5-MoE saved by
transformers): vision.onnx beside prefill and decode, sharing weights.data, a manifest that
says how the folder takes images, the parity gate over the encoder and a prompt with an image;
``--text-only`` keeps today's text folder. (Greedy tokens against transformers through every
path: tests/runtime/test_images.py.)"""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from llm_onnx import model_folder as mf
from llm_onnx.cli import main
from llm_onnx.model_folder import load_manifest
from tests.vision_models import IMAGE_PAD, PROCESSOR


@pytest.mark.parametrize("kind", ["qwen3_vl", "qwen3_5_moe"])
def test_folder_takes_images(vision_export, kind):
    folder = vision_export(kind)
    manifest = load_manifest(folder)
    assert manifest.modalities == ("text", "image")
    assert json.loads((folder / mf.MANIFEST).read_text())["format_version"] == mf.IMAGES_VERSION
    images = manifest.images
    assert images.image_token_id == IMAGE_PAD and images.placeholder == "<|image_pad|>"
    assert images.processor["patch_size"] == PROCESSOR["patch_size"]
    assert images.weights == "float32"
    assert (images.vision.deepstack_layers > 0) == (kind == "qwen3_vl")
    prefill = [t.name for t in manifest.graphs["prefill"].inputs]
    assert mf.image_input_names(kind == "qwen3_vl") == \
        [n for n in prefill if n in mf.image_input_names(True)]
    vision = onnx.load(folder / mf.VISION, load_external_data=False)
    assert [i.name for i in vision.graph.input] == list(mf.VISION_INPUTS)
    locations = {e.value for t in vision.graph.initializer for e in t.external_data
                 if e.key == "location"}
    assert locations == {mf.WEIGHTS}  # the tower's tensors in the one weights file
    parity = manifest.parity
    assert parity.vision_relative_diff < 1e-5
    assert parity.image_prompt_greedy_agreement == 1.0 and parity.image_prompt_kl_divergence < 1e-6


def test_text_only_keeps_the_text_folder(vision_checkpoint, tmp_path):
    _, checkpoint = vision_checkpoint("qwen3_vl")
    out = tmp_path / "text"
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(checkpoint), "--text-only",
                                       "--precision", "fp32", "--max-seq-len", "64",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(out)
    assert manifest.modalities == ("text",) and manifest.images is None
    assert not (out / mf.VISION).exists()
    assert json.loads((out / mf.MANIFEST).read_text())["format_version"] == mf.FORMAT_VERSION
    assert mf.POSITION_IDS not in [t.name for t in manifest.graphs["prefill"].inputs]

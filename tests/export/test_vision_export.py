"""Exporting a checkpoint with a vision tower (tiny random Qwen3-VL, Qwen3.5, Gemma 3, Gemma 4
saved by transformers): vision.onnx beside prefill and decode, sharing weights.data, a manifest
that says how the folder takes images, the parity gate over the encoder and a prompt with an
image; ``--text-only`` keeps today's text folder. (Greedy tokens against transformers through
every path: tests/runtime/test_images.py, which shares these exports.)"""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from llm_onnx import model_folder as mf
from llm_onnx.checkpoints import open_checkpoint
from llm_onnx.cli import main
from llm_onnx.errors import ConfigError
from llm_onnx.export import ExportOptions
from llm_onnx.export.plan import ExportPlan
from llm_onnx.model_folder import load_manifest
from tests import gemma_vision_models as gv
from tests.vision_models import IMAGE_PAD, PROCESSOR

# what each kind's folder takes: its placeholder, prefill's image inputs, vision.onnx's inputs
KINDS = {
    "qwen3_vl": ("<|image_pad|>", mf.image_input_names(True), mf.VISION_INPUTS),
    "qwen3_5": ("<|image_pad|>", mf.image_input_names(False), mf.VISION_INPUTS),
    "gemma3": ("<start_of_image>", mf.image_input_names(False, mrope=False, attend=True),
               (mf.PIXEL_VALUES,)),
    "gemma4": ("<|image|>", mf.image_input_names(False, mrope=False, attend=True),
               (mf.PIXEL_VALUES, mf.PIXEL_POSITION_IDS)),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_folder_takes_images(vision_export, kind):
    folder = vision_export(kind)
    manifest = load_manifest(folder)
    assert manifest.modalities == ("text", "image")
    assert json.loads((folder / mf.MANIFEST).read_text())["format_version"] == mf.IMAGES_VERSION
    images = manifest.images
    placeholder, image_inputs, vision_inputs = KINDS[kind]
    assert images.placeholder == placeholder
    assert images.image_token_id == (gv.IMAGE if kind.startswith("gemma") else IMAGE_PAD)
    assert images.vision.kind == {"gemma3": "gemma3", "gemma4": "gemma4"}.get(kind, "qwen_vl")
    if not kind.startswith("gemma"):
        assert images.processor["patch_size"] == PROCESSOR["patch_size"]
    assert images.weights == "float32"
    for graph in ("prefill", "decode"):
        names = [t.name for t in manifest.graphs[graph].inputs]
        assert [n for n in names if n in mf.image_input_names(True, attend=True)] == image_inputs
    vision = onnx.load(folder / mf.VISION, load_external_data=False)
    assert [i.name for i in vision.graph.input] == list(vision_inputs)
    locations = {e.value for t in vision.graph.initializer for e in t.external_data
                 if e.key == "location"}
    assert locations == {mf.WEIGHTS}  # the tower's tensors in the one weights file
    parity = manifest.parity
    assert parity.vision_relative_diff < 1e-5
    assert parity.image_prompt_greedy_agreement == 1.0 and parity.image_prompt_kl_divergence < 1e-6


def test_qwen3_5_moe_reads_its_tower(vision_checkpoint):
    """Qwen3.5-MoE's checkpoint: its tower read as Qwen3.5's, the text model MoE (the export
    path is Qwen3.5's above, the experts' the text exports')."""
    _, folder = vision_checkpoint("qwen3_5_moe")
    checkpoint = open_checkpoint(folder)
    assert checkpoint.config.moe is not None and checkpoint.vision.kind == "qwen_vl"
    assert checkpoint.vision.image_token_id == IMAGE_PAD


def test_gemma_image_layers_refuse_an_int8_cache(vision_checkpoint):
    checkpoint = open_checkpoint(vision_checkpoint("gemma3")[1])
    with pytest.raises(ConfigError, match="--kv-cache float, or --text-only"):
        ExportPlan.build(checkpoint.config, ExportOptions(precision="int8", kv_cache="int8"),
                         64, vision=checkpoint.vision)


def test_text_only_keeps_the_text_folder(vision_checkpoint, tmp_path):
    _, checkpoint = vision_checkpoint("qwen3_vl")
    out = tmp_path / "text"
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(checkpoint), "--text-only",
                                       "--precision", "fp32", "--max-seq-len", "64",
                                       "--no-validate", "--out", str(out)])  # (a text gate)
    assert result.exit_code == 0, result.output
    manifest = load_manifest(out)
    assert manifest.modalities == ("text",) and manifest.images is None
    assert not (out / mf.VISION).exists()
    assert json.loads((out / mf.MANIFEST).read_text())["format_version"] == mf.FORMAT_VERSION
    assert mf.POSITION_IDS not in [t.name for t in manifest.graphs["prefill"].inputs]

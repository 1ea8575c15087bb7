"""Model folders exported before ModelConfig grouped its fields still load: their manifests hold
the config flat (every field at the top, the residual topology as the booleans
``post_layernorm``, ``parallel_attn``, ``sandwich_norm``), and ModelConfig.from_dict reads that
form too.

The fixtures (tests/fixtures/manifests/) were written by the exporter of that time: the flat
config of every preset, and two whole manifests of tiny fp32 exports (Gemma 4: every switch of
its layer; OPT-350m: post-norm layers and narrower embeddings)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llm_onnx.families import PRESETS
from llm_onnx.model_folder import MANIFEST, Manifest
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.runtime import Model

FIXTURES = Path(__file__).parent.parent / "fixtures" / "manifests"
OLD_CONFIGS = json.loads((FIXTURES / "v2_preset_configs.json").read_text())


@pytest.mark.parametrize("name", sorted(OLD_CONFIGS))
def test_a_flat_config_reads_as_the_preset_it_was(name):
    assert "attention" not in OLD_CONFIGS[name]  # (the flat form indeed)
    assert ModelConfig.from_dict(OLD_CONFIGS[name]) == PRESETS[name]


def test_the_new_form_reads_back():
    for cfg in PRESETS.values():
        assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("arch", ["gemma4_tiny", "opt_350m_tiny"])
def test_an_old_manifest_parses_whole(arch):
    manifest = Manifest.from_json((FIXTURES / f"v2_{arch}.json").read_text())
    assert manifest.config == PRESETS[arch]


def test_two_topologies_at_once_are_refused():
    from llm_onnx.errors import ConfigError

    old = dict(OLD_CONFIGS["falcon_tiny"], post_layernorm=True)
    with pytest.raises(ConfigError, match="topologies at once"):
        ModelConfig.from_dict(old)


@pytest.mark.parametrize("arch", ["gemma4_tiny", "opt_350m_tiny"])
def test_a_folder_with_an_old_config_section_generates_the_same(arch, tiny_export, tmp_path):
    """A folder whose manifest holds the old flat config loads and generates exactly what the
    folder does with its own."""
    new = tiny_export(arch, "fp32")
    old = tmp_path / "old"
    shutil.copytree(new, old)
    data = json.loads((old / MANIFEST).read_text())
    data["config"] = json.loads((FIXTURES / f"v2_{arch}.json").read_text())["config"]
    (old / MANIFEST).write_text(json.dumps(data))
    prompt = [5, 17, 3, 42, 9]
    want = Model.load(new, provider="cpu", threads=1).generate(prompt, max_new_tokens=6,
                                                               temperature=0.0)
    got = Model.load(old, provider="cpu", threads=1).generate(prompt, max_new_tokens=6,
                                                              temperature=0.0)
    assert got.token_ids == want.token_ids

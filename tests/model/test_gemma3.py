"""Gemma 3's config.json mapping: the interleaving from sliding_window_pattern or layer_types,
RoPE bases from the classic fields or transformers 5's rope_parameters, refused variants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_onnx.errors import ConfigError
from llm_onnx.families import from_hf_config, get_config

VENDOR = json.loads((Path(__file__).parents[1] / "fixtures" / "configs" / "gemma3_1b.json").read_text())


def test_every_sixth_layer_is_full_with_the_global_base():
    cfg = from_hf_config(VENDOR)
    full = [i for i in range(cfg.num_hidden_layers) if cfg.layer_window(i) is None]
    assert full == [5, 11, 17, 23]  # gemma-3-1b: 5 sliding layers, then a full one
    assert not cfg.layer_is_local(5) and cfg.layer_is_local(0)
    assert (cfg.rope_theta, cfg.positions.rope_local_theta, cfg.layer_window(0)) == (1e6, 1e4, 512)
    assert cfg.attention.attention_scale == 256 ** -0.5
    assert cfg.embedding.embedding_multiplier == 1152 ** 0.5


def test_transformers_5_rope_parameters_and_layer_types_read_the_same():
    data = {k: v for k, v in VENDOR.items()
            if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling",
                         "sliding_window_pattern")}
    data["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    data["layer_types"] = get_config("gemma3_1b").layer_types
    cfg = from_hf_config(data)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert cfg.replace(rope_scaling=None) == get_config("gemma3_1b")


@pytest.mark.parametrize("change, message", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
])
def test_variants_we_do_not_build_are_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        from_hf_config({**VENDOR, **change}, "gemma/config.json")

"""transformers' per_layer_config (written by 5.23 and later for any family): Gemma 4's full
layers' head size and KV heads read from it, whatever it leaves out taken from the model, and
any other family's override refused in one line naming the layer and the field."""

from __future__ import annotations

import json

import pytest

from llm_onnx.errors import ConfigError
from llm_onnx.families import from_hf_config, get_config, load_hf_config
from tests.hf_models import hf_config_dict, save_hf_checkpoint

GEMMA4 = get_config("gemma4_tiny")


@pytest.mark.parametrize("changes", [
    {}, {"global_head_dim": None},
    {"global_head_dim": None, "attention_k_eq_v": False, "num_global_key_value_heads": None},
], ids=["own-head-size", "same-head-size", "nothing-differs"])
def test_gemma4_configs_saved_by_transformers_read_back(changes, tmp_path):
    """The last case is written as per_layer_config {} with global_head_dim null, which was
    read as a head size of 512."""
    cfg = GEMMA4.replace(**changes)
    save_hf_checkpoint(cfg, tmp_path)
    assert "per_layer_config" in json.loads((tmp_path / "config.json").read_text())
    assert load_hf_config(tmp_path) == cfg


def test_gemma4_per_layer_config_rules():
    data = hf_config_dict(GEMMA4)
    full = [i for i, t in enumerate(GEMMA4.layer_types) if t == "full_attention"]
    data["per_layer_config"] = {str(full[0]): {"head_dim": 32}}  # the other full layer: 16
    with pytest.raises(ConfigError, match="one head size and KV head count"):
        from_hf_config(data)
    data["per_layer_config"] = {"0": {"head_dim": 32}}  # a sliding layer
    with pytest.raises(ConfigError, match=r"overrides sliding layer\(s\) \[0\]"):
        from_hf_config(data)


def test_other_families_refuse_an_override_they_cannot_build():
    data = hf_config_dict(get_config("llama_tiny"))
    data["per_layer_config"] = {"1": {"intermediate_size": data["intermediate_size"]}}
    assert from_hf_config(data) == get_config("llama_tiny")  # the model's own value: the same
    data["per_layer_config"] = {"1": {"intermediate_size": 99}}
    with pytest.raises(ConfigError, match=r"per_layer_config gives layer 1 its own "
                                          r"intermediate_size \(99; the model's is \d+\)") as e:
        from_hf_config(data)
    assert "\n" not in str(e.value)
    data["per_layer_config"] = {"x": {}}
    with pytest.raises(ConfigError, match="keys must be layer indices"):
        from_hf_config(data)

"""SmolLM3's NoPE layers and config mapping, against transformers' SmolLM3.

The ladder's generic rungs run smollm3_tiny like every family (a rotating layer, then a NoPE
one); this module shows that its NoPE layer is what they compare (the same checkpoint read as
if every layer rotated, or with the flags swapped, is far from transformers), that config.json
is read with transformers' own defaults (our reading of a sparse file equals our reading of the
file transformers' SmolLM3Config writes from it), and what is refused.
"""

from __future__ import annotations

import pytest
import torch

from llm_onnx.checkpoints import build_model, open_checkpoint
from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.families import from_hf_config, get_config
from tests.tolerances import TORCH_VS_HF_FP32


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    b, t = ids.shape
    seqlens = torch.full((b,), t - 1, dtype=torch.int32)
    return model(ids, seqlens, torch.tensor(t, dtype=torch.int32), *model.new_cache(b, t))[0]


def test_the_nope_layer_is_what_transformers_runs(tiny_hf):
    hf, folder = tiny_hf("smollm3_tiny")
    ckpt = open_checkpoint(folder)
    assert ckpt.config.positions.no_rope_layers == (1, 0) == tuple(hf.config.no_rope_layers)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(ids).logits
        assert (_logits(build_model(ckpt.config, ckpt.source), ids) - want).abs().max() \
            <= TORCH_VS_HF_FP32
        for flags in (None, (1, 1), (0, 1), (0, 0)):  # every layer rotating, swapped, none
            other = build_model(ckpt.config.replace(no_rope_layers=flags), ckpt.source)
            assert (_logits(other, ids) - want).abs().max() > 100 * TORCH_VS_HF_FP32, flags


def _as_transformers_writes_it(data: dict) -> dict:
    from transformers import SmolLM3Config

    fields = {k: v for k, v in data.items() if k != "architectures"}
    return dict(SmolLM3Config(**fields).to_dict(), architectures=["SmolLM3ForCausalLM"])


SPARSE = {"architectures": ["SmolLM3ForCausalLM"], "vocab_size": 256, "hidden_size": 64,
          "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4}


@pytest.mark.parametrize("extra", [
    {},  # transformers' defaults: NoPE every 4th layer, 4 KV heads, tied, base 2e6, 32k context
    {"no_rope_layer_interval": 3, "num_key_value_heads": 2, "rope_theta": 5e6},
    {"no_rope_layers": [1, 0, 1, 1, 0, 1, 0, 0]},  # "at least" one per layer: the first six
    {"use_sliding_window": True, "sliding_window": 8},  # windows on the NoPE layers
    {"use_sliding_window": True, "sliding_window": 8, "no_rope_layer_interval": 2,
     "layer_types": ["sliding_attention", "full_attention"] * 3},
    {"use_sliding_window": False, "sliding_window": 8},  # no window after all
    {"tie_word_embeddings": False, "max_position_embeddings": 1024, "mlp_bias": True,
     "attention_bias": True, "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                 "rope_theta": 1e5}},
], ids=["defaults", "interval", "longer-list", "window", "layer-types", "window-off", "rest"])
def test_config_json_is_read_with_transformers_defaults(extra):
    data = {**SPARSE, **extra}
    ours = from_hf_config(data)
    assert ours == from_hf_config(_as_transformers_writes_it(data))
    nope = ours.positions.no_rope_layers
    assert nope is not None and len(nope) == 6 and 0 in nope


def test_defaults_spelled_out():
    cfg = from_hf_config(SPARSE)
    assert cfg.positions.no_rope_layers == (1, 1, 1, 0, 1, 1)
    assert (cfg.num_key_value_heads, cfg.tie_word_embeddings, cfg.rope_theta,
            cfg.max_position_embeddings, cfg.sliding_window) == (4, True, 2e6, 32768, None)
    window = from_hf_config({**SPARSE, "use_sliding_window": True, "sliding_window": 8})
    assert [window.layer_window(i) for i in range(6)] == [None, None, None, 8, None, None]
    assert [window.layer_uses_rope(i) for i in range(6)] == [True] * 3 + [False] + [True] * 2


@pytest.mark.parametrize("extra, message", [
    ({"no_rope_layers": [1, 0, 1]}, "no_rope_layers must list 1 .* for each of the 6 layers"),
    ({"no_rope_layers": [1, 0, 1, 1, 2, 1]}, "no_rope_layers must give 1 .* or 0"),
    ({"layer_types": ["sliding_attention"] * 6}, "do not give them a window"),
])
def test_bad_configs_are_one_line_errors(extra, message):
    with pytest.raises(ConfigError, match=message) as e:
        from_hf_config({**SPARSE, **extra})
    assert "\n" not in str(e.value)


def test_the_twins_config_round_trips():
    from llm_onnx.families.smollm3 import hf_config

    tiny = get_config("smollm3_tiny")
    sliding = tiny.replace(sliding_window=4, layer_types=("full_attention", "sliding_attention"))
    for cfg in (tiny, sliding, get_config("smollm3_3b")):
        assert from_hf_config(_as_transformers_writes_it(hf_config(cfg))) == cfg


def test_a_scaled_gguf_is_refused():
    from llm_onnx.families.smollm3 import smollm3_gguf_fields

    class Meta:
        path = "s.gguf"

        def get(self, key, default=None):
            return {"rope.scaling.type": "yarn"}.get(key, default)

    with pytest.raises(CheckpointError, match="s.gguf: smollm3.rope.scaling.type 'yarn'"):
        smollm3_gguf_fields(Meta())


def test_the_parity_gates_scratch_model_keeps_the_first_layers_flags():
    from llm_onnx.export.parity import _scratch_config

    small = _scratch_config(get_config("smollm3_3b"))
    assert small.num_hidden_layers == 1 and small.positions.no_rope_layers == (1,)

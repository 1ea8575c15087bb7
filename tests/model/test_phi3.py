"""Phi-3 / Phi-4-mini beyond the registry's rungs: LongRoPE in both regimes, partial rotary through
the unfused RotaryEmbedding op, the fused checkpoint tensors, the config mapping.

The registry-driven tests run phi3_tiny with tables no longer than its original context (short
factors). Here a variant whose context (64) is four times its original one (16) runs both
regimes against transformers where they agree (rule in docs/architectures.md): tables of 16
positions with sequences within 16 (short factors), tables of 64 with whole sequences longer
than 16 (long factors), with transformers' derived attention factor sqrt(1 + ln 4 / ln 16).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import load_file, save_file

from llm_onnx.checkpoints import build_model, open_checkpoint
from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.export import ExportOptions, export_model
from llm_onnx.families import from_hf_config, get_config
from llm_onnx.modeling.decoder import Fusion
from llm_onnx.modeling.rope import attention_factor, inverse_frequencies, uses_long_factors
from tests.hf_models import save_hf_checkpoint
from tests.ort_helpers import Graphs, batch_logits, hf_logits
from tests.perturb import perturbed
from tests.tolerances import ORT_FP32, TORCH_VS_HF_FP32

ORIGINAL = 16
CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"


def long_context_config():
    cfg = get_config("phi3_tiny")
    scaling = {k: v for k, v in cfg.rope_scaling.items() if k != "attention_factor"}
    scaling["original_max_position_embeddings"] = ORIGINAL
    return cfg.replace(rope_scaling=scaling)  # max_position_embeddings stays 64


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cfg = long_context_config()
    folder = tmp_path_factory.mktemp("phi3_long")
    hf = save_hf_checkpoint(cfg, folder, seed=3)
    assert open_checkpoint(folder).config == cfg
    return hf, folder, cfg


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (2, n), generator=torch.Generator().manual_seed(seed))


def logits(model, x: torch.Tensor) -> torch.Tensor:
    b, t = x.shape
    out = model(x, torch.full((b,), t - 1, dtype=torch.int32), torch.tensor(t, dtype=torch.int32),
                *model.new_cache(b, t))
    return out[0]


def test_regime_rule_and_attention_factor():
    cfg = long_context_config()
    assert not uses_long_factors(cfg, ORIGINAL) and uses_long_factors(cfg, ORIGINAL + 1)
    assert attention_factor(cfg) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))
    assert attention_factor(get_config("phi3_tiny")) == 1.2  # given in the config
    assert attention_factor(get_config("llama_tiny")) == 1.0


def test_phi4_mini_tables_equal_transformers():
    """The real config: our inverse frequencies and attention factor equal transformers' LongRoPE
    init (short within 4096 positions, long beyond)."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    data = json.loads((CONFIGS / "phi4_mini.json").read_text())
    cfg = from_hf_config(data)
    hf_cfg = transformers.Phi3Config.from_dict(data)
    init = ROPE_INIT_FUNCTIONS["longrope"]
    short, short_scale = init(hf_cfg, None)
    long, long_scale = init(hf_cfg, None, seq_len=4097)
    assert cfg.rotary_dim == 96 and short.shape == (48,)
    assert torch.allclose(inverse_frequencies(cfg, 4096).float(), short, rtol=1e-6)
    assert torch.allclose(inverse_frequencies(cfg, 131_072).float(), long, rtol=1e-6)
    assert not torch.allclose(short, long)
    assert attention_factor(cfg) == pytest.approx(short_scale) == pytest.approx(long_scale)
    assert attention_factor(cfg) > 1.1


@pytest.mark.parametrize("fusion", [Fusion(), Fusion(rotary=False)], ids=str)
def test_both_regimes_match_transformers(pair, fusion):
    hf, folder, cfg = pair
    ckpt = open_checkpoint(folder)
    short_tables = build_model(cfg, ckpt.source, fusion=fusion, max_positions=ORIGINAL)
    long_tables = build_model(cfg, ckpt.source, fusion=fusion)  # 64 positions
    within, beyond = ids(ORIGINAL, 0), ids(40, 1)
    with torch.no_grad():
        hf_within, hf_beyond = hf(within).logits, hf(beyond).logits
        assert (logits(short_tables, within) - hf_within).abs().max() <= TORCH_VS_HF_FP32
        assert (logits(long_tables, beyond) - hf_beyond).abs().max() <= TORCH_VS_HF_FP32
        # The twins: the other regime's tables are far off (the regimes differ at all).
        assert (logits(long_tables, within) - hf_within).abs().max() > 100 * TORCH_VS_HF_FP32
        assert (logits(short_tables, beyond[:, :ORIGINAL]) - hf_beyond[:, :ORIGINAL]).abs().max() \
            > 100 * TORCH_VS_HF_FP32


@pytest.mark.parametrize("fuse_rotary", [True, False])
def test_onnx_long_factors_match_transformers(pair, fuse_rotary, tmp_path):
    """Exported with 64 positions (> 16): prompts of 30 and 20 tokens and 8 decode steps, every
    transformers forward longer than 16, so long factors throughout. Unfused, the partial rotary
    runs through RotaryEmbedding, which must be told its rotary_embedding_dim."""
    hf, folder, cfg = pair
    out = tmp_path / "onnx"
    export_model(open_checkpoint(folder), out,
                 ExportOptions(precision="fp32", max_seq_len=64, fuse_rotary=fuse_rotary),
                 progress=False)
    rng = np.random.default_rng(4)
    lens, steps = [30, 20], 8
    rows = [rng.integers(0, cfg.vocab_size, n + steps).tolist() for n in lens]
    got = batch_logits(Graphs(out), rows, lens, steps)
    want = hf_logits(hf, rows, lens, steps)
    assert max(np.abs(g - w).max() for g, w in zip(got, want)) <= ORT_FP32
    with perturbed(hf) as moved:
        assert max(np.abs(g - m).max()
                   for g, m in zip(got, hf_logits(moved, rows, lens, steps))) > ORT_FP32
    nodes = onnx.load(str(out / "prefill.onnx"), load_external_data=False).graph.node
    rotary = [n for n in nodes if n.op_type == "RotaryEmbedding"]
    assert len(rotary) == (0 if fuse_rotary else 2 * cfg.num_hidden_layers)
    for n in rotary:
        dim = next(onnx.helper.get_attribute_value(a) for a in n.attribute
                   if a.name == "rotary_embedding_dim")
        assert dim == cfg.rotary_dim == 16 < cfg.head_dim


def rewrite(folder: Path, name: str, shape: tuple[int, ...]) -> None:
    tensors = load_file(folder / "model.safetensors")
    tensors[name] = torch.zeros(shape)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("tensor, what", [("self_attn.qkv_proj.weight", "q, k and v"),
                                          ("mlp.gate_up_proj.weight", "gate and up")])
def test_fused_tensor_of_the_wrong_size_is_named(pair, tmp_path, tensor, what):
    _, good, cfg = pair
    folder = tmp_path / "ckpt"
    shutil.copytree(good, folder)
    name = f"model.layers.1.{tensor}"
    rewrite(folder, name, (7, cfg.hidden_size))
    with pytest.raises(CheckpointError) as e:
        build_model(cfg, open_checkpoint(folder).source)
    msg = str(e.value)
    assert f"tensor {name} ({what} fused) has shape [7, {cfg.hidden_size}]" in msg
    assert "model.safetensors" in msg and "\n" not in msg


def phi3_json(**changes) -> dict:
    data = json.loads((CONFIGS / "phi4_mini.json").read_text())
    data.update(changes)
    return data


def test_config_mapping():
    phi4 = get_config("phi4_mini")
    # Phi-3-mini-128k's first configs said "su" (and some "yarn"): transformers reads longrope.
    su = dict(phi3_json()["rope_scaling"], type="su")
    assert from_hf_config(phi3_json(rope_scaling=su)) == phi4
    # transformers 5's form: rope_parameters with theta and partial rotary inside.
    params = dict(phi3_json()["rope_scaling"], rope_type="longrope", rope_theta=10_000.0,
                  partial_rotary_factor=0.75)
    del params["type"]
    assert from_hf_config(phi3_json(rope_scaling=None, rope_parameters=params,
                                    partial_rotary_factor=None)) == phi4
    # No biases in Phi-3 whatever attention_bias says (transformers does not read it).
    assert not from_hf_config(phi3_json(attention_bias=True)).attention.attention_bias


@pytest.mark.parametrize("scaling, fragment", [
    ({"type": "dynamic", "factor": 2.0},
     "rope type 'dynamic' is not supported for Phi3ForCausalLM"),
    ({"type": "longrope", "short_factor": [1.0] * 47, "long_factor": [1.0] * 48},
     "rope_scaling.short_factor must list 48 numbers"),
])
def test_bad_rope_config(scaling, fragment):
    with pytest.raises(ConfigError) as e:
        from_hf_config(phi3_json(rope_scaling=scaling), source="x/config.json")
    assert fragment in str(e.value) and "x/config.json" in str(e.value)

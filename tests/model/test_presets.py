"""Presets equal the vendors' config.json (vendored in tests/fixtures/configs/), and lookups of
unknown names fail with a helpful one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_onnx.errors import ConfigError
from llm_onnx.families import PRESETS as REGISTRY
from llm_onnx.families import TINY, from_hf_config, get_config
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.shapes import num_parameters

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"
# Every full-size preset of every family module; each has its vendor's config.json vendored.
REAL = sorted(set(REGISTRY) - TINY)


@pytest.mark.parametrize("name", REAL)
def test_preset_equals_vendor_config(name):
    fixture = CONFIGS / f"{name}.json"
    assert fixture.is_file(), f"vendor the {name} preset's config.json as {fixture}"
    vendor = json.loads(fixture.read_text())
    assert get_config(name) == from_hf_config(vendor)


def test_vendor_figures_spot_check():
    """A few figures restated from the vendors' cards, independent of from_hf_config."""
    q = get_config("qwen3_8b")
    assert (q.vocab_size, q.hidden_size, q.num_hidden_layers, q.head_dim, q.intermediate_size) == (
        151936, 4096, 36, 128, 12288)
    m = get_config("qwen3_30b_a3b")
    assert m.moe is not None and (m.moe.num_experts, m.moe.num_experts_per_tok,
                                  m.moe.moe_intermediate_size, m.moe.norm_topk_prob) == (128, 8, 768, True)
    assert get_config("smollm2_135m").tie_word_embeddings
    assert not get_config("llama3_8b").tie_word_embeddings
    assert 8.0e9 < num_parameters(q) < 8.4e9
    assert 30.0e9 < num_parameters(m) < 31.0e9
    # Parameter counts as the vendors' model cards / transformers report them.
    assert num_parameters(get_config("gpt2")) == 124_439_808
    assert num_parameters(get_config("bloom_560m")) == 559_214_592
    assert num_parameters(get_config("falcon_7b")) == 6_921_720_704
    assert num_parameters(get_config("mistral_7b")) == 7_241_732_096
    assert num_parameters(get_config("opt_125m")) == 125_239_296
    assert num_parameters(get_config("opt_350m")) == 331_196_416
    assert get_config("mistral_7b").sliding_window == 4096
    # gpt-oss's model card: 20.91B and 116.83B parameters; 24 and 36 layers, 32 and 128 experts
    assert num_parameters(get_config("gpt_oss_20b")) == 20_914_757_184
    assert num_parameters(get_config("gpt_oss_120b")) == 116_829_156_672
    oss = get_config("gpt_oss_20b")
    assert (oss.num_hidden_layers, oss.moe.num_experts, oss.moe.num_experts_per_tok,
            oss.sliding_window, oss.layer_types[:2]) == (24, 32, 4, 128,
                                                        ("sliding_attention", "full_attention"))
    # Gemma 4's model card: 25.2B (26B-A4B) and 30.7B (31B) parameters
    assert round(num_parameters(get_config("gemma4_26b_a4b")) / 1e9, 1) == 25.2
    assert round(num_parameters(get_config("gemma4_31b")) / 1e9, 1) == 30.7
    g = get_config("gemma4_26b_a4b")
    assert (g.layer_kv_shape(0), g.layer_kv_shape(5), g.moe.num_experts,
            g.moe.num_experts_per_tok) == ((8, 256), (2, 512), 128, 8)
    f = get_config("falcon_7b")
    assert (f.num_key_value_heads, f.residual.topology, f.positions.position_embedding_type) == (
        1, "parallel", "rope")
    b = get_config("bloom_560m")
    assert (b.positions.position_embedding_type, b.embedding.embedding_layernorm,
            b.norm.norm_type) == ("alibi", True, "layer")


def test_every_family_has_a_tiny_preset():
    families = {c.architecture for c in REGISTRY.values()}
    tiny_families = {REGISTRY[n].architecture for n in TINY}
    assert families == tiny_families


def test_every_family_module_is_registered():
    """The registry lists its families explicitly (families.FAMILIES): a family module whose
    record is left out of it would be a family nobody can load, so each module of the package
    but the helpers must declare a FAMILY that is there."""
    import importlib
    import pkgutil

    from llm_onnx import families

    helpers = {"family", "layouts", "qwen_vision", "gemma_vision"}
    for info in pkgutil.iter_modules(families.__path__):
        if info.name not in helpers:
            module = importlib.import_module(f"llm_onnx.families.{info.name}")
            assert module.FAMILY in families.FAMILIES, f"{info.name}.FAMILY is not in FAMILIES"


# transformers fixes head_dim = hidden / heads for these; GPT-2 and BLOOM also kv heads = heads.
FIXED_HEAD_DIM = {"GPT2LMHeadModel", "BloomForCausalLM", "FalconForCausalLM", "OPTForCausalLM",
                  "XGLMForCausalLM"}
MULTI_HEAD_ONLY = {"GPT2LMHeadModel", "BloomForCausalLM", "OPTForCausalLM", "XGLMForCausalLM"}


def test_tiny_presets_expose_layout_bugs():
    for name in TINY:
        cfg = REGISTRY[name]
        if cfg.architecture not in FIXED_HEAD_DIM:
            assert cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size, name
        if cfg.architecture not in MULTI_HEAD_ONLY:
            assert cfg.num_key_value_heads < cfg.num_attention_heads, name
        assert cfg.head_dim % 8 == 0, name  # GroupQueryAttention needs it
        assert cfg.vocab_size == 256, name  # the tests' word and byte-level tokenizers
    mistral = REGISTRY["mistral_tiny"]
    assert mistral.sliding_window is not None and mistral.sliding_window < 8
    assert REGISTRY["bloom_tiny"].num_attention_heads & (REGISTRY["bloom_tiny"].num_attention_heads - 1)
    assert any(REGISTRY[n].tie_word_embeddings for n in TINY)
    assert any(not REGISTRY[n].tie_word_embeddings for n in TINY)


def test_unknown_name_suggests_the_closest():
    with pytest.raises(ConfigError) as e:
        get_config("qwen3_8B")
    msg = str(e.value)
    assert "Did you mean 'qwen3_8b'?" in msg and "llama3_8b" in msg and "\n" not in msg


def test_manifest_round_trip():
    for cfg in REGISTRY.values():
        assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize("bad, fragment", [
    ({"architectures": ["GPTBigCodeForCausalLM"], "hidden_size": 8}, "architecture 'GPTBigCodeForCausalLM'"),
    ({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}, "missing field 'num_attention_heads'"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
      "vocab_size": 4, "num_hidden_layers": 1, "intermediate_size": 4}, "missing field 'num_experts'"),
    ({"architectures": ["FalconForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
      "vocab_size": 4, "num_hidden_layers": 1, "new_decoder_architecture": True},
     "new_decoder_architecture=true is not supported for FalconForCausalLM"),
    ({"architectures": ["FalconForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
      "vocab_size": 4, "num_hidden_layers": 1, "alibi": True}, "alibi=true is not supported"),
    ({"architectures": ["BloomForCausalLM"], "hidden_size": 8, "n_head": 2, "vocab_size": 4,
      "n_layer": 1, "apply_residual_connection_post_layernorm": True},
     "apply_residual_connection_post_layernorm=true"),
    ({"architectures": ["GPT2LMHeadModel"], "n_embd": 8, "n_head": 2, "vocab_size": 4,
      "n_layer": 1, "n_positions": 8, "scale_attn_by_inverse_layer_idx": True},
     "scale_attn_by_inverse_layer_idx=true"),
    ({"architectures": ["GPT2LMHeadModel"], "n_embd": 8, "vocab_size": 4}, "missing field 'n_head'"),
])
def test_bad_config_json(bad, fragment):
    with pytest.raises(ConfigError) as e:
        from_hf_config(bad, source="x/config.json")
    assert fragment in str(e.value) and "x/config.json" in str(e.value)

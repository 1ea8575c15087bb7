"""gpt-oss's checkpoints: MXFP4 experts decoded exactly (against a numpy reference written from
the OCP spec, every e2m1 code and every e8m0 exponent, and against transformers' own decoder);
OpenAI's released layout (``*_blocks`` / ``*_scales``) and llama.cpp's ``gpt-oss`` GGUF (gate
and up split, MXFP4 re-packed as its converter does) read into the model transformers runs on
the same weights; bad files refused naming the file and the tensor or field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from llm_onnx.checkpoints import build_model, open_checkpoint
from llm_onnx.checkpoints.mxfp4 import MXFP4Experts, decode_mxfp4
from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.families import get_config
from tests import mxfp4_ref
from tests.checkpoints.test_gguf_families import _byte_symbols, logits
from tests.hf_models import make_hf_model
from tests.perturb import perturbed
from tests.tolerances import TORCH_VS_HF_FP32


def test_mxfp4_decodes_every_code_at_every_exponent():
    """All 256 bytes (both nibbles: all 16 codes, signs and zeros) at all 256 exponents."""
    blocks = np.tile(np.arange(256, dtype=np.uint8).reshape(1, 16, 16), (256, 1, 1))
    scales = np.tile(np.arange(256, dtype=np.uint8)[:, None], (1, 16))
    got = decode_mxfp4(torch.from_numpy(blocks), torch.from_numpy(scales)).numpy()
    want = mxfp4_ref.decode_hf(blocks, scales)
    assert got.dtype == np.float32 and got.shape == (256, 512)
    with np.errstate(over="ignore"):  # 2 * 2^127 and up: beyond float32, inf in both
        assert np.array_equal(got[:255], want[:255].astype(np.float32))  # exact, every value
    assert np.array_equal(np.signbit(got[:255]), np.signbit(want[:255]))  # -0.0 stays -0.0
    assert np.isnan(got[255]).all()  # e8m0 255: NaN in the spec
    # byte 3's low nibble (1.5) is value 6; byte 1's (0.5) value 2; 2^-127 is a subnormal
    assert got[0, 6] == 1.5 * 2.0 ** -127 and got[254, 2] == 0.5 * 2.0 ** 127


def test_mxfp4_decode_equals_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (3, 8, 4, 16), dtype=np.uint8)  # (E, rows, G, 16)
    scales = rng.integers(0, 255, (3, 8, 4), dtype=np.uint8)
    theirs = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                        dtype=torch.float32)  # (E, K, rows): their parameter
    experts = MXFP4Experts(torch.from_numpy(blocks), torch.from_numpy(scales))
    assert experts.shape == tuple(theirs.shape)
    for e in range(3):  # one expert at a time
        assert torch.equal(experts[e], theirs[e])


def _mxfp4_model(cfg, seed: int = 7):
    """A transformers model of ``cfg`` whose experts hold MXFP4 values, and its experts' MXFP4
    codes per layer: {layer: {"gate_up_proj": (blocks, scales), "down_proj": ...}} in the
    released files' (E, rows, G, 16) layout."""
    hf = make_hf_model(cfg, seed)
    packed: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            packed[i] = {}
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(layer.mlp.experts, name)  # (E, in, out)
                blocks, scales = mxfp4_ref.quantize(p.transpose(1, 2).numpy())
                packed[i][name] = (blocks, scales)
                decoded = mxfp4_ref.decode_hf(blocks, scales)  # (E, out, in)
                p.copy_(torch.from_numpy(decoded).transpose(1, 2))
    return hf, packed


def save_released_layout(hf, packed, folder: Path) -> Path:
    """The model as OpenAI's files hold it: experts as MXFP4 blocks and scales, the rest float,
    ``quantization_config`` mxfp4."""
    hf.save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    for i, parts in packed.items():
        for name, (blocks, scales) in parts.items():
            prefix = f"model.layers.{i}.mlp.experts.{name}"
            del tensors[prefix]
            tensors[f"{prefix}_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
            tensors[f"{prefix}_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
    save_file(tensors, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


IDS = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(0))


def assert_matches(hf, ckpt) -> None:
    ours = build_model(ckpt.config, ckpt.source)
    with torch.no_grad():
        want, got = hf(IDS).logits, logits(ours, IDS)
        assert (got - want).abs().max().item() <= TORCH_VS_HF_FP32
        assert want.abs().max().item() > 0.1
        with perturbed(hf) as moved:  # the comparison can fail
            assert (got - moved(IDS).logits).abs().max().item() > TORCH_VS_HF_FP32


def test_released_mxfp4_checkpoint_matches_transformers(tmp_path):
    cfg = get_config("gpt_oss_tiny")
    hf, packed = _mxfp4_model(cfg)
    ckpt = open_checkpoint(save_released_layout(hf, packed, tmp_path / "oss"))
    assert ckpt.config == cfg
    assert isinstance(ckpt.source.inner.get("model.layers.0.mlp.experts.gate_up_proj"),
                      MXFP4Experts)  # decoded an expert at a time, never the layer at once
    assert_matches(hf, ckpt)


def write_gpt_oss_gguf(folder: Path, packed, cfg, path: Path) -> Path:
    """The released-layout checkpoint in ``folder`` as llama.cpp's converter writes it: gate and
    up split from the interleaved rows, MXFP4 re-packed into GGML blocks, the rest float32."""
    t = load_file(str(folder / "model.safetensors"))
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    moe = cfg.moe
    for key, value in (("context_length", cfg.max_position_embeddings),
                       ("embedding_length", cfg.hidden_size), ("block_count", cfg.num_hidden_layers),
                       ("feed_forward_length", cfg.intermediate_size),
                       ("head_count", cfg.num_attention_heads),
                       ("head_count_kv", cfg.num_key_value_heads), ("key_length", cfg.head_dim),
                       ("value_length", cfg.head_dim), ("expert_count", moe.num_experts),
                       ("expert_used_count", moe.num_experts_per_tok),
                       ("expert_feed_forward_length", moe.moe_intermediate_size),
                       ("sliding_window", cfg.sliding_window), ("vocab_size", cfg.vocab_size)):
        getattr(writer, f"add_{key}")(value)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    scaling = cfg.rope_scaling
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(scaling["factor"])
    writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    writer.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
    writer.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(_byte_symbols()[:255] + ["Ġt"])
    writer.add_token_types([1] * 256)
    writer.add_token_merges(["Ġ t"])

    def add(name: str, x) -> None:
        writer.add_tensor(name, np.ascontiguousarray(np.asarray(x, dtype=np.float32)))

    add("token_embd.weight", t["model.embed_tokens.weight"])
    add("output_norm.weight", t["model.norm.weight"])
    add("output.weight", t["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}", f"blk.{i}"
        add(f"{b}.attn_norm.weight", t[f"{p}.input_layernorm.weight"])
        add(f"{b}.post_attention_norm.weight", t[f"{p}.post_attention_layernorm.weight"])
        add(f"{b}.attn_sinks.weight", t[f"{p}.self_attn.sinks"])
        for ours, theirs in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                             ("o_proj", "attn_output")):
            for kind in ("weight", "bias"):
                add(f"{b}.{theirs}.{kind}", t[f"{p}.self_attn.{ours}.{kind}"])
        add(f"{b}.ffn_gate_inp.weight", t[f"{p}.mlp.router.weight"])
        add(f"{b}.ffn_gate_inp.bias", t[f"{p}.mlp.router.bias"])
        bias = t[f"{p}.mlp.experts.gate_up_proj_bias"]
        add(f"{b}.ffn_gate_exps.bias", bias[:, 0::2])
        add(f"{b}.ffn_up_exps.bias", bias[:, 1::2])
        add(f"{b}.ffn_down_exps.bias", t[f"{p}.mlp.experts.down_proj_bias"])
        blocks, scales = packed[i]["gate_up_proj"]
        for name, rows in (("ffn_gate_exps", slice(0, None, 2)), ("ffn_up_exps", slice(1, None, 2))):
            writer.add_tensor(f"{b}.{name}.weight",
                              mxfp4_ref.hf_to_ggml(blocks[:, rows], scales[:, rows]),
                              raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        writer.add_tensor(f"{b}.ffn_down_exps.weight", mxfp4_ref.hf_to_ggml(*packed[i]["down_proj"]),
                          raw_dtype=gguf.GGMLQuantizationType.MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_llama_cpp_gguf_with_mxfp4_experts_matches_transformers(tmp_path):
    # llama.cpp's kernel fixes the clamp at 7 (no metadata says it): the tiny preset's 0.5 is
    # a transformers config field only
    tiny = get_config("gpt_oss_tiny")
    cfg = tiny.replace(moe=dataclasses.replace(tiny.moe, swiglu_limit=7.0))
    hf, packed = _mxfp4_model(cfg)
    folder = save_released_layout(hf, packed, tmp_path / "oss")
    ckpt = open_checkpoint(write_gpt_oss_gguf(folder, packed, cfg, tmp_path / "oss.gguf"))
    assert ckpt.config == cfg  # from the GGUF metadata alone
    assert {t.tensor_type.name for t in ckpt.source.inner.reader.tensors
            if t.name.endswith("_exps.weight")} == {"MXFP4"}
    assert_matches(hf, ckpt)


def test_bad_mxfp4_checkpoints_name_the_file_and_the_tensor(tmp_path):
    cfg = get_config("gpt_oss_tiny")
    hf, packed = _mxfp4_model(cfg)
    folder = save_released_layout(hf, packed, tmp_path / "oss")
    tensors = load_file(str(folder / "model.safetensors"))
    scales = "model.layers.1.mlp.experts.down_proj_scales"
    saved = tensors.pop(scales)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor model\.layers\.1\.mlp"
                                              r"\.experts\.down_proj_blocks .* no " + scales):
        open_checkpoint(folder)
    tensors[scales] = saved[:, :1].contiguous()  # a wrong shape
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: MXFP4 tensor .*down_proj"):
        open_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"config\.json: quantization_config\.quant_method "
                                          r"'bitsandbytes' is not supported"):
        open_checkpoint(folder)


def test_int4_experts_from_mxfp4_search_mxfp4s_own_grids():
    """int4 blocks cannot hold every MXFP4 block, but they can hold one whose values are whole
    units (scale 1 unit) or at most 3 units (scale half a unit): the search over
    MXFP4_EXPERT_FACTORS finds both exactly, the default factors neither; and the writer takes
    those factors for a checkpoint read through MXFP4Source only."""
    from llm_onnx.checkpoints.mxfp4 import MXFP4Source, reads_mxfp4
    from llm_onnx.checkpoints.sources import RandomSource
    from llm_onnx.export import quant
    from llm_onnx.export.weights import EXPERT_FACTORS, MXFP4_EXPERT_FACTORS

    rng = np.random.default_rng(0)
    unit = 2.0 ** -5
    whole = rng.choice([0, 1, -1, 2, -2, 3, -3, 4, -4, 6, -6], 32)
    whole[0] = 6
    small = rng.choice([0, 0.5, -0.5, 1, -1, 1.5, -1.5, 2, -2, 3, -3], 32)
    small[0] = 3
    w = torch.tensor(np.stack([whole, small]) * unit, dtype=torch.float32)
    for factors, exact in ((MXFP4_EXPERT_FACTORS, True), (EXPERT_FACTORS, False)):
        q, s, _ = quant.quantize(w, 4, 32, search=True, factors=factors)
        error = (quant.dequantize(q, s, 4, 32) - w).abs().max(-1).values
        # exact up to the least-squares refit's float rounding; else a step's fraction off
        assert bool((error <= 1e-6 * unit).all()) if exact else bool((error > 0.1 * unit).all())
    cfg = get_config("gpt_oss_tiny")
    assert not reads_mxfp4(RandomSource(cfg))
    assert reads_mxfp4(type("View", (), {"source": MXFP4Source(RandomSource(cfg))})())

"""benchmarks/full_size/random_gguf.py: the random GGUF llama.cpp is timed on (Qwen3-MoE, Qwen3.5-MoE,
gpt-oss, SmolLM3) has the preset's shape. Read back by gguf-py and by our own GGUF loader (config,
every tensor the family needs, the vocabulary), with weights of the magnitude it claims; and
the full-size run's --config check and --layers cut for a dense preset."""

from __future__ import annotations

import argparse

import gguf
import numpy as np
import pytest

from benchmarks.full_size import __main__ as full_size
from benchmarks.full_size import random_gguf as moe_gguf
from benchmarks.full_size import stages, workers
from llm_onnx.checkpoints import open_checkpoint
from llm_onnx.families import get_config


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_random_gguf_has_the_configs_shape(qtype, tmp_path):
    cfg = get_config("qwen3_moe_tiny").replace(vocab_size=512)
    path = moe_gguf.write_random_gguf(cfg, qtype, tmp_path / f"tiny-{qtype}.gguf")
    reader = gguf.GGUFReader(str(path))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == qtype and types["output.weight"] == qtype
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["output_norm.weight"] == "F32"
    ckpt = open_checkpoint(path)  # our loader: the family's tensors, shapes and tokenizer
    assert ckpt.config == cfg
    w = ckpt.source.get("model.layers.0.mlp.experts.3.down_proj.weight").numpy()
    assert w.shape == (cfg.hidden_size, cfg.moe.moe_intermediate_size)
    levels = 8 if qtype == "Q4_0" else 128
    assert np.isfinite(w).all() and 0.004 * levels * 0.5 < np.abs(w).max() <= 0.008 * levels
    assert len(ckpt.tokenizer_files["tokenizer.json"]) > 0


@pytest.mark.parametrize("layers", [2, 3])
def test_random_qwen35moe_gguf_reads_back_with_its_layer_kinds(layers, tmp_path):
    """qwen35moe (Qwen3.5/3.6-MoE): the hybrid's tensors in llama.cpp's types (linear-attention
    projections quantized, the conv, ssm_a, ssm_dt, norms and both routers float32), the keys
    llama.cpp requires, and our loader recovering the config (layer kinds included, for a
    config cut to fewer layers as python -m benchmarks.full_size --layers makes) with sane values."""
    base = get_config("qwen3_5_moe_tiny")
    kinds = (base.layer_types * 2)[:layers]  # (linear, full) repeated: 2 -> L F, 3 -> L F L
    cfg = base.replace(vocab_size=512, num_hidden_layers=layers, layer_types=kinds)
    path = moe_gguf.write_random_gguf(cfg, "Q4_0", tmp_path / "tiny-qwen35moe.gguf")
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "qwen35moe"
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    for name in ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight",
                 "ssm_out.weight", "ffn_gate_exps.weight", "ffn_gate_shexp.weight"):
        assert types[f"blk.0.{name}"] == "Q4_0", name
    for name in ("ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ssm_norm.weight",
                 "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "post_attention_norm.weight"):
        assert types[f"blk.0.{name}"] == "F32", name
    assert types["blk.1.attn_q.weight"] == "Q4_0" and "blk.1.attn_qkv.weight" not in types
    # the shared expert's down projection (rows of 48) is not whole Q4_0 blocks: float32
    assert types["blk.0.ffn_down_shexp.weight"] == "F32"
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("qwen35moe.")}
    assert fields["qwen35moe.rope.dimension_sections"] == [11, 11, 10, 0]
    assert fields["qwen35moe.attention.recurrent_layers"] == [k == "linear_attention" for k in kinds]
    assert fields["qwen35moe.ssm.inner_size"] == cfg.linear_attention.value_dim
    ckpt = open_checkpoint(path)
    assert ckpt.config == cfg
    a_log = ckpt.source.get("model.layers.0.linear_attn.A_log").numpy()  # ssm_a = -exp(A_log)
    assert np.isfinite(a_log).all() and np.abs(a_log).max() < 4
    for name in ckpt.source.names():
        assert np.isfinite(ckpt.source.get(name).numpy()).all(), name


def test_random_gpt_oss_gguf_has_mxfp4_experts_and_reads_back(tmp_path):
    """gpt-oss as llama.cpp's converter writes it: experts MXFP4 whatever the other matrices'
    type, biases, sinks and the router float32, the window and YaRN in the metadata; our loader
    recovers the config (the clamp at llama.cpp's constant 7) and decodes sane experts."""
    import dataclasses

    base = get_config("gpt_oss_tiny")
    cfg = base.replace(vocab_size=512, moe=dataclasses.replace(base.moe, swiglu_limit=7.0))
    path = moe_gguf.write_random_gguf(cfg, "Q4_0", tmp_path / "tiny-gpt-oss.gguf")
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "gpt-oss"
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    for name in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"):
        assert types[f"blk.1.{name}"] == "MXFP4", name
    assert types["blk.0.attn_q.weight"] == "Q4_0" and types["output.weight"] == "Q4_0"
    for name in ("attn_sinks.weight", "attn_q.bias", "attn_output.bias", "ffn_gate_inp.weight",
                 "ffn_gate_inp.bias", "ffn_down_exps.bias", "post_attention_norm.weight"):
        assert types[f"blk.0.{name}"] == "F32", name
    ckpt = open_checkpoint(path)
    assert ckpt.config == cfg
    w = ckpt.source.get("model.layers.1.mlp.experts.2.up_proj.weight").numpy()
    assert w.shape == (cfg.moe.moe_intermediate_size, cfg.hidden_size)
    assert np.isfinite(w).all() and 2.0 ** -8 <= np.abs(w).max() <= 6 * 2.0 ** -7


def test_random_smollm3_gguf_is_dense_tied_and_reads_back_with_its_nope_layers(tmp_path):
    """smollm3 (SmolLM3-3B, dense): Llama's layer tensors, no experts and no output.weight (tied
    embeddings), the rotary width; our loader recovers the config, its NoPE layers (llama.cpp's
    every fourth: layer 3 of 5) included, and Llama's shapes. A config whose NoPE layers llama.cpp
    cannot express (the tiny preset's every second) is refused, not written as another model."""
    base = get_config("smollm3_tiny")
    with pytest.raises(ValueError, match="every fourth layer"):
        moe_gguf.write_random_gguf(base, "Q4_0", tmp_path / "refused.gguf")
    assert not (tmp_path / "refused.gguf").exists()
    # hidden 96: whole Q4_0 rows everywhere, and still head_dim (16) != hidden / heads (24)
    cfg = base.replace(hidden_size=96, intermediate_size=128, num_hidden_layers=5,
                       no_rope_layers=(1, 1, 1, 0, 1))
    path = moe_gguf.write_random_gguf(cfg, "Q4_0", tmp_path / "tiny-smollm3.gguf")
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "smollm3"
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    layer = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
             "ffn_up", "ffn_down")
    assert set(types) == {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{b}.{n}.weight" for b in range(5) for n in layer}
    for name in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_down"):
        assert types[f"blk.4.{name}.weight"] == "Q4_0", name
    assert types["token_embd.weight"] == "Q4_0" and types["blk.0.ffn_norm.weight"] == "F32"
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("smollm3.")}
    assert fields["smollm3.rope.dimension_count"] == cfg.head_dim == 16
    assert fields["smollm3.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert not any("expert" in k for k in fields)
    ckpt = open_checkpoint(path)
    assert ckpt.config.positions.no_rope_layers == (1, 1, 1, 0, 1) and ckpt.config.tie_word_embeddings
    assert ckpt.config == cfg
    assert "lm_head.weight" not in ckpt.source.names()
    shapes = {"self_attn.q_proj": (4 * 16, 96), "self_attn.k_proj": (2 * 16, 96),
              "self_attn.o_proj": (96, 4 * 16), "mlp.gate_proj": (128, 96),
              "mlp.down_proj": (96, 128)}
    for name, shape in shapes.items():
        w = ckpt.source.get(f"model.layers.3.{name}.weight").numpy()
        assert w.shape == shape, name
        assert np.isfinite(w).all() and 0.004 * 8 * 0.5 < np.abs(w).max() <= 0.008 * 8, name


def test_moe_full_takes_smollm3_cut_to_layers_and_refuses_the_expert_options(capsys):
    """python -m benchmarks.full_size --config smollm3_3b --layers 6 keeps SmolLM3's NoPE flags for the 6 layers
    (the GGUF's every fourth); a dense preset refuses the expert options, and a preset whose GGUF
    llama.cpp could not read is refused before an export, unless llama.cpp is left out."""
    assert workers.model_config("smollm3_3b", 6).positions.no_rope_layers == (
        1, 1, 1, 0, 1, 1)
    p = argparse.ArgumentParser()
    ok = argparse.Namespace(config="smollm3_3b", layers=6, llama=True,
                            qmoe_int8_activations=False, experts_accuracy_level=0)
    full_size.check_config(p, ok)
    full_size.check_config(p, argparse.Namespace(**{**vars(ok), "config": "smollm3_tiny",
                                                   "layers": None, "llama": False}))
    full_size.check_config(p, argparse.Namespace(  # the MoE presets keep their options
        **{**vars(ok), "config": "qwen3_moe_tiny", "layers": 2,
           "qmoe_int8_activations": True, "experts_accuracy_level": 4}))
    refused = [({"qmoe_int8_activations": True}, "--qmoe-int8-activations: smollm3_3b is dense"),
               ({"experts_accuracy_level": 4}, "--experts-accuracy-level 4: smollm3_3b is dense"),
               ({"config": "smollm3_tiny", "layers": None}, "every fourth layer"),
               ({"config": "qwen3_tiny", "layers": None}, "not an architecture random_gguf.py"),
               ({"layers": 37}, "--layers 37: smollm3_3b has 36 layers")]
    for change, message in refused:
        with pytest.raises(SystemExit):
            full_size.check_config(p, argparse.Namespace(**{**vars(ok), **change}))
        assert message in capsys.readouterr().err, change


def test_random_gemma4_gguf_reads_back_with_its_layer_shapes(tmp_path):
    """gemma4 (26B-A4B's form, cut to two layers as the full-size run's --layers 2 makes, and the tiny
    preset's): both head sizes, KV heads per layer, keys that are values (no attn_v on full
    layers), the fused experts and their scales, rope_freqs; our loader recovers the config
    (the proportional share from rope_freqs) and every tensor is finite."""
    base = get_config("gemma4_tiny")
    cfg = base.replace(vocab_size=512, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                       use_double_wide_mlp=False)
    path = moe_gguf.write_random_gguf(cfg, "Q4_0", tmp_path / "tiny-gemma4.gguf")
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "gemma4"
    names = {t.name for t in reader.tensors}
    assert "blk.0.attn_v.weight" in names and "blk.1.attn_v.weight" not in names
    assert {"blk.1.ffn_gate_up_exps.weight", "blk.1.ffn_down_exps.scale",
            "blk.1.ffn_gate_inp.scale", "rope_freqs.weight"} <= names
    ckpt = open_checkpoint(path)
    assert ckpt.config == cfg
    for name in ckpt.source.names():
        assert np.isfinite(ckpt.source.get(name).numpy()).all(), name
    full = get_config("gemma4_26b_a4b")
    six = full.replace(num_hidden_layers=6, layer_types=full.layer_types[:6])  # 5 sliding, 1 full
    assert moe_gguf.tensor_shapes(six)[0] == ("rope_freqs.weight", (256,), "rope_freqs")
    # two sliding layers: no full layer reads rope_freqs, and llama.cpp refuses a file holding a
    # tensor it does not read ("wrong number of tensors")
    two = full.replace(num_hidden_layers=2, layer_types=full.layer_types[:2])
    assert "rope_freqs.weight" not in [name for name, _, _ in moe_gguf.tensor_shapes(two)]
    with pytest.raises(ValueError, match="per-layer embeddings"):
        moe_gguf.write_random_gguf(base, "Q4_0", tmp_path / "refused.gguf")


def test_moe_full_export_worker_gets_the_huge_pages_llm_onnx_export_would(monkeypatch):
    """The export worker (the Python API, in a child process) starts with glibc's huge-page
    tunable where `llm-onnx export` would add it, unless --no-export-huge-pages."""
    import llm_onnx.export.hugepages as hugepages

    monkeypatch.setattr(hugepages, "this_machine", lambda: ("always [madvise] never", "glibc 2.36"))
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv(hugepages.MARKER, raising=False)
    a = argparse.Namespace(export_mmap_threshold=0, export_huge_pages=True)
    assert stages.export_env(a)["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert stages.export_env(argparse.Namespace(**{**vars(a), "export_huge_pages": False})) == {}
    monkeypatch.setattr(hugepages, "this_machine", lambda: ("always madvise [never]", "glibc 2.36"))
    assert stages.export_env(a) == {}

"""The int4 quantizer for float sources (llm_onnx/export/calibrate.py, quant.search_zero_point):
the weighted block search against a numpy brute force, awq's folds exact in float for every
family, awq beating plain rounding where activations have outlier channels, and the defaults
chosen by the source (a Q4_1 GGUF keeps its blocks exactly; a float checkpoint gets awq)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from llm_onnx.checkpoints import open_checkpoint
from llm_onnx.checkpoints.load import build_model, param_producers
from llm_onnx.export import ExportOptions, export_model
from llm_onnx.export.calibrate import calibrate, calibration_ids
from llm_onnx.export.export import resolve_source
from llm_onnx.export.quant import (
    _minmax_zero_point,
    block_weights,
    dequantize,
    quantize,
    search_zero_point,
)
from llm_onnx.families import get_config
from llm_onnx.modeling.decoder import Decoder, Fusion
from tests.conftest import FAMILY_ARCHS, TINY_ARCHS
from tests.ort_helpers import Graphs, batch_logits, fidelity, hf_logits


def np_weighted_error(w, wt, scale, zp, levels=15):
    codes = np.clip(np.round(w / scale[..., None]) + zp[..., None], 0, levels)
    return (wt * ((codes - zp[..., None]) * scale[..., None] - w) ** 2).sum(-1)


def np_brute_force(w, wt, levels=15):
    """Per block, the least weighted error over 801 scales x all 16 zero points."""
    lo, hi = np.minimum(w.min(-1), 0), np.maximum(w.max(-1), 0)
    span = np.maximum(hi - lo, 1e-12)
    best = np.full(w.shape[:-1], np.inf)
    for f in np.linspace(levels - 3, levels + 3, 801):
        scale = span / f
        for z in range(levels + 1):
            best = np.minimum(best, np_weighted_error(w, wt, scale, np.full_like(scale, z)))
    return best


@pytest.mark.parametrize("with_importance", [False, True])
def test_block_search_is_near_the_brute_force_optimum(with_importance):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((24, 4, 32)).astype(np.float32) * 0.05
    w[0] = np.abs(w[0])  # one-sided blocks
    w[1, :, 3] *= 8  # an outlier per block
    importance = torch.from_numpy(rng.gamma(0.5, 1.0, 128).astype(np.float32)) \
        if with_importance else None
    blocks = torch.from_numpy(w)
    wt = block_weights(blocks, importance, 32)
    scale, zp, _ = search_zero_point(blocks, wt, 15)
    got = np_weighted_error(w, wt.numpy(), scale.numpy(), zp.numpy())
    s0, z0, _ = _minmax_zero_point(blocks, 15)
    minmax = np_weighted_error(w, wt.numpy(), s0.numpy(), z0.numpy())
    best = np_brute_force(w, wt.numpy())
    assert np.all(got <= minmax * (1 + 1e-5) + 1e-12)  # never worse than the block's range
    assert got.sum() < 0.95 * minmax.sum()  # and better overall
    assert np.all(got <= best * 1.5 + 1e-12) and got.sum() <= best.sum() * 1.04


def test_importance_moves_the_error_to_quiet_channels():
    rng = np.random.default_rng(6)
    w = torch.from_numpy(rng.standard_normal((64, 64)).astype(np.float32))
    loud = torch.ones(64)
    loud[::8] = 100.0  # channels whose activations are large
    errs = []
    for importance in (None, loud):
        q, s, z = quantize(w, 4, 32, asymmetric=True, search=True, importance=importance)
        d = (dequantize(q, s, 4, 64, z) - w) ** 2
        errs.append(d[:, ::8].mean() / d.mean())
    assert errs[1] < 0.7 * errs[0]


def _fold_model(ckpt, fusion, cal):
    """A float Decoder whose weights come from the checkpoint through the calibration's folds."""
    with torch.device("meta"):
        model = Decoder(ckpt.config, fusion=fusion, max_positions=64)
    producers = cal.producers(dict(param_producers(model)))
    plain = build_model(ckpt.config, ckpt.source, fusion=fusion, max_positions=64)
    for name, param in plain.named_parameters():
        produce = producers.get(name)
        if produce is None:
            continue
        param.data = produce(ckpt.source).to(param.dtype)
    return plain


def _logits(model, ids):
    t = len(ids)
    past = model.new_cache(1, t)
    with torch.inference_mode():
        out = model(torch.tensor([ids]), torch.tensor([t - 1], dtype=torch.int32),
                    torch.tensor(t, dtype=torch.int32), *past)
    return out[0][0].numpy()


FOLD_ARCHS = ["llama_tiny", "qwen3_tiny", "qwen3_moe_tiny", "qwen2_tiny", "gpt2_tiny",
              "falcon_tiny", "opt_350m_tiny", "phi3_tiny"]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("arch", FOLD_ARCHS)
def test_awq_folds_leave_the_float_model_unchanged(arch, fused, tiny_hf):
    """The scales awq folds in (norms, up rows, v rows) cancel in float: the folded float model
    computes what the checkpoint does, and the folds really move weights."""
    ckpt = open_checkpoint(tiny_hf(arch)[1])
    fusion = Fusion(qkv=fused, gate_up=fused)
    ids, _ = calibration_ids(ckpt)
    cal = calibrate(ckpt, fusion, 16, ids, "test")
    plain = build_model(ckpt.config, ckpt.source, fusion=fusion, max_positions=64)
    folded = _fold_model(ckpt, fusion, cal)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, ckpt.config.vocab_size, 12).tolist()
    want, got = _logits(plain, prompt), _logits(folded, prompt)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    moved = [n for n, p in folded.named_parameters()
             if not torch.equal(p, dict(plain.named_parameters())[n])]
    assert cal.importance and all(torch.isfinite(v).all() for v in cal.importance.values())
    cfg = ckpt.config
    if cfg.residual.topology == "pre":
        assert any("layernorm" in n for n in moved), moved  # a norm fold happened


def _outlier_checkpoint(tiny_hf, tmp_path):
    """llama_tiny with a few hidden channels 12x louder into every projection (as real LLMs
    have): what activation-aware scaling is for."""
    from safetensors.torch import load_file, save_file

    src = tiny_hf("llama_tiny")[1]
    dst = tmp_path / "outliers"
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            t = load_file(f)
            for name in t:
                if name.endswith("layernorm.weight"):
                    t[name] = t[name].clone()
                    t[name][::16] *= 12.0
            save_file(t, dst / f.name, metadata={"format": "pt"})
        elif f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_awq_is_closer_to_the_float_model_than_rounding(tiny_hf, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = _outlier_checkpoint(tiny_hf, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rng = np.random.default_rng(11)
    vocab = get_config("llama_tiny").vocab_size
    rows = [rng.integers(0, vocab, n + 8).tolist() for n in (9, 5)]
    want = hf_logits(hf, rows, [9, 5], 8)
    kl = {}
    for method in ("minmax", "awq"):
        out = tmp_path / method
        export_model(open_checkpoint(folder), out, ExportOptions(
            precision="int4", block_size=32, accuracy_level=0, embedding_bits=None,
            quant_method=method, max_seq_len=64), progress=False)
        got = batch_logits(Graphs(out), rows, [9, 5], 8)
        kl[method] = fidelity(want, got, margin=0.05)["kl"]
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["precision"]["quantization"]["method"] == method
    assert kl["awq"] < 0.8 * kl["minmax"], kl


def test_defaults_follow_the_source(smollm2_gguf, tiny_hf):
    """A Q4_1 GGUF keeps its blocks exactly (offset, float activations) for CPU; a float
    checkpoint gets zero points, awq and int8 activations; an explicit choice is kept."""
    q41 = open_checkpoint(smollm2_gguf)
    hf = open_checkpoint(tiny_hf("llama_tiny")[1])
    cpu = ExportOptions(precision="int4", target="cpu")
    exact = resolve_source(cpu, q41)
    assert (exact.scheme, exact.method, exact.activation_level) == ("offset", "minmax", 0)
    flt = resolve_source(cpu, hf)
    assert (flt.scheme, flt.method, flt.activation_level) == ("zero_point", "awq", 4)
    cuda = resolve_source(ExportOptions(precision="int4", target="cuda"), q41)
    assert (cuda.scheme, cuda.method) == ("zero_point", "awq")
    mine = resolve_source(ExportOptions(precision="int4", target="cpu", quant_method="search"), q41)
    assert (mine.scheme, mine.method) == ("zero_point", "search")
    assert resolve_source(ExportOptions(precision="int8", target="cpu"), hf).method == "minmax"


def test_a_float_int4_manifest_records_the_quantizer(tiny_export):
    from llm_onnx.model_folder import load_manifest

    m = load_manifest(tiny_export("llama_tiny", "int4"))
    q = m.precision.quantization
    assert (q.scheme, q.method, q.accuracy_level) == ("zero_point", "awq", 4)
    assert q.calibration == "256 random token ids (no tokenizer)"
    assert q.source == "hf float weights"
    assert "int8 per block" in m.precision.activations


def test_a_calibration_text_is_tokenized_with_the_checkpoints_tokenizer(tiny_hf, tmp_path):
    from llm_onnx.errors import ExportError

    arch = FAMILY_ARCHS[0] if "qwen2_tiny" not in FAMILY_ARCHS else "qwen2_tiny"
    ckpt = open_checkpoint(tiny_hf(arch)[1])  # a word tokenizer: "t0" ... "t{V-1}"
    ids, what = calibration_ids(ckpt, " ".join(f"t{i % 50}" for i in range(100)))
    assert ids[:3] == [0, 1, 2] and len(ids) == 100 and what == "given text, 100 tokens"
    with pytest.raises(ExportError, match="at least 16"):
        calibration_ids(ckpt, "t1 t2")
    with pytest.raises(ExportError, match="only 1 distinct"):
        calibration_ids(ckpt, "t7 " * 100)
    # the built-in English text through a word tokenizer of t0, t1, ...: all unknown
    ids, what = calibration_ids(ckpt)
    assert len(set(ids)) > 100 and what.startswith("256 random token ids (the built-in text")
    assert TINY_ARCHS  # the tokenizer-less tiny presets calibrate on random ids (manifest test)


def test_the_export_hands_freed_heap_back_as_the_weights_go_through(tiny_hf, tmp_path,
                                                                  monkeypatch):
    """glibc keeps freed blocks of up to 32 MiB as heap: without trims as the layers go
    through, Qwen3.6-35B-A3B's export grew 0.2 GiB a layer (9.1 GiB). With every layer counted as
    large, the calibration trims after each layer and the writer after each module that wrote;
    at the real thresholds a tiny model is never trimmed (a trim's pages are faulted in again)."""
    import llm_onnx.export.calibrate as calibrate_mod
    import llm_onnx.export.folder as folder_mod
    import llm_onnx.export.weights as weights_mod

    trims: list[str] = []
    monkeypatch.setattr(folder_mod, "release_memory", lambda collect=True: trims.append("trim"))
    ckpt = open_checkpoint(tiny_hf("llama_tiny")[1])
    options = ExportOptions(precision="int4", block_size=32, max_seq_len=64)
    export_model(ckpt, tmp_path / "real", options, progress=False)
    assert trims == []

    def every_byte(stage):
        def make(every=0):
            trim = folder_mod.HeapTrim(1)
            real = trim.__call__
            return lambda n: (trims.append(stage) if n else None, real(n))
        return make

    monkeypatch.setattr(calibrate_mod, "HeapTrim", every_byte("layer"))
    monkeypatch.setattr(weights_mod, "HeapTrim", every_byte("module"))
    export_model(ckpt, tmp_path / "every", options, progress=False)
    assert trims.count("layer") == get_config("llama_tiny").num_hidden_layers
    assert trims.count("module") > 2 * get_config("llama_tiny").num_hidden_layers
    assert trims.count("trim") == trims.count("layer") + trims.count("module")


def test_heap_trims_wait_for_enough_bytes(monkeypatch):
    import llm_onnx.export.folder as folder_mod

    trims = []
    monkeypatch.setattr(folder_mod, "release_memory", lambda collect=True: trims.append(collect))
    trim = folder_mod.HeapTrim(100)
    for n in (60, 30, 0, 20, 99, 1, 250):
        trim(n)
    assert trims == [False, False, False]  # at 110, 100 and 250; never the cycle collector


def test_gemma4_experts_calibrate_in_the_checkpoints_dtype_with_float32_sums():
    """The calibration keeps Gemma 4's stacked experts in bfloat16 (half a full-size layer's
    float32 bytes) and casts the chosen ones: every decision equals the one made from the same
    weights handed over in float32."""
    import dataclasses

    from llm_onnx.checkpoints.load import random_checkpoint

    ckpt = random_checkpoint(get_config("gemma4_tiny"), "gemma4_tiny", seed=3)
    assert ckpt.source.get("model.layers.0.experts.gate_up_proj").dtype == torch.bfloat16

    class Float32:  # the same values, widened before the calibration sees them
        def __init__(self, source):
            self.source = source

        def __getattr__(self, name):
            return getattr(self.source, name)

        def get(self, name):
            return self.source.get(name).float()

    wide = dataclasses.replace(ckpt, source=Float32(ckpt.source))
    ids = list(range(3, 40))
    narrow_cal = calibrate(ckpt, Fusion(), 16, ids, "test")
    wide_cal = calibrate(wide, Fusion(), 16, ids, "test")
    assert narrow_cal.importance.keys() == wide_cal.importance.keys()
    assert len(narrow_cal.importance) > 4
    for name, h in narrow_cal.importance.items():
        assert torch.equal(h, wide_cal.importance[name]), name

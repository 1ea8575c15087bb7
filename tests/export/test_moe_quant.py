"""int4 experts from a float source (QMoE, symmetric blocks): awq's calibration records each
expert's router-weighted input statistics (checked against transformers' own routing, in numpy),
and the block search they weight brings a tiny Qwen3-MoE with loud hidden channels closer to
transformers fp32 than plain rounding does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_onnx.checkpoints import open_checkpoint
from llm_onnx.export import ExportOptions, export_model, modules
from llm_onnx.export.calibrate import calibrate
from llm_onnx.families import get_config
from llm_onnx.modeling.config import MoEConfig
from llm_onnx.modeling.decoder import Fusion
from tests.hf_models import save_hf_checkpoint
from tests.ort_helpers import Graphs, batch_logits, fidelity, hf_logits


def test_calibration_records_router_weighted_expert_statistics(tiny_hf):
    """For expert e of layer i, over the calibration tokens routed to it with weight w:
    gate/up's h = sum(w x^2) / sum(w) (x the MoE block's input) and down's the same over
    silu(gate) * up; an expert no token chose gets the layer's router-weighted mean. Computed
    here from transformers' tensors with numpy."""
    hf, folder = tiny_hf("qwen3_moe_tiny")
    cfg = get_config("qwen3_moe_tiny")
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, 48).tolist()
    cal = calibrate(open_checkpoint(folder), Fusion(), 32, ids, "test")

    seen: dict[int, np.ndarray] = {}
    hooks = [layer.mlp.register_forward_pre_hook(
        lambda mod, args, i=i: seen.__setitem__(i, args[0].detach().double().numpy()[0]))
        for i, layer in enumerate(hf.model.layers)]
    with torch.no_grad():
        hf(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    # I: the experts' intermediate size, the shape letter of the comments (not an identity)
    E, K, I = cfg.moe.num_experts, cfg.moe.num_experts_per_tok, cfg.moe.moe_intermediate_size  # noqa: E741
    for i, layer in enumerate(hf.model.layers):
        x = seen[i]  # (T, D), the block's input
        mlp = layer.mlp
        logits = x @ mlp.gate.weight.detach().double().numpy().T
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        top = np.argsort(-p, axis=-1)[:, :K]
        w = np.zeros_like(p)
        np.put_along_axis(w, top, np.take_along_axis(p, top, -1), -1)
        w /= w.sum(-1, keepdims=True)  # norm_topk_prob
        gate_up = mlp.experts.gate_up_proj.detach().double().numpy()  # (E, 2I, D): [gate; up]
        got_gu = cal.importance[f"model.layers.{i}.mlp.experts.gate_up_proj"].double().numpy()
        got_dn = cal.importance[f"model.layers.{i}.mlp.experts.down_proj"].double().numpy()
        assert got_gu.shape == (E, x.shape[1]) and got_dn.shape == (E, I)
        sums = {"gu": np.zeros((E, x.shape[1])), "dn": np.zeros((E, I))}
        for e in range(E):
            gate, up = x @ gate_up[e, :I].T, x @ gate_up[e, I:].T
            act = gate / (1 + np.exp(-gate)) * up
            sums["gu"][e] = (w[:, e, None] * x * x).sum(0)
            sums["dn"][e] = (w[:, e, None] * act * act).sum(0)
        chosen = w.sum(0) > 0
        assert chosen.sum() >= E // 2
        for key, got in (("gu", got_gu), ("dn", got_dn)):
            mean = sums[key][chosen].sum(0) / w.sum(0)[chosen].sum()
            for e in range(E):
                want = sums[key][e] / w[:, e].sum() if chosen[e] else mean
                np.testing.assert_allclose(got[e], want, rtol=1e-4, err_msg=f"{key} {i} {e}")


LOUD_MOE = get_config("qwen3_moe_tiny").replace(
    hidden_size=128, num_attention_heads=4, head_dim=32, vocab_size=512,
    moe=MoEConfig(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=64,
                  norm_topk_prob=True))


def _loud_checkpoint(tmp_path):
    """A 16-expert Qwen3-MoE whose MoE input has every 16th hidden channel 12x louder (as real
    LLMs' activations have outlier channels): what activation-weighted quantization is for."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "loud-moe"
    hf = save_hf_checkpoint(LOUD_MOE, folder, seed=1)
    for f in folder.glob("*.safetensors"):
        t = load_file(f)
        for name in t:
            if name.endswith("post_attention_layernorm.weight"):
                t[name] = t[name].clone()
                t[name][::16] *= 12.0
        save_file(t, f, metadata={"format": "pt"})
    from transformers import AutoModelForCausalLM

    del hf
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _stored(folder, name: str) -> np.ndarray:
    """An initializer's bytes in weights.data, as the graph records them (onnx, not our code)."""
    import onnx

    graph = onnx.load(str(folder / "prefill.onnx"), load_external_data=False).graph
    t = next(t for t in graph.initializer if t.name == name)
    info = {e.key: e.value for e in t.external_data}
    raw = np.fromfile(folder / info["location"], np.uint8, int(info["length"]),
                      offset=int(info["offset"]))
    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
    return raw.view(dtype).reshape(tuple(t.dims))


def _with_stored_experts(folder, checkpoint, scheme: str):
    """The float decoder of ``checkpoint`` (equal to transformers: rung 1) with its experts
    replaced by the int4 ones the export stored (``scheme``: with zero points or symmetric),
    dequantized: only the experts' rounding differs from transformers."""
    from llm_onnx.checkpoints.load import build_model
    from llm_onnx.export.quant import dequantize

    model = build_model(LOUD_MOE, open_checkpoint(checkpoint).source)
    for i, layer in enumerate(model.model.layers):
        experts = layer.mlp.experts
        for part in ("gate_up", "down"):
            name = f"model.layers.{i}.mlp.experts.{part}"
            q = torch.from_numpy(_stored(folder, f"{name}_qweight"))
            s = torch.from_numpy(_stored(folder, f"{name}_scales"))
            zp = torch.from_numpy(_stored(folder, f"{name}_zero_points")) \
                if scheme == "zero_point" else None
            e, rows, k_bytes = q.shape
            block = k_bytes * 2 // s.shape[-1]  # 4-bit codes
            w = torch.stack([dequantize(q[j].reshape(rows, -1, block // 2), s[j], 4, k_bytes * 2,
                                        None if zp is None else zp[j]) for j in range(e)])
            getattr(experts, f"{part}_proj").data.copy_(w)
    return model


def _logits(model, rows: list[list[int]]) -> list[np.ndarray]:
    with torch.inference_mode():
        return [model(torch.tensor([r]), torch.tensor([len(r) - 1], dtype=torch.int32),
                      torch.tensor(len(r), dtype=torch.int32), *model.new_cache(1, len(r)))[0][0]
                .numpy() for r in rows]


@pytest.mark.parametrize("scheme", ["symmetric", "zero_point"])
def test_searched_experts_are_closer_to_transformers(tmp_path, monkeypatch, scheme):
    """The experts an int4 export stores, dequantized into the float model: with awq's
    router-weighted block search they move it less from transformers fp32 than plain rounding
    (symmetric, block 32, measured: KL 0.025 against 0.037, top-1 93 against 85 of 122 clear
    positions; end to end in ONNX Runtime, where the int4 attention's error adds to both, KL
    0.142 against 0.152 with fp32 activations and a float LM head). Zero points (the CPU
    default, block 64): the searched scale and zero point against the block's range."""
    folder, hf = _loud_checkpoint(tmp_path)
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, LOUD_MOE.vocab_size, 24).tolist() for _ in range(6)]
    with torch.no_grad():
        want = [hf(torch.tensor([r])).logits[0].float().numpy() for r in rows]
    options = ExportOptions(precision="int4", max_seq_len=64, target="cpu", validate=False,
                            experts_scheme=scheme)
    kl = {}
    for searched in (True, False):
        if not searched:  # the experts as before: plain rounding
            plain = modules.QuantExperts.__init__
            monkeypatch.setattr(modules.QuantExperts, "__init__",
                                lambda self, *a, search=False, **k: plain(self, *a, **k))
        out = tmp_path / f"searched-{searched}"
        export_model(open_checkpoint(folder), out, options, progress=False)
        assert ("router-weighted" in (out / "manifest.json").read_text()) == searched
        got = _logits(_with_stored_experts(out, folder, scheme), rows)
        kl[searched] = fidelity(want, got, margin=0.05)["kl"]
    assert kl[True] < 0.8 * kl[False], kl


def test_int8_activation_experts_reach_the_qmoe_nodes(tmp_path):
    """experts_accuracy_level=4 (--experts-accuracy-level 4): every QMoE node of both graphs
    carries accuracy_level 4 (absent or 0 without it), the manifest says the experts take int8
    activations, the parity gate passes, and ONNX Runtime's logits move from the fp32-activation
    folder's (its int8 kernel ran) while staying about as close to transformers fp32."""
    import json

    import onnx

    folder, hf = _loud_checkpoint(tmp_path)
    rng = np.random.default_rng(11)
    lens = [12, 7, 16]
    rows = [rng.integers(0, LOUD_MOE.vocab_size, n + 3).tolist() for n in lens]
    want = hf_logits(hf, rows, lens, 3)
    got, kl = {}, {}
    for level in (0, 4):
        out = tmp_path / f"experts-level-{level}"
        export_model(open_checkpoint(folder), out, ExportOptions(
            precision="int4", max_seq_len=64, target="cpu", experts_accuracy_level=level),
            progress=False)
        for graph in ("prefill.onnx", "decode.onnx"):
            nodes = [n for n in onnx.load(str(out / graph), load_external_data=False).graph.node
                     if n.op_type == "QMoE"]
            assert len(nodes) == LOUD_MOE.num_hidden_layers
            for n in nodes:
                attrs = {a.name: a.i for a in n.attribute}
                assert attrs.get("accuracy_level", 0) == level, (graph, attrs)
        manifest = json.loads((out / "manifest.json").read_text())
        experts = [q for q in manifest["precision"]["quantization"]["quantized"]
                   if "mlp.experts" in q]
        assert experts and all(("activations int8" in q) == (level == 4) for q in experts)
        got[level] = batch_logits(Graphs(out), rows, lens, 3)
        kl[level] = fidelity(want, got[level], margin=0.05)["kl"]
    moved = max(float(np.abs(a - b).max()) for a, b in zip(got[0], got[4]))
    assert moved > 1e-4, moved
    assert kl[4] < 1.5 * kl[0] + 0.01, kl


def test_int8_activation_experts_are_refused_where_they_cannot_apply():
    from llm_onnx.errors import ConfigError

    with pytest.raises(ConfigError, match="experts_accuracy_level must be 0"):
        ExportOptions(precision="int4", experts_accuracy_level=2)
    with pytest.raises(ConfigError, match="export int4 or int8, not fp16"):
        ExportOptions(precision="fp16", experts_accuracy_level=4)
    with pytest.raises(ConfigError, match="CUDA QMoE ignores it"):
        ExportOptions(precision="int4", target="cuda", experts_accuracy_level=4)


def test_experts_defaults_are_resolved_by_target_precision_and_source():
    """export.resolve_experts: on CPU, 4-bit experts get zero points in blocks of 64 and int8
    activations (benchmarks/moe_fidelity.py, docs/moe.md); a --block-size other than 32 is
    followed; 8-bit experts, CUDA and MXFP4 checkpoints (gpt-oss) keep symmetric blocks of
    --block-size; what the user gives is kept; a dense model's options are left alone."""
    from dataclasses import replace

    from llm_onnx.checkpoints import random_checkpoint
    from llm_onnx.checkpoints.mxfp4 import MXFP4Source
    from llm_onnx.export.export import resolve_experts

    moe = random_checkpoint(get_config("qwen3_moe_tiny"), "moe")

    def experts(ck=moe, **kw):
        o = resolve_experts(ExportOptions(**{"precision": "int4", "target": "cpu", **kw}), ck)
        return o.experts_block_size, o.experts_scheme, o.experts_accuracy_level

    assert experts() == (64, "zero_point", 4)
    assert experts(block_size=16) == (16, "zero_point", 4)
    assert experts(block_size=128) == (128, "zero_point", 4)
    assert experts(precision="int8") == (32, "symmetric", 4)
    assert experts(target="cuda") == (32, "symmetric", 0)
    assert experts(replace(moe, source=MXFP4Source(moe.source))) == (32, "symmetric", 4)
    assert experts(experts_block_size=32, experts_scheme="symmetric",
                   experts_accuracy_level=0) == (32, "symmetric", 0)
    assert experts(experts_scheme="symmetric") == (32, "symmetric", 4)
    assert experts(random_checkpoint(get_config("qwen3_tiny"), "dense")) == (None, None, None)
    assert experts(precision="fp32") == (None, None, None)


def test_zero_point_experts_are_refused_where_they_cannot_apply():
    from llm_onnx.errors import ConfigError

    for bad in ({"precision": "int8"}, {"precision": "int4", "target": "cuda"}):
        with pytest.raises(ConfigError, match="experts_scheme zero_point is a form of 4-bit"):
            ExportOptions(experts_scheme="zero_point", **bad)
    with pytest.raises(ConfigError, match="experts_block_size 48 must be a power of two"):
        ExportOptions(precision="int4", experts_block_size=48)


def test_the_manifest_names_the_experts_quantization_and_only_for_experts(tiny_export):
    """quantization.experts in manifest.json: the block asked for, the scheme and the
    activations of a mixture of experts' experts (read by bench and the tests' references); a
    dense model's manifest has no such key, so an llm-onnx from before it still reads it."""
    import json

    from llm_onnx.model_folder import ExpertsQuantization, read_manifest

    moe = tiny_export("qwen3_moe_tiny", "int4")
    assert read_manifest(moe).precision.quantization.experts == ExpertsQuantization(
        block_size=64, scheme="zero_point", accuracy_level=4)
    text = (moe / "manifest.json").read_text()
    assert "uint4 zero points, block 32" in text  # 64 asked for; the experts' width 32 fits 32
    dense = tiny_export("qwen3_tiny", "int4")
    assert "experts" not in json.loads((dense / "manifest.json").read_text())["precision"][
        "quantization"]
    assert read_manifest(dense).precision.quantization.experts is None


def test_zero_points_keep_block_64_experts_closer_than_symmetric_blocks(tmp_path):
    """The CPU default's reason on the loud tiny model (experts dequantized into the float
    model, as above): zero points at block 64 against symmetric blocks of 64, both searched
    (measured: KL 0.0276 against 0.0299; symmetric at 32 0.0270, zero points at 32 0.0222).
    On real weights: benchmarks/moe_fidelity.py."""
    folder, hf = _loud_checkpoint(tmp_path)
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, LOUD_MOE.vocab_size, 24).tolist() for _ in range(6)]
    with torch.no_grad():
        want = [hf(torch.tensor([r])).logits[0].float().numpy() for r in rows]
    kl = {}
    for scheme in ("symmetric", "zero_point"):
        out = tmp_path / scheme
        export_model(open_checkpoint(folder), out, ExportOptions(
            precision="int4", max_seq_len=64, target="cpu", validate=False,
            experts_scheme=scheme, experts_block_size=64), progress=False)
        kl[scheme] = fidelity(want, _logits(_with_stored_experts(out, folder, scheme), rows),
                              margin=0.05)["kl"]
    assert kl["zero_point"] < kl["symmetric"], kl


@pytest.mark.parametrize("arch", ["qwen3_moe_tiny", "gemma4_tiny"])
def test_experts_no_block_divides_stay_float_and_agree(arch, tmp_path):
    """A hidden size of 40 has no power-of-two block >= 16: such experts were refused at int8
    and int4 ("QMoE needs one"); they stay float, the manifest says so, and the parity gate
    passes (the projections around them quantized)."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.families import get_config
    from llm_onnx.model_folder import read_manifest
    from tests.hf_models import save_hf_checkpoint

    cfg = get_config(arch).replace(hidden_size=40)
    save_hf_checkpoint(cfg, tmp_path / "hf", seed=5, tokenizer=True)
    out = export_model(open_checkpoint(tmp_path / "hf"), tmp_path / "m",
                       ExportOptions(precision="int4", max_seq_len=48), progress=False)
    manifest = read_manifest(out)
    kept = manifest.precision.quantization.kept_float
    assert any(k.startswith("experts whose sizes no power-of-two block") for k in kept), kept
    assert manifest.precision.quantization.experts is None and manifest.parity.failures == ()

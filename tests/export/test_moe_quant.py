"""int4 experts from a float source (QMoE, symmetric blocks): awq's calibration records each
expert's router-weighted input statistics (checked against transformers' own routing, in numpy),
and the block search they weight brings a tiny Qwen3-MoE with loud hidden channels closer to
transformers fp32 than plain rounding does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_onnx.checkpoints import open_checkpoint
from llm_onnx.export import ExportOptions, export_model
from llm_onnx.export import modules
from llm_onnx.export.calibrate import calibrate
from llm_onnx.families import get_config
from llm_onnx.model.config import MoEConfig
from llm_onnx.model.decoder import Fusion
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
    E, K, I = cfg.moe.num_experts, cfg.moe.num_experts_per_tok, cfg.moe.moe_intermediate_size
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


def _with_stored_experts(folder, checkpoint):
    """The float decoder of ``checkpoint`` (equal to transformers: rung 1) with its experts
    replaced by the int4 ones the export stored, dequantized: only the experts' rounding differs
    from transformers."""
    from llm_onnx.checkpoints.load import build_model
    from llm_onnx.export.quant import dequantize

    model = build_model(LOUD_MOE, open_checkpoint(checkpoint).source)
    for i, layer in enumerate(model.model.layers):
        experts = layer.mlp.experts
        for part in ("gate_up", "down"):
            q = torch.from_numpy(_stored(folder, f"model.layers.{i}.mlp.experts.{part}_qweight"))
            s = torch.from_numpy(_stored(folder, f"model.layers.{i}.mlp.experts.{part}_scales"))
            e, rows, k_bytes = q.shape
            block = k_bytes * 2 // s.shape[-1]  # 4-bit codes
            w = torch.stack([dequantize(q[j].reshape(rows, -1, block // 2), s[j], 4, k_bytes * 2)
                             for j in range(e)])
            getattr(experts, f"{part}_proj").data.copy_(w)
    return model


def _logits(model, rows: list[list[int]]) -> list[np.ndarray]:
    with torch.inference_mode():
        return [model(torch.tensor([r]), torch.tensor([len(r) - 1], dtype=torch.int32),
                      torch.tensor(len(r), dtype=torch.int32), *model.new_cache(1, len(r)))[0][0]
                .numpy() for r in rows]


def test_searched_experts_are_closer_to_transformers(tmp_path, monkeypatch):
    """The experts an int4 export stores, dequantized into the float model: with awq's
    router-weighted block search they move it less from transformers fp32 than plain symmetric
    rounding (measured: KL 0.025 against 0.037, top-1 93 against 85 of 122 clear positions).
    End to end in ONNX Runtime, where the int4 attention's error adds to both, KL 0.142 against
    0.152 (fp32 activations, float LM head)."""
    folder, hf = _loud_checkpoint(tmp_path)
    rng = np.random.default_rng(5)
    rows = [rng.integers(0, LOUD_MOE.vocab_size, 24).tolist() for _ in range(6)]
    with torch.no_grad():
        want = [hf(torch.tensor([r])).logits[0].float().numpy() for r in rows]
    options = ExportOptions(precision="int4", max_seq_len=64, target="cpu", validate=False)
    kl = {}
    for searched in (True, False):
        if not searched:  # the experts as before: plain symmetric rounding
            plain = modules.QuantExperts.__init__
            monkeypatch.setattr(modules.QuantExperts, "__init__",
                                lambda self, *a, search=False, **k: plain(self, *a, **k))
        out = tmp_path / f"searched-{searched}"
        export_model(open_checkpoint(folder), out, options, progress=False)
        assert ("router-weighted" in (out / "manifest.json").read_text()) == searched
        got = _logits(_with_stored_experts(out, folder), rows)
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

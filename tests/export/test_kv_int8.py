"""--kv-cache int8: an export whose KV cache is int8 with per-channel scales calibrated at export
(docs/exporting.md, docs/notes/kv-int8-gqa.md). ORT's graphs equal our eager decoder running the
same int8 cache (the rung that keeps the parity gate meaningful), stay close to the float-cache
export, and the scales bound the keys RoPE rotates to positions the calibration never saw."""

from __future__ import annotations

import types

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from llm_onnx.checkpoints import open_checkpoint
from llm_onnx.checkpoints.load import build_model
from llm_onnx.errors import ConfigError
from llm_onnx.export import ExportOptions
from llm_onnx.export.kv_rotation import rotated_values
from llm_onnx.export.kv_scales import kv_scale, layer_scales
from llm_onnx.export.plan import ExportPlan
from llm_onnx.families import get_config
from llm_onnx.model_folder import INT8_CACHE_VERSION, load_manifest
from llm_onnx.modeling import ops
from llm_onnx.modeling.attention import hadamard
from tests.ort_helpers import Graphs, batch_logits
from tests.tolerances import ORT_FP32

PROMPT_LENS = [9, 5, 3]  # ragged rows, right-padded in one prefill
STEPS = 4


def rows_for(arch: str, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, get_config(arch).vocab_size, n + STEPS).tolist() for n in PROMPT_LENS]


class WithScales:
    """A checkpoint's tensors plus the scales an export wrote (build_model's kv_int8 reads them)."""

    def __init__(self, source, scales: dict[str, torch.Tensor]) -> None:
        self.source, self.scales = source, scales

    def get(self, name: str):
        return self.scales[name] if name in self.scales else self.source.get(name)

    def __getattr__(self, name: str):
        return getattr(self.source, name)


def exported_scales(folder) -> dict[str, torch.Tensor]:
    graph = onnx.load(str(folder / "prefill.onnx"), load_external_data=True,
                      ).graph  # external data sits beside the graph
    return {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer
            if t.name.endswith(("k_scale", "v_scale"))}


def torch_logits(model, rows: list[list[int]]) -> list[np.ndarray]:
    """batch_logits' steps through the eager decoder: one right-padded prefill, then each row's
    own next token (teacher forcing)."""
    b, t = len(rows), max(PROMPT_LENS)
    ids = torch.zeros((b, t), dtype=torch.int64)
    for i, n in enumerate(PROMPT_LENS):
        ids[i, :n] = torch.tensor(rows[i][:n])
    cache = model.new_cache(b, t + STEPS + 1)
    seqlens = list(PROMPT_LENS)
    out = []
    with torch.no_grad():
        res = model(ids, torch.tensor([n - 1 for n in seqlens], dtype=torch.int32),
                    torch.tensor(t, dtype=torch.int32), *cache, last_only=True)
        out.append(res[0][:, -1].float().numpy())
        cache = model.next_cache(res[1:])
        for _ in range(STEPS):
            nxt = torch.tensor([[rows[i][seqlens[i]]] for i in range(b)])
            res = model(nxt, torch.tensor(seqlens, dtype=torch.int32),
                        torch.tensor(max(seqlens) + 1, dtype=torch.int32), *cache)
            out.append(res[0][:, -1].float().numpy())
            cache = model.next_cache(res[1:])
            seqlens = [n + 1 for n in seqlens]
    return out


def _diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


# qwen3: q/k norms, separate projections; llama: packed QKV into the kernel (no slicing)
@pytest.mark.parametrize("arch", ["qwen3_tiny", "llama_tiny"])
def test_ort_equals_the_eager_decoder_over_the_same_int8_cache(arch, tiny_hf, tiny_export):
    folder = tiny_export(arch, "fp32", kv_cache="int8")
    m = load_manifest(folder)
    assert m.kv_cache.dtype == "int8" and "Hadamard basis" in m.kv_cache.scales
    assert m.parity.relative_logits_diff <= 1e-4 and m.parity.present_kv_max_abs_diff <= 1
    cfg = get_config(arch)
    scales = exported_scales(folder)
    assert len(scales) == 2 * cfg.num_hidden_layers
    assert all(s.shape == (cfg.num_key_value_heads * cfg.head_dim,) and s.dtype == torch.float32
               and bool((s > 0).all()) for s in scales.values())
    source = open_checkpoint(tiny_hf(arch)[1]).source
    rows = rows_for(arch)
    got = batch_logits(Graphs(folder), rows, PROMPT_LENS, STEPS)
    want = torch_logits(build_model(cfg, WithScales(rotated_values(source, cfg), scales),
                                    kv_int8=True), rows)
    flt = _diff(got, torch_logits(build_model(cfg, source), rows))
    assert flt > 10 * ORT_FP32  # the rounding of the cache shows in the logits
    # torch and the kernel compute a key a rounding apart: one landing on a half step rounds to
    # neighbouring int8s (qwen3_tiny: one such entry moves the logits 8.7e-3, where the whole
    # quantization moves them 6.6e-2); a misread or transposed scale moves them as far as that.
    assert _diff(got, want) <= max(ORT_FP32, 0.2 * flt)


def _kl(p_steps: list[np.ndarray], q_steps: list[np.ndarray]) -> float:
    """Mean KL(p || q) over the rows of every step."""
    total = []
    for p, q in zip(p_steps, q_steps):
        lp = torch.log_softmax(torch.from_numpy(p).double(), -1)
        lq = torch.log_softmax(torch.from_numpy(q).double(), -1)
        total.append(float((lp.exp() * (lp - lq)).sum(-1).mean()))
    return float(np.mean(total))


# tiny random qwen3, fp32, keys and values in the Hadamard basis: calibrated 4.2e-5 (8.4e-5 in
# the channels' own basis), the scales transposed 1.05e-4, twice too coarse 1.4e-4, 4x 6.8e-4
KL_LIMIT = 7e-5


def test_the_int8_cache_stays_close_to_the_float_cache(tiny_hf, tiny_export):
    arch = "qwen3_tiny"
    rows = rows_for(arch, seed=4)
    folder = tiny_export(arch, "fp32", kv_cache="int8")
    int8 = batch_logits(Graphs(folder), rows, PROMPT_LENS, STEPS)
    flt = batch_logits(Graphs(tiny_export(arch, "fp32")), rows, PROMPT_LENS, STEPS)
    kl = _kl(flt, int8)
    assert 0 < kl < KL_LIMIT
    # the limit tells scales from wrong ones: the same numbers read in the other layout
    # (D, Hkv), or four times too coarse, miss it
    cfg = get_config(arch)
    source = rotated_values(open_checkpoint(tiny_hf(arch)[1]).source, cfg)  # as exported
    hkv, d = cfg.num_key_value_heads, cfg.head_dim
    scales = exported_scales(folder)
    for wrong in ({n: s.reshape(hkv, d).t().reshape(-1) for n, s in scales.items()},
                  {n: s * 4 for n, s in scales.items()}):
        model = build_model(cfg, WithScales(source, wrong), kv_int8=True)
        assert _kl(flt, torch_logits(model, rows)) > KL_LIMIT


def test_the_folder_says_its_cache_is_int8(tiny_export):
    import json

    folder = tiny_export("qwen3_tiny", "fp32", kv_cache="int8")
    data = json.loads((folder / "manifest.json").read_text())
    assert data["format_version"] == INT8_CACHE_VERSION  # an older llm-onnx refuses it
    g = onnx.load(str(folder / "decode.onnx"), load_external_data=False).graph
    past = next(i for i in g.input if i.name == "past_key_values.0.key")
    assert past.type.tensor_type.elem_type == onnx.TensorProto.INT8
    node = next(n for n in g.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["k_quant_type"] == attrs["v_quant_type"] == b"PER_CHANNEL"
    assert attrs["kv_cache_bit_width"] == 8
    assert list(node.input[12:]) == ["model.layers.0.self_attn.k_scale",
                                     "model.layers.0.self_attn.v_scale"]


def test_key_scales_bound_the_keys_rope_rotates_to_any_position():
    """Keys whose energy sits in one channel of a RoPE pair at calibration rotate into the other
    channel later: the pair envelope keeps them unclipped; per-channel |k| alone clips them."""
    torch.manual_seed(0)
    hkv, d, n = 2, 32, 40
    k = torch.randn(n, hkv, d) * 0.1
    k[:, 0, 3] = 6.0  # channel 3's partner (3 + 16) is quiet at calibration
    inv = 1.0 / 10_000 ** (torch.arange(0, d, 2) / d)
    angles = torch.arange(4096)[:, None] * inv[None]
    cos, sin = angles.cos(), angles.sin()
    positions = torch.arange(0, 4096, 7)[None, :]  # (1, P): every 7th position of a long text
    one = k[:1].expand(positions.shape[1], hkv, d)[None]  # the same key at every position
    rotated = ops.rotate(one, cos, sin, positions, False)[0]  # (P, Hkv, D)

    def worst(scale):  # the largest |x| / s over the rotated keys
        return float((rotated.abs() / scale.reshape(hkv, d)).max())

    assert worst(kv_scale(k, d)) <= 127 * (1 + 1e-5)  # no clipping at any position
    assert worst(kv_scale(k, 0)) > 127 * 5  # plain amax: channel 19 saturates
    # values (no RoPE): each channel's amax / 127 exactly, KV-head-major
    v = torch.randn(n, hkv, d)
    np.testing.assert_allclose(kv_scale(v, 0).numpy(),
                               (v.abs().amax(0) / 127).reshape(-1).numpy(), rtol=1e-6)
    # a channel never moved gets a floor: 1/s stays finite
    v[:, 1, 5] = 0
    assert 0 < float(kv_scale(v, 0)[d + 5]) < float(kv_scale(v, 0).max()) * 1e-3


def test_layer_scales_keep_headroom_over_the_calibrated_amax():
    """A layer's scales are the calibrated amax times the headroom: in the Hadamard basis (a
    power-of-two head size) keys x1.0 and values x1.1, else keys x1.25 and values x2 (a
    calibration text underestimates other text's range, and a clipped value costs more than a
    coarser step; docs/notes/kv-int8-gqa.md). Without RoPE a rotated key's scale is its amax
    in the Hadamard basis."""
    torch.manual_seed(1)
    for d, values_rotated, hk, hv in ((8, True, 1.0, 1.1), (8, False, 1.0, 2.0),
                                      (12, False, 1.25, 2.0)):
        spec = types.SimpleNamespace(rope="none", kv_heads=2, head_dim=d)  # an AttentionSpec's
        attn = types.SimpleNamespace(spec=spec, observe=None)
        layer = types.SimpleNamespace(self_attn=attn)
        k, v = torch.randn(1, 5, 2 * d), torch.randn(1, 5, 2 * d)
        got = layer_scales(layer, "p.", [(k, v)], None, values_rotated)
        want_k = k.reshape(5, 2, d) @ hadamard(d) if d == 8 else k.reshape(5, 2, d)
        np.testing.assert_allclose(got["p.self_attn.k_scale"].numpy(),
                                   (want_k.abs().amax(0) * hk / 127).reshape(-1).numpy(),
                                   rtol=1e-5)
        np.testing.assert_allclose(got["p.self_attn.v_scale"].numpy(),
                                   (v.abs().amax((0, 1)) * hv / 127).numpy(), rtol=1e-6)


def test_rotated_key_scales_bound_the_keys_at_positions_the_calibration_never_reached():
    """Keys stored in the Hadamard basis after RoPE: each channel mixes every rotary pair, so
    its range depends on the position; rotated_key_scale samples positions over the whole
    table. 400 calibration keys (one loud channel, as real keys have), every tenth put at every
    7th position of a 4,096-token context and rotated: under 0.05% of the values pass their
    scale (measured 0.009%, the worst by 1.26x), where the scales of the calibration's own
    positions (0-399) let 0.27% pass, by up to 1.8x."""
    from llm_onnx.export.kv_scales import rotated_key_scale

    torch.manual_seed(0)
    hkv, d, n = 2, 32, 400
    k = torch.randn(n, hkv, d) * 0.1
    k[:, 0, 3] = 6.0
    inv = 1.0 / 10_000 ** (torch.arange(0, d, 2) / d)
    angles = torch.arange(4096)[:, None] * inv[None]
    cos, sin = angles.cos(), angles.sin()
    positions = torch.arange(0, 4096, 7)[None, :]
    h = hadamard(d)
    sampled = rotated_key_scale(k, (cos, sin), 1.0).reshape(hkv, d)
    own = (ops.rotate(k[None], cos, sin, torch.arange(n)[None], False)[0] @ h).abs().amax(0) / 127

    def clipped(scale) -> float:  # the share of rotated values past 127 steps
        over = total = 0
        for i in range(0, n, 10):
            one = k[i:i + 1].expand(positions.shape[1], hkv, d)[None]
            x = (ops.rotate(one, cos, sin, positions, False)[0] @ h).abs() / scale
            over, total = over + int((x > 127).sum()), total + x.numel()
        return over / total

    assert clipped(sampled) < 5e-4 and clipped(own) > 10 * clipped(sampled)
    # the Hadamard basis: symmetric, orthogonal, scores unchanged
    assert torch.allclose(h @ h, torch.eye(d), atol=1e-6) and torch.equal(h, h.t())


def test_rotated_values_leave_the_float_model_unchanged(tiny_hf):
    """kv_rotation.RotatedValues: v_proj's rows and o_proj's columns in the Hadamard basis per
    head change nothing in float (qwen3_tiny's logits within 1e-5 of the checkpoint's), while
    the values the attention hands its cache are rotated."""
    from llm_onnx.export.kv_rotation import RotatedValues

    arch = "qwen3_tiny"
    cfg = get_config(arch)
    source = open_checkpoint(tiny_hf(arch)[1]).source
    rotated = RotatedValues(source, cfg)
    rows = rows_for(arch)
    plain = torch_logits(build_model(cfg, source), rows)
    turned = torch_logits(build_model(cfg, rotated), rows)
    assert _diff(plain, turned) <= 1e-5
    name = "model.layers.0.self_attn.v_proj.weight"
    w, r = source.get(name), rotated.get(name)
    d = cfg.head_dim
    assert torch.allclose(r.reshape(-1, d, w.shape[-1]),
                          hadamard(d) @ w.reshape(-1, d, w.shape[-1]).float(), atol=1e-6)
    assert (r - w).abs().max() > 0.1 * w.abs().max()


def test_the_eager_op_quantizes_as_the_kernel():
    """ops.quantize_kv: x * float32(1/s), half to even, clipped (the kernel's values measured in
    test_gqa_int8_cache.py)."""
    x = torch.tensor([0.25, 0.75, -0.25, 1.25, 100.0, -100.0, 1.55, 1.9499999]).reshape(1, 8)
    s = torch.tensor([0.5] * 6 + [0.1] * 2)
    assert ops.quantize_kv(x, s).reshape(-1).tolist() == [0, 2, 0, 2, 127, -128, 16, 20]


@pytest.mark.parametrize("options, message", [
    (dict(target="cuda", precision="fp16"), "--target cpu"),
    (dict(plain_attention=True), "plain_attention"),
    (dict(task="embed"), "has none"),
])
def test_refused_options_name_the_fix(options, message):
    with pytest.raises(ConfigError, match=message):
        ExportOptions(kv_cache="int8", **options)


def test_a_head_size_groupqueryattention_refuses_is_refused_with_the_fix():
    cfg = get_config("qwen3_tiny").replace(head_dim=24)  # not a multiple of 16: plain attention
    with pytest.raises(ConfigError, match="--kv-cache float"):
        ExportPlan.build(cfg, ExportOptions(precision="fp32", kv_cache="int8"), 64)
    ExportPlan.build(cfg, ExportOptions(precision="fp32"), 64)  # a float cache is fine


def test_the_cli_offers_and_refuses_it():
    from click.testing import CliRunner

    from llm_onnx.cli import main

    runner = CliRunner()
    assert "--kv-cache [float|int8]" in runner.invoke(main, ["export", "--help"]).output
    result = runner.invoke(main, ["export", "--config", "qwen3_tiny", "--random-weights",
                                  "--kv-cache", "int8", "--target", "cuda", "--precision",
                                  "fp16", "--no-huge-pages"])
    assert result.exit_code == 1 and "--kv-cache float" in result.output


def test_a_hybrid_model_quantizes_its_attention_layers_and_bench_counts_int8(tiny_export):
    """qwen3_5_tiny: a linear-attention layer (no KV cache, its states stay float32) and one
    full layer (2 KV heads of 64), whose cache bench counts at one byte a number."""
    import json

    from click.testing import CliRunner

    from llm_onnx.cli import main

    folder = tiny_export("qwen3_5_tiny", "fp32", kv_cache="int8")
    m = load_manifest(folder)
    assert m.kv_cache.dtype == "int8" and m.parity.relative_logits_diff <= 1e-4
    assert set(exported_scales(folder)) == {"model.layers.1.self_attn.k_scale",
                                            "model.layers.1.self_attn.v_scale"}
    result = CliRunner().invoke(main, ["bench", "--model", str(folder), "--json",
                                       "--prompt-len", "12", "--new-tokens", "6", "--repeat", "1",
                                       "--provider", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert d["kv_cache_dtype"] == "int8"
    assert d["kv_bytes_per_position"] == 2 * 1 * 2 * 64  # keys and values, one layer, int8


def test_a_long_step_reads_the_int8_cache_as_a_token_at_a_time_does(tiny_export):
    """prefill.onnx runs a step of PROMPT_STEP or more tokens with the float node over the int8
    cache read back (kv_int8_attention.group_query_attention_int8_steps) and a shorter one with
    the int8 node. Both compute the same numbers: a 40-token prompt in one step, in two 20-token
    steps (the second over a past) or a token at a time gives the same cache bytes and last
    logits (to float rounding, 1.3e-6; attending over the new keys unrounded instead moves them
    by 1.8e-2)."""
    from llm_onnx.export.kv_int8_attention import PROMPT_STEP

    graphs = Graphs(tiny_export("qwen3_tiny", "fp32", kv_cache="int8"))
    n = 40
    assert n // 2 >= PROMPT_STEP
    ids = np.random.default_rng(5).integers(0, get_config("qwen3_tiny").vocab_size, n)
    runs = {}
    for chunk in (n, n // 2, 1):
        cache = graphs.new_cache(1, n + 1)
        for start in range(0, n, chunk):
            end = start + chunk
            logits, cache = graphs.run("prefill", ids[None, start:end], [end - 1], end, cache)
        runs[chunk] = (logits[0, -1], cache)
    whole, keys = runs[n]
    for chunk in (n // 2, 1):
        last, other = runs[chunk]
        assert float(np.abs(last - whole).max()) <= 1e-4 * max(1.0, float(np.abs(whole).max()))
        assert sum(int((a != b).sum()) for a, b in zip(keys, other)) <= 2  # a half step apart

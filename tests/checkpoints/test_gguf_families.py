"""GGUF files of every family that declares llama.cpp names (``GGUF`` in its family module).

A tiny random transformers checkpoint is written as llama.cpp's converter writes it: tensor
names from gguf-py's own name table (``gguf.get_tensor_name_map``, not our family tables), q/k
rows of Llama-arch files permuted into llama.cpp's interleaved rotary order, experts stacked into
one tensor per projection, config as GGUF metadata. Read back through our GGUF reader, the config
equals the family's and the logits equal transformers' on the original weights.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from llm_onnx.checkpoints import build_model, open_checkpoint
from llm_onnx.families import REGISTRY
from llm_onnx.modeling.config import ModelConfig
from tests.checkpoints.test_gguf_tokenizer import _byte_symbols
from tests.conftest import tiny_preset
from tests.hf_models import save_hf_checkpoint
from tests.perturb import perturbed
from tests.tolerances import TORCH_VS_HF_FP32

# (llama.cpp architecture name, the family's first tiny preset) for every family with GGUF names
# (gpt-oss: its stacked, MXFP4 experts are written as llama.cpp's converter writes them in
# tests/checkpoints/test_gpt_oss.py)
GGUF_TINY = [(fam.gguf.arch, tiny_preset(fam)) for fam in REGISTRY.values()
             if fam.gguf is not None and fam.gguf.arch != "gpt-oss"]
GGUF_TINY.append(("phi3", "phi3_mini_tiny"))  # Phi-3-mini-4k's form: plain RoPE, a window


def gguf_shape(arch: str, cfg: ModelConfig) -> ModelConfig:
    """The preset as a GGUF of ``arch`` can hold it: llama.cpp's phi3 converter writes no key
    length (head_dim is hidden / heads), so phi3_tiny's deliberately odd width (68) becomes
    heads x head_dim."""
    if arch == "phi3":
        return cfg.replace(hidden_size=cfg.num_attention_heads * cfg.head_dim)
    if arch == "gemma3":  # llama.cpp's defaults: sliding pattern 6, attention scale head_dim^-0.5
        from llm_onnx.families.gemma3 import pattern_layers

        return cfg.replace(num_hidden_layers=6, layer_types=pattern_layers(6, 6),
                           attention_scale=cfg.head_dim ** -0.5)
    if arch == "smollm3":  # llama.cpp's smollm3: every fourth layer NoPE, fixed (no key)
        return cfg.replace(num_hidden_layers=4, no_rope_layers=(1, 1, 1, 0))
    if arch == "qwen3next":  # llama.cpp's qwen3next has no dense layers (mlp_only_layers)
        import dataclasses

        return cfg.replace(moe=dataclasses.replace(cfg.moe, mlp_only_layers=()))
    return cfg


def gemma3_metadata(writer, cfg: ModelConfig) -> None:
    """What convert_hf_to_gguf's Gemma3Model adds (and TextModel's linear RoPE scaling)."""
    writer.add_sliding_window(cfg.sliding_window)
    if cfg.final_logit_softcapping:
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if cfg.rope_scaling:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(cfg.rope_scaling["factor"])


def phi3_metadata(writer, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """What convert_hf_to_gguf's Phi3MiniModel adds: the rotary width, the original context,
    the sliding window (0 for none), and for LongRoPE the attention factor and the factors as
    tensors (the converter computes the factor from the lengths; a config that names one is
    written with it, as the model transformers runs uses it)."""
    from llm_onnx.modeling.config import longrope_attention_factor

    writer.add_rope_dimension_count(int(cfg.head_dim * cfg.partial_rotary_factor))
    writer.add_sliding_window(cfg.sliding_window or 0)
    scaling = cfg.rope_scaling
    writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"]
                                         if scaling else cfg.max_position_embeddings)
    if not scaling:
        return {}
    original = scaling["original_max_position_embeddings"]
    writer.add_rope_scaling_attn_factors(scaling.get("attention_factor") or longrope_attention_factor(
        cfg.max_position_embeddings / original, original))
    return {"rope_factors_long.weight": np.array(scaling["long_factor"], np.float32),
            "rope_factors_short.weight": np.array(scaling["short_factor"], np.float32)}


def gemma4_metadata(writer, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """What llama.cpp's Gemma4Model converter writes: the window and the sliding pattern (one
    flag per layer), the shared layers, the per-layer embeddings' width, the full and sliding
    head sizes, KV heads and MLP widths per layer, the soft cap, the sliding layers' RoPE base;
    and rope_freqs (1 for the full layers' rotating pairs, 1e30 for the others)."""
    types = cfg.layer_types
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in types])
    writer.add_shared_kv_layers(cfg.attention.num_kv_shared_layers)
    writer.add_embedding_length_per_layer_input(cfg.embedding.hidden_size_per_layer_input)
    full = cfg.attention.global_head_dim or cfg.head_dim
    writer.add_key_length_swa(cfg.head_dim)
    writer.add_value_length_swa(cfg.head_dim)
    writer.add_head_count_kv([cfg.layer_kv_heads(i) for i in range(cfg.num_hidden_layers)])
    if cfg.mlp.use_double_wide_mlp:
        writer.add_feed_forward_length([cfg.layer_intermediate(i)
                                        for i in range(cfg.num_hidden_layers)])
    if cfg.final_logit_softcapping:
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    writer.add_rope_freq_base_swa(cfg.positions.rope_local_theta)
    share = (cfg.rope_scaling or {}).get("partial_rotary_factor", 1.0)
    rotating = int(full * share / 2)
    return {"rope_freqs.weight": np.array([1.0] * rotating + [1e30] * (full // 2 - rotating),
                                          np.float32)}


def gemma4_tensors(name: str, t: np.ndarray) -> tuple[str, np.ndarray]:
    """Gemma4Model.filter_tensors / modify_tensors: ``.weight`` on layer_scalar and the stacked
    experts; the router's scale and the per-expert scale as ffn_gate_inp.scale and
    ffn_down_exps.scale (written by name in write_gguf)."""
    if name.endswith(("layer_scalar", "experts.gate_up_proj", "experts.down_proj")):
        return f"{name}.weight", t
    return name, t


def split_gate_up(t: np.ndarray, bid: int) -> list[tuple[str, np.ndarray]]:
    """Gemma 4's experts (E, 2I, D) as ffn_gate_exps and ffn_up_exps, (E, I, D) each: what
    llama.cpp's converter writes from per-expert checkpoints (its NVFP4 path), each with the
    per-expert ``.scale`` (E,) that llama.cpp multiplies into the projection's output (powers of
    two here, so the weights divided by them are exact). llama.cpp's gemma4 loader takes them
    where a file has no ffn_gate_up_exps; gguf-py 0.19 does not list them for gemma4 (newer
    ones do), so the names come from its tensor-name table."""
    gate, up = np.split(t, 2, axis=1)
    out = []
    for kind, part, scale in ((gguf.MODEL_TENSOR.FFN_GATE_EXP, gate, 2.0 ** np.arange(len(t))),
                              (gguf.MODEL_TENSOR.FFN_UP_EXP, up, 2.0 ** -np.arange(len(t)))):
        name = gguf.TENSOR_NAMES[kind].format(bid=bid)
        out += [(f"{name}.weight", np.ascontiguousarray(part / scale[:, None, None], np.float32)),
                (f"{name}.scale", scale.astype(np.float32))]
    return out


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: each head's rotary halves interleaved."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


HYBRID = ("qwen35", "qwen35moe", "qwen3next")
# convert_hf_to_gguf's LlamaModel and its subclass SmolLM3Model (undo_permute) interleave q/k rows
LLAMA_PERMUTED = ("llama", "smollm3")


def tile_v_heads(t: np.ndarray, cfg: ModelConfig, axis: int, per_head: int) -> np.ndarray:
    """llama.cpp's qwen35 converter (_reorder_v_heads): value heads grouped by key head
    [g0v0, g0v1, g1v0, ...] re-ordered tiled [g0v0, g1v0, g0v1, ...] along ``axis``."""
    la = cfg.linear_attention
    hk, r = la.num_key_heads, la.num_value_heads // la.num_key_heads
    t = np.moveaxis(t, axis, 0)
    rest = t.shape[1:]
    t = t.reshape(hk, r, per_head, *rest).swapaxes(0, 1).reshape(hk * r * per_head, *rest)
    return np.moveaxis(t, 0, axis)


def hybrid_tensors(name: str, t: np.ndarray, cfg: ModelConfig, arch: str) -> dict[str, np.ndarray]:
    """What llama.cpp's Qwen3.5 / Qwen3-Next converters write for one checkpoint tensor (under
    the checkpoint's names, renamed afterwards by gguf-py's table): the layer, final and q/k
    norms as 1 + w (not the gated norm), -exp(A_log), dt_bias as dt_proj's bias, the conv
    weight squeezed to (C, K); qwen35: value heads tiled wherever they appear; qwen3next:
    in_proj_qkvz split into [q | k | v] of all groups and z, in_proj_ba kept."""
    la = cfg.linear_attention
    base = name.rsplit(".", 1)[0]
    if base.endswith("norm") and not base.endswith("linear_attn.norm"):
        return {name: t + 1.0}
    if name.endswith("A_log"):
        name, t = name, -np.exp(t)
    if name.endswith("dt_bias"):
        name = name.replace("dt_bias", "dt_proj.bias")
    if name.endswith("conv1d.weight"):
        t = t.reshape(t.shape[0], t.shape[-1])
    if arch == "qwen3next" and name.endswith("in_proj_qkvz.weight"):
        hk, dk = la.num_key_heads, la.key_head_dim
        rv = la.value_dim // hk
        g = t.reshape(hk, 2 * dk + 2 * rv, t.shape[-1])
        q, k, v, z = (g[:, :dk], g[:, dk:2 * dk], g[:, 2 * dk:2 * dk + rv], g[:, 2 * dk + rv:])
        flat = [x.reshape(-1, t.shape[-1]) for x in (q, k, v, z)]
        return {name.replace("in_proj_qkvz", "in_proj_qkv"): np.concatenate(flat[:3]),
                name.replace("in_proj_qkvz", "in_proj_z"): flat[3]}
    if arch in ("qwen35", "qwen35moe") and ".linear_attn." in name:
        dv = la.value_head_dim
        if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            key = 2 * la.key_dim
            t = np.concatenate([t[:key], tile_v_heads(t[key:], cfg, 0, dv)])
        elif name.endswith("in_proj_z.weight"):
            t = tile_v_heads(t, cfg, 0, dv)
        elif name.endswith(("in_proj_b.weight", "in_proj_a.weight", "A_log", "dt_proj.bias")):
            t = tile_v_heads(t, cfg, 0, 1)
        elif name.endswith("out_proj.weight"):
            t = tile_v_heads(t, cfg, 1, dv)
    return {name: t}


def hybrid_metadata(writer, cfg: ModelConfig) -> None:
    """convert_hf_to_gguf's Qwen3.5 / Qwen3-Next keys: the linear attention's shape as llama.cpp's
    ssm.* keys, the full layers' interval, the rotary width; a multi-token-prediction block is
    appended after the model's own (block_count includes it)."""
    la = cfg.linear_attention
    types = cfg.layer_types
    interval = types.index("full_attention") + 1
    assert types == tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                          for i in range(len(types)))
    writer.add_ssm_conv_kernel(la.conv_kernel)
    writer.add_ssm_state_size(la.key_head_dim)
    writer.add_ssm_group_count(la.num_key_heads)
    writer.add_ssm_time_step_rank(la.num_value_heads)
    writer.add_ssm_inner_size(la.value_dim)
    writer.add_full_attention_interval(interval)
    writer.add_rope_dimension_count(cfg.rotary_dim)
    writer.add_nextn_predict_layers(1)
    if cfg.moe is not None and cfg.moe.shared_expert_intermediate_size:
        writer.add_expert_shared_feed_forward_length(cfg.moe.shared_expert_intermediate_size)


def write_gguf(folder: Path, cfg: ModelConfig, arch: str, path: Path,
               pooling_type: int | None = None, experts_apart: bool = False,
               more: dict[str, np.ndarray] | None = None) -> Path:
    """The safetensors checkpoint in ``folder`` as a float32 GGUF of llama.cpp's ``arch``
    (``pooling_type``: llama.cpp's key of an embedding model's file; ``experts_apart``: gemma4's
    experts as ``split_gate_up`` writes them; ``more``: tensors added by their GGUF names)."""
    tensors = load_file(str(folder / "model.safetensors"))
    model_arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    names = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    experts: dict[str, dict[int, np.ndarray]] = {}
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        if arch == "gemma4":
            name, t = gemma4_tensors(name, t)
        base, suffix = name.rsplit(".", 1)
        parts = base.split(".")
        if "experts" in parts and arch != "gemma4":  # model.layers.L.mlp.experts.E.gate_proj -> stacked by projection
            i = parts.index("experts")
            stacked = ".".join(parts[:i + 1] + parts[i + 2:])
            experts.setdefault(f"{stacked}.{suffix}", {})[int(parts[i + 1])] = t
            continue
        if arch == "gemma3" and base.endswith("norm"):  # Gemma3RMSNorm's (1 + w), stored
            t = t + 1.0
        if arch in HYBRID:
            out.update(hybrid_tensors(name, t, cfg, arch))
            continue
        if arch in LLAMA_PERMUTED and base.endswith(("q_proj", "k_proj")):
            heads = cfg.num_attention_heads if base.endswith("q_proj") else cfg.num_key_value_heads
            t = llama_cpp_permute(t, heads)
        out[name] = t
    for name, by_index in experts.items():
        out[name] = np.stack([by_index[e] for e in range(len(by_index))])

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers + (arch in HYBRID))  # + the MTP block
    if not (arch == "gemma4" and cfg.mlp.use_double_wide_mlp):
        writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    if arch != "gemma4":
        writer.add_head_count_kv(cfg.num_key_value_heads)
    extra = phi3_metadata(writer, cfg) if arch == "phi3" else {}
    if arch == "gemma4":
        extra = gemma4_metadata(writer, cfg)
    if arch == "gemma3":
        gemma3_metadata(writer, cfg)
    if arch in HYBRID:
        hybrid_metadata(writer, cfg)
    if arch != "phi3":  # (gemma4: the full layers' head size; the sliding ones' as *_swa)
        writer.add_key_length(cfg.attention.global_head_dim or cfg.head_dim)
        writer.add_value_length(cfg.attention.global_head_dim or cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_vocab_size(cfg.vocab_size)
    if pooling_type is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling_type))
    # A byte-level tokenizer of as many tokens (a GGUF checkpoint carries its tokenizer).
    assert cfg.vocab_size == 256
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(_byte_symbols()[:255] + ["Ġt"])
    writer.add_token_types([1] * 256)
    writer.add_token_merges(["Ġ t"])
    if cfg.moe is not None:
        writer.add_expert_count(cfg.moe.num_experts)
        writer.add_expert_used_count(cfg.moe.num_experts_per_tok)
        writer.add_expert_feed_forward_length(cfg.moe.moe_intermediate_size)
    for name, t in out.items():
        base, suffix = name.rsplit(".", 1)
        if name.endswith("A_log"):  # llama.cpp's ssm_a has no .weight suffix
            base, suffix = name, ""
        if experts_apart and name.endswith("experts.gate_up_proj.weight"):
            for gname, part in split_gate_up(t, int(name.split(".")[2])):
                writer.add_tensor(gname, part)
            continue
        if arch == "gemma4" and name.endswith(("router.scale", "router.per_expert_scale")):
            bid = name.split(".")[2]  # Gemma4Model.modify_tensors' names for the two scales
            writer.add_tensor(f"blk.{bid}.ffn_gate_inp.scale" if name.endswith("router.scale")
                              else f"blk.{bid}.ffn_down_exps.scale", t.astype(np.float32))
            continue
        gname = names.get_name(base)
        assert gname is not None, f"gguf-py has no {arch} name for {base}"
        gname = f"{gname}.{suffix}" if suffix else gname
        writer.add_tensor(gname, np.ascontiguousarray(t, dtype=np.float32))
    if arch in HYBRID:  # the MTP block: read past, never loaded
        mtp = f"blk.{cfg.num_hidden_layers}"
        writer.add_tensor(f"{mtp}.nextn.eh_proj.weight",
                          np.zeros((cfg.hidden_size, 2 * cfg.hidden_size), np.float32))
        writer.add_tensor(f"{mtp}.attn_norm.weight", np.ones(cfg.hidden_size, np.float32))
    for name, t in {**extra, **(more or {})}.items():
        writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    b, t = ids.shape
    seqlens = torch.full((b,), t - 1, dtype=torch.int32)
    return model(ids, seqlens, torch.tensor(t, dtype=torch.int32), *model.new_cache(b, t))[0]


@pytest.mark.parametrize("arch, preset", GGUF_TINY, ids=[p for _, p in GGUF_TINY])
def test_gguf_checkpoint_matches_transformers(arch, preset, tiny_hf, tmp_path):
    hf, folder = tiny_hf(preset)
    cfg = REGISTRY[hf.config.architectures[0]].presets[preset]
    if gguf_shape(arch, cfg) != cfg:
        cfg = gguf_shape(arch, cfg)
        folder = tmp_path / "hf"
        hf = save_hf_checkpoint(cfg, folder, seed=7)
    ckpt = open_checkpoint(write_gguf(folder, cfg, arch, tmp_path / f"{preset}.gguf"))
    assert ckpt.config == cfg  # from the GGUF metadata alone
    ours = build_model(ckpt.config, ckpt.source)
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = hf(ids).logits, logits(ours, ids)
        assert (got - want).abs().max().item() <= TORCH_VS_HF_FP32
        # The comparison can fail: transformers with one perturbed weight is far outside it.
        with perturbed(hf) as moved:
            assert (got - moved(ids).logits).abs().max().item() > TORCH_VS_HF_FP32


def test_gemma4_experts_apart_read_as_the_fused_tensor(tiny_hf, tmp_path):
    """A gemma4 file whose experts' gate and up are apart (``split_gate_up``) reads as
    transformers' stacked gate_up_proj, per-expert scales folded in: the same logits."""
    hf, folder = tiny_hf("gemma4_tiny")
    cfg = REGISTRY["Gemma4ForCausalLM"].presets["gemma4_tiny"]
    path = write_gguf(folder, cfg, "gemma4", tmp_path / "apart.gguf", experts_apart=True)
    written = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    assert {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.scale"} <= written
    assert not any("gate_up" in name for name in written)
    ckpt = open_checkpoint(path)
    assert ckpt.config == cfg
    name = "model.layers.1.experts.gate_up_proj"
    assert ckpt.source.shape(name) == tuple(hf.get_parameter(name).shape)
    assert torch.equal(ckpt.source.get(name), hf.get_parameter(name).detach())
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = logits(build_model(ckpt.config, ckpt.source), ids)
        assert (got - hf(ids).logits).abs().max().item() <= TORCH_VS_HF_FP32


def test_a_scale_the_reader_does_not_know_is_refused(tiny_hf, tmp_path):
    """llama.cpp multiplies a layer's ``.scale`` tensors into projections' outputs: one this
    reader would skip (here a per-expert scale on a Qwen3-MoE file) stops the read, naming it,
    instead of giving a model that runs without it."""
    from llm_onnx.errors import CheckpointError

    _, folder = tiny_hf("qwen3_moe_tiny")
    cfg = REGISTRY["Qwen3MoeForCausalLM"].presets["qwen3_moe_tiny"]
    plain = write_gguf(folder, cfg, "qwen3moe", tmp_path / "plain.gguf")
    assert open_checkpoint(plain).config == cfg
    scale = np.full(cfg.moe.num_experts, 2.0, np.float32)
    path = write_gguf(folder, cfg, "qwen3moe", tmp_path / "scaled.gguf",
                      more={"blk.1.ffn_down_exps.scale": scale})
    with pytest.raises(CheckpointError, match=r"scaled\.gguf.*blk\.1\.ffn_down_exps\.scale"):
        open_checkpoint(path)


def test_llama_files_need_the_permutation_undone(tiny_hf, tmp_path):
    """A Llama-arch file whose q/k rows were not interleaved reads as a different model: the
    reader's un-permutation is what the round trip above depends on."""
    hf, folder = tiny_hf("llama_tiny")
    cfg = REGISTRY["LlamaForCausalLM"].presets["llama_tiny"]
    plain = tmp_path / "plain"
    plain.mkdir()
    tensors = load_file(str(folder / "model.safetensors"))
    for name in list(tensors):
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # pre-undo, so the writer's permute
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            tensors[name] = _inverse_permute(tensors[name], heads)  # cancels out
    save_file(tensors, str(plain / "model.safetensors"))
    ckpt = open_checkpoint(write_gguf(plain, cfg, "llama", tmp_path / "plain.gguf"))
    ids = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (logits(build_model(ckpt.config, ckpt.source), ids) - hf(ids).logits).abs().max()
    assert diff.item() > 100 * TORCH_VS_HF_FP32


def _inverse_permute(w: np.ndarray, heads: int) -> np.ndarray:
    return (w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def test_phi3_longrope_factors_must_match_the_rotary_width(tiny_hf, tmp_path):
    from llm_onnx.errors import CheckpointError

    cfg = gguf_shape("phi3", REGISTRY["Phi3ForCausalLM"].presets["phi3_tiny"])
    folder = tmp_path / "hf"
    save_hf_checkpoint(cfg, folder, seed=7)
    scaling = dict(cfg.rope_scaling, long_factor=cfg.rope_scaling["long_factor"][:-1])
    bad = cfg.replace(rope_scaling=scaling)  # the file's factors: one short of 8
    with pytest.raises(CheckpointError, match=r"bad\.gguf.*rope_factors_short/long\.weight.*8 "):
        open_checkpoint(write_gguf(folder, bad, "phi3", tmp_path / "bad.gguf"))


class _Meta:
    """GGUF metadata without a file (the gemma3 defaults that only show at full size)."""

    path = "m.gguf"
    tensor_names = {"token_embd.weight"}

    def __init__(self, **fields):
        self.fields = fields

    def get(self, key, default=None):
        return self.fields.get(key, default)

    def need(self, key):
        return self.fields[key]

    def vocab_size(self):
        return 262_144


def _gemma3_meta(layers: int, **extra) -> _Meta:
    return _Meta(embedding_length=5376, **{"attention.head_count": 32}, block_count=layers,
                 **{"attention.key_length": 128, "attention.head_count_kv": 16,
                    "attention.sliding_window": 1024, "feed_forward_length": 21504,
                    "context_length": 131072, "attention.layer_norm_rms_epsilon": 1e-6,
                    "rope.freq_base": 1e6}, **extra)


def test_gemma3_gguf_defaults_follow_llama_cpp():
    from llm_onnx.errors import CheckpointError
    from llm_onnx.families.gemma3 import gemma3_gguf_fields as gguf_fields

    big = gguf_fields(_gemma3_meta(62))  # the 27B: query_pre_attn_scalar = hidden / heads = 168
    assert big["attention_scale"] == 168 ** -0.5 and big["rope_local_theta"] == 10_000.0
    assert big["layer_types"][:6] == ("sliding_attention",) * 5 + ("full_attention",)
    other = gguf_fields(_gemma3_meta(48))
    assert other["attention_scale"] == 128 ** -0.5
    listed = gguf_fields(_gemma3_meta(3, **{"attention.sliding_window_pattern": [True, False, True],
                                            "rope.freq_base_swa": 5e4}))
    assert listed["layer_types"] == ("sliding_attention", "full_attention", "sliding_attention")
    assert listed["rope_local_theta"] == 5e4
    with pytest.raises(CheckpointError, match="m.gguf.*sliding_window_pattern lists 2 layers"):
        gguf_fields(_gemma3_meta(3, **{"attention.sliding_window_pattern": [True, False]}))
    with pytest.raises(CheckpointError, match="m.gguf.*'yarn' is not supported"):
        gguf_fields(_gemma3_meta(3, **{"rope.scaling.type": "yarn"}))

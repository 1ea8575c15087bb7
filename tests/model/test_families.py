"""GPT-2, BLOOM, Falcon and Mistral pieces that the parity ladder does not isolate: checkpoint
names and layouts (with and without the "transformer." prefix, one-line errors naming the
family's own tensor), ALiBi slopes, GELU variants, the sliding window, Falcon's variants."""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from llm_onnx.checkpoints import build_model, open_checkpoint
from llm_onnx.checkpoints.sources import RandomSource
from llm_onnx.errors import CheckpointError
from llm_onnx.families import get_config
from llm_onnx.modeling import ops
from tests.hf_models import make_hf_model, save_hf_checkpoint
from tests.model.test_parity_hf import run_full
from tests.tolerances import OP_FP32, TORCH_VS_HF_FP32


def ids_for(cfg, n: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (2, n), generator=torch.Generator().manual_seed(seed))


def logits_diff(hf, ours, ids) -> float:
    with torch.no_grad():
        return (run_full(ours, ids) - hf(ids).logits).abs().max().item()


def paper_alibi_slopes(heads: int) -> list[float]:
    """ALiBi's slopes as the paper defines them (Press et al., 2022, section 3 and its code): for
    n = 2^k heads the geometric series starting at and with ratio 2^(-8/n); otherwise the series
    for the largest power of two below, then every other slope of the series for twice it."""
    def series(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** int(np.floor(np.log2(heads)))
    return series(closest) + series(2 * closest)[0::2][:heads - closest]


def test_alibi_slopes_follow_the_paper():
    for heads in range(1, 34):
        want = np.array(paper_alibi_slopes(heads), np.float64)
        got = np.array(ops.alibi_slopes(heads), np.float64)
        assert got.shape == want.shape, heads
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=str(heads))  # float32 values
    # BLOOM-560m's 16 heads: 2^-0.5, 2^-1, ..., 2^-8
    assert ops.alibi_slopes(16)[::5] == pytest.approx([2 ** -0.5, 2 ** -3, 2 ** -5.5, 2 ** -8])


def test_alibi_bias_is_relative_to_the_last_query():
    bias = ops.alibi_bias(torch.zeros(1, 3, dtype=torch.long), torch.tensor(5), [0.5, 0.25])
    assert bias.shape == (1, 2, 3, 5)
    # queries at 2, 3, 4; keys 0..4: slope * (key - query)
    assert bias[0, 0, 2].tolist() == [-2.0, -1.5, -1.0, -0.5, 0.0]
    assert bias[0, 1, 0].tolist() == [-0.5, -0.25, 0.0, 0.25, 0.5]


@pytest.mark.parametrize("act, op", [("gelu_new", ops.fast_gelu), ("gelu_pytorch_tanh", ops.fast_gelu),
                                     ("gelu_fast", ops.fast_gelu), ("gelu", ops.gelu)])
def test_gelu_variants_equal_transformers(act, op):
    from transformers.activations import ACT2FN

    x = torch.linspace(-8, 8, 2001)
    assert (op(x) - ACT2FN[act](x)).abs().max().item() <= OP_FP32


def test_bloom_gelu_is_the_tanh_approximation():
    from transformers.models.bloom.modeling_bloom import bloom_gelu_forward

    x = torch.linspace(-8, 8, 2001)
    assert (ops.fast_gelu(x) - bloom_gelu_forward(x)).abs().max().item() <= OP_FP32
    assert (ops.gelu(x) - bloom_gelu_forward(x)).abs().max().item() > 1e-4  # not the exact one


def test_sliding_window_is_exercised():
    """transformers' Mistral with and without its window of 4 differ on a 12-token prompt, and
    ours equals the windowed one: the window is tested, not bypassed."""
    cfg = get_config("mistral_tiny")
    hf = make_hf_model(cfg, seed=3)
    unwindowed = copy.deepcopy(hf)
    unwindowed.config.sliding_window = None
    ours = build_model(cfg, _state_source(hf))
    ids = ids_for(cfg)
    with torch.no_grad():
        assert (hf(ids).logits - unwindowed(ids).logits).abs().max().item() > 0.05
    assert logits_diff(hf, ours, ids) <= TORCH_VS_HF_FP32


def _state_source(hf):
    """A TensorSource over a transformers model's state dict (Llama names)."""
    state = hf.state_dict()

    class Source:
        def names(self):
            return list(state)

        def shape(self, name):
            return tuple(state[name].shape)

        def get(self, name):
            return state[name]

        def describe(self, name):
            return "state dict"

    return Source()


@pytest.mark.parametrize("variant", [dict(num_key_value_heads=4), dict(topology="pre"),
                                     dict(attention_bias=True, o_proj_bias=True, mlp_bias=True)],
                         ids=["multi_head", "sequential", "bias"])
def test_falcon_variants_match_transformers(variant, tmp_path):
    """Falcon without multi-query (per-head fused q,k,v like BLOOM), sequential blocks with two
    norms, and biases."""
    cfg = get_config("falcon_tiny").replace(**variant)
    hf = save_hf_checkpoint(cfg, tmp_path, seed=2)
    ckpt = open_checkpoint(tmp_path)
    assert ckpt.config == cfg
    assert logits_diff(hf, build_model(cfg, ckpt.source), ids_for(cfg)) <= TORCH_VS_HF_FP32


def test_parallel_attention_with_two_norms_reads_the_same_input():
    """parallel_attn_shared_norm=False gives the MLP its own norm of the block's input: with that
    norm equal to the shared one the output cannot change."""
    shared = get_config("falcon_tiny")
    two = shared.replace(parallel_attn_shared_norm=False)
    source = RandomSource(shared, seed=4, dtype=torch.float32)

    class TwoNorms:
        def get(self, name):
            return source.get(name.replace("post_attention_layernorm", "input_layernorm"))

    a = build_model(shared, source)
    b = build_model(two, TwoNorms())
    ids = ids_for(shared)
    with torch.no_grad():
        assert torch.equal(run_full(a, ids), run_full(b, ids))


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    hf = save_hf_checkpoint(get_config("gpt2_tiny"), folder, seed=5)
    return hf, folder


def rewrite(folder, change):
    """change(tensors) edits the dict in place, or returns a new one."""
    tensors = load_file(folder / "model.safetensors")
    new = change(tensors)
    save_file(new if isinstance(new, dict) else tensors, folder / "model.safetensors",
              metadata={"format": "pt"})


def test_gpt2_checkpoint_without_prefix_and_with_mask_buffers(gpt2_folder, tmp_path):
    """GPT-2's own files name tensors without "transformer." and may carry the causal-mask
    buffers h.N.attn.bias; both load."""
    hf, good = gpt2_folder
    folder = tmp_path / "ckpt"
    shutil.copytree(good, folder)

    def strip(t):
        out = {k.removeprefix("transformer."): v for k, v in t.items()}
        out["h.0.attn.bias"] = torch.ones(1, 1, 8, 8)
        return out

    rewrite(folder, strip)
    ckpt = open_checkpoint(folder)
    cfg = ckpt.config
    assert logits_diff(hf, build_model(cfg, ckpt.source), ids_for(cfg)) <= TORCH_VS_HF_FP32


def _refused(good, tmp_path, edit) -> tuple[str, object]:
    """Copy the good checkpoint, apply ``edit`` to its tensors, and return the one-line
    CheckpointError message open_checkpoint gives (and the folder)."""
    folder = tmp_path / "ckpt"
    shutil.copytree(good, folder)
    rewrite(folder, edit)
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(folder)
    msg = str(e.value)
    assert "\n" not in msg
    return msg, folder


def test_wrong_fused_qkv_shape_names_file_and_tensor(gpt2_folder, tmp_path):
    msg, _ = _refused(gpt2_folder[1], tmp_path, lambda t: t.update(
        {"transformer.h.1.attn.c_attn.weight": torch.zeros(64, 190)}))
    assert "model.safetensors" in msg
    assert "transformer.h.1.attn.c_attn.weight" in msg and "[64, 190]" in msg and "[64, 192]" in msg


def test_missing_tensor_is_named_as_the_family_names_it(gpt2_folder, tmp_path):
    msg, folder = _refused(gpt2_folder[1], tmp_path, lambda t: t.pop("transformer.h.1.ln_2.bias"))
    assert str(folder) in msg and "lacks 1 tensor" in msg
    assert "transformer.h.1.ln_2.bias, read as model.layers.1.post_attention_layernorm.bias" in msg


def test_wrong_conv1d_shape_names_the_tensor(gpt2_folder, tmp_path):
    msg, _ = _refused(gpt2_folder[1], tmp_path, lambda t: t.update(
        {"transformer.h.0.mlp.c_fc.weight": torch.zeros(96, 64)}))
    assert "(tensor transformer.h.0.mlp.c_fc.weight)" in msg
    assert "model.layers.0.mlp.up_proj.weight has shape [64, 96], expected [96, 64]" in msg


@pytest.mark.parametrize("dim", [64, 63, 2048])
def test_sinusoidal_table_equals_xglms(dim):
    """XGLM's fixed positions, computed by us (float64, then float32) and by transformers."""
    from transformers.models.xglm.modeling_xglm import XGLMSinusoidalPositionalEmbedding

    from llm_onnx.modeling.rope import sinusoidal_table

    want = XGLMSinusoidalPositionalEmbedding.get_embedding(130, dim, None)
    got = sinusoidal_table(130, dim)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= 1e-4  # theirs is computed in float32
    assert got[:, : dim // 2].abs().max() > 0.9  # sines and cosines, not a constant

"""Random valid configs of every registered family, exported at fp32 and run on ONNX Runtime
against transformers with the same weights: every drawn config matches (logits through the graphs
with a right-padded batch, greedy tokens through the runtime, which binds the cache in place) or
is refused before any work with a one-line message. Never an ONNX Runtime internal error. Each
config that exports is exported quantized too, where the parity gate must pass: a valid
checkpoint is never refused for its precision. Under the CI profile the families take int8 and
int4 in turn (registry order: half of them each, every run the same); the explore profile
exports every draw at both.

Shapes ONNX Runtime's GroupQueryAttention refuses (head sizes that are not a multiple of 16,
rotary widths whose half is not a multiple of 8) are drawn on purpose: the export then picks
another attention form (attention.attention_form) and records it in the manifest.

The configs are drawn as our ModelConfig and written as transformers' config.json by the family
(the same path as the tests' tiny checkpoints); transformers builds its model from that file, so
it also has to accept the config as valid. Under the CI profile each family gets one draw
(Hypothesis' first, derandomized; CI's time budget; the refused shapes are also tested
explicitly below); HYPOTHESIS_PROFILE=explore (or LLM_ONNX_CONFIG_EXAMPLES=N) searches further.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from llm_onnx.errors import LlmOnnxError, ParityError
from llm_onnx.families import get_config
from llm_onnx.modeling.attention import attention_form
from tests.conftest import FAMILY_ARCHS, TINY_ARCHS
from tests.ort_helpers import Graphs, batch_logits, hf_logits
from tests.runtime.test_runtime_models import hf_greedy_run
from tests.tolerances import ORT_FP32

ARCHS = TINY_ARCHS + FAMILY_ARCHS
EXPLORE = os.environ.get("HYPOTHESIS_PROFILE") == "explore"
EXAMPLES = int(os.environ.get("LLM_ONNX_CONFIG_EXAMPLES") or (40 if EXPLORE else 1))
# Each drawn config is exported at fp32 (against transformers) and quantized (the parity gate):
# at both precisions when exploring, else at one, int8 and int4 by turns (CI's time budget: a
# quantized export costs as much as the fp32 one, most of it torch's tracing)
QUANTIZED = {arch: ("int8", "int4") if EXPLORE else (("int8", "int4")[i % 2],)
             for i, arch in enumerate(ARCHS)}

# Families whose transformers classes derive the head size from hidden_size / heads (Phi-3's
# validates its RoPE factors against that size), and those
# whose attention has as many KV heads as query heads (Falcon: one, or all of them).
DERIVED_HEAD = {"GPT2LMHeadModel", "OPTForCausalLM", "XGLMForCausalLM", "BloomForCausalLM",
                "FalconForCausalLM", "Phi3ForCausalLM"}
MHA = {"GPT2LMHeadModel", "OPTForCausalLM", "XGLMForCausalLM", "BloomForCausalLM"}
LLAMA_LIKE = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
              "Qwen3MoeForCausalLM", "SmolLM3ForCausalLM"}
# The first of each list is what the simplest draw takes: shapes the fused kernel refuses.
HEAD_DIMS = [24, 8, 12, 16, 20, 32, 40, 48, 64]
ROPE_SCALINGS = [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    None,
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 32},
]


@st.composite
def configs(draw, arch: str):
    base = get_config(arch)
    kind = base.architecture
    head_dim = draw(st.sampled_from(HEAD_DIMS))
    if kind in MHA:
        heads = kv = draw(st.integers(1, 4))
    elif kind == "FalconForCausalLM":
        heads = draw(st.integers(1, 4))
        kv = draw(st.sampled_from([1, heads]))
    else:
        kv = draw(st.integers(1, 3))
        heads = kv * draw(st.sampled_from([2, 1, 3, 4]))
    hidden = heads * head_dim if kind in DERIVED_HEAD else draw(st.sampled_from([40, 32, 64, 96]))
    layers = draw(st.integers(1, 2)) if base.layer_types is None else len(base.layer_types)
    changes: dict = dict(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
                         head_dim=head_dim, num_hidden_layers=layers,
                         intermediate_size=draw(st.sampled_from([48, 32, 96])),
                         tie_word_embeddings=draw(st.booleans()))
    if kind == "BloomForCausalLM":  # its MLP is 4 x hidden_size wide
        changes["intermediate_size"] = 4 * hidden
    if kind in LLAMA_LIKE:
        changes["rope_scaling"] = draw(st.sampled_from(ROPE_SCALINGS))
    if kind in ("LlamaForCausalLM", "SmolLM3ForCausalLM"):
        changes["attention_bias"] = draw(st.booleans())
        changes["mlp_bias"] = draw(st.booleans())
    if kind == "FalconForCausalLM":
        changes["attention_bias"] = changes["mlp_bias"] = draw(st.booleans())
    if kind == "XGLMForCausalLM":
        # transformers zeroes row pad_token_id of XGLM's table, read from row 2 on: 2 (the
        # simplest draw) zeroes position 0's row, up to 16 a row the prompts here read, 0 and
        # 1 rows no position reads, None none. (OPT's learned table has no padding row, and
        # the token embedding's padding_idx only initialises a row every checkpoint stores, so
        # no other family's positions depend on pad_token_id.)
        changes["position_padding_idx"] = draw(st.one_of(st.integers(2, 16),
                                                         st.sampled_from([None, 0, 1])))
    if kind == "MistralForCausalLM":
        changes["sliding_window"] = draw(st.one_of(st.integers(2, 8), st.none()))
    if kind == "Phi3ForCausalLM":
        # StableLM-like partial rotary widths: 0.75 x 24 = 18 (a half of 9), 0.25 x 40 = 10
        factor = draw(st.sampled_from([0.75, 0.25, 0.5, 1.0]))
        changes["partial_rotary_factor"] = factor
        half = int(head_dim * factor) // 2
        # LongRoPE's short factors: transformers takes them up to the original context, and
        # the export for tables no longer than it (docs/architectures.md)
        changes["rope_scaling"] = draw(st.sampled_from([None, {
            "rope_type": "longrope", "original_max_position_embeddings": 64,
            "short_factor": [1.0 + i / 8 for i in range(half)],
            "long_factor": [1.0 + i / 4 for i in range(half)]}]))
    if kind == "Gemma3ForCausalLM":
        changes["sliding_window"] = draw(st.integers(2, 6))
        changes["layer_types"] = tuple(draw(st.sampled_from(["sliding_attention",
                                                             "full_attention"]))
                                       for _ in range(layers))
        changes["rope_scaling"] = draw(st.sampled_from([None, {"rope_type": "linear",
                                                               "factor": 4.0}]))
    if kind == "GptOssForCausalLM":  # sinks in both attention forms, windows, YaRN or none
        changes["sliding_window"] = draw(st.integers(2, 6))
        changes["layer_types"] = tuple(draw(st.sampled_from(["sliding_attention",
                                                             "full_attention"]))
                                       for _ in range(layers))
        changes["rope_scaling"] = draw(st.sampled_from([base.rope_scaling, None, ROPE_SCALINGS[0]]))
    if kind == "Gemma4ForCausalLM":  # every switch drawn; the last layer full (transformers)
        changes["sliding_window"] = draw(st.integers(2, 6))
        types = tuple(draw(st.sampled_from(["sliding_attention", "full_attention"]))
                      for _ in range(layers - 1)) + ("full_attention",)
        changes["layer_types"] = types
        # shared layers need an earlier layer of their kind: else our config refuses the draw.
        # transformers 5.23's forward fails on shared layers without per-layer inputs (its
        # slicing before the shared layers indexes the absent inputs); the released models
        # with shared layers (E2B, E4B) have them
        per_layer = draw(st.sampled_from([8, 0, 16]))
        changes["hidden_size_per_layer_input"] = per_layer
        changes["num_kv_shared_layers"] = draw(st.integers(0, 2)) if per_layer else 0
        changes["use_double_wide_mlp"] = draw(st.booleans())
        changes["global_head_dim"] = draw(st.sampled_from([32, None, 24, 16, 64]))
        k_eq_v = draw(st.booleans())
        changes["attention_k_eq_v"] = k_eq_v
        changes["num_global_key_value_heads"] = draw(st.sampled_from(
            [None] + [n for n in (1, 2) if heads % n == 0])) if k_eq_v else None
        changes["rope_scaling"] = {"rope_type": "proportional",
                                   "partial_rotary_factor": draw(st.sampled_from([0.5, 0.25, 1.0]))}
        changes["enable_moe_block"] = draw(st.booleans())
        if not changes["enable_moe_block"]:
            changes["moe"] = None
    if base.positions.no_rope_layers is not None:  # SmolLM3: NoPE layers beside rotating ones
        layers = draw(st.integers(2, 3))
        flags = [draw(st.sampled_from([0, 1])) for _ in range(layers - 2)] + [1, 0]
        changes["num_hidden_layers"] = layers
        changes["no_rope_layers"] = tuple(draw(st.permutations(flags)))
        # transformers' windows: on the NoPE layers (its default layer_types)
        window = draw(st.one_of(st.integers(2, 8), st.none()))
        changes["sliding_window"] = window
        changes["layer_types"] = None if window is None else tuple(
            "full_attention" if f else "sliding_attention" for f in changes["no_rope_layers"])
    if base.linear_attention is not None:  # Qwen3.5, Qwen3-Next: the hybrid's own shapes
        layers = draw(st.integers(2, 3))
        # any mix with a layer of each kind (transformers runs no model without attention)
        kinds = [draw(st.sampled_from(["linear_attention", "full_attention"]))
                 for _ in range(layers - 2)] + ["linear_attention", "full_attention"]
        changes["num_hidden_layers"] = layers
        changes["layer_types"] = tuple(draw(st.permutations(kinds)))
        key_heads = draw(st.integers(1, 3))
        changes["linear_attention"] = dataclasses.replace(
            base.linear_attention, num_key_heads=key_heads,
            num_value_heads=key_heads * draw(st.sampled_from([2, 1, 3])),
            key_head_dim=draw(st.sampled_from([24, 16, 32, 64])),
            value_head_dim=draw(st.sampled_from([8, 16, 32, 48])),
            conv_kernel=draw(st.sampled_from([4, 2, 3])))
        changes["partial_rotary_factor"] = draw(st.sampled_from([0.25, 0.5, 1.0]))
        if base.moe is not None and base.moe.mlp_only_layers:  # Qwen3-Next: dense layers too
            changes["moe"] = dataclasses.replace(base.moe, mlp_only_layers=tuple(
                i for i in range(layers) if draw(st.booleans())))
    if base.moe is not None and changes.get("enable_moe_block", True):
        experts = draw(st.integers(2, 6))
        changes["moe"] = dataclasses.replace(
            changes.get("moe", base.moe),
            num_experts=experts, num_experts_per_tok=draw(st.integers(1, experts)),
            # False (Qwen1.5/Qwen2-MoE's router) is the simplest draw, so CI's one draw takes
            # it; Qwen3.5-MoE's router always renormalises
            norm_topk_prob=draw(st.booleans()) or kind in ("Qwen3_5MoeForCausalLM",
                                                           "GptOssForCausalLM",
                                                           "Gemma4ForCausalLM"),
            moe_intermediate_size=draw(st.sampled_from([16, 32])))
        if base.moe.swiglu_limit is not None:  # gpt-oss: the clamp biting or not
            changes["moe"] = dataclasses.replace(
                changes["moe"], swiglu_limit=draw(st.sampled_from([0.5, 7.0, 0.1])))
        if base.moe.shared_expert_intermediate_size is not None:
            changes["moe"] = dataclasses.replace(
                changes["moe"], shared_expert_intermediate_size=draw(st.sampled_from([24, 16])))
    return base, changes


def _check(base, changes, tmp_path, quantized=()) -> None:
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.runtime import Model
    from tests.hf_models import save_hf_checkpoint

    try:
        cfg = base.replace(**changes)
    except LlmOnnxError as e:  # our config refuses it: one line, naming the field
        assert "\n" not in str(e), e
        return
    hf = save_hf_checkpoint(cfg, tmp_path / "hf", seed=5, tokenizer=True)
    out = tmp_path / "onnx"
    start = time.monotonic()
    try:
        export_model(open_checkpoint(tmp_path / "hf"), out,
                     ExportOptions(precision="fp32", max_seq_len=48), progress=False)
    except LlmOnnxError as e:  # refused: at once, in one line, nothing left on disk
        message = str(e)
        assert not isinstance(e, ParityError), message  # graphs that part from the model: a bug
        assert "\n" not in message and "ONNXRuntimeError" not in message, message
        assert time.monotonic() - start < 5 and not out.exists(), message
        return
    graphs = Graphs(out)
    assert graphs.manifest["kv_cache"]["attention"] == attention_form(cfg).name
    rng = np.random.default_rng(3)
    rows = [rng.integers(0, cfg.vocab_size, n + 6).tolist() for n in (7, 3)]
    got = batch_logits(graphs, rows, [7, 3], 6)
    want = hf_logits(hf, rows, [7, 3], 6)
    assert max(np.abs(g - w).max() for g, w in zip(got, want)) <= ORT_FP32
    model = Model.load(out, provider="cpu")
    prompts = [r[:n] for r, n in zip(rows, (7, 3))]
    for prompt, result in zip(prompts, model.generate(prompts, max_new_tokens=8, temperature=0)):
        tokens, reason = hf_greedy_run(hf, prompt, 8, model.eos_token_ids)
        assert (result.token_ids, result.finish_reason) == (tokens, reason)
    # The same checkpoint quantized: valid, so never refused; the parity gate (ONNX Runtime
    # against torch on the written tensors) passes at each precision.
    for precision in quantized:
        quantized = export_model(open_checkpoint(tmp_path / "hf"), tmp_path / precision,
                                 ExportOptions(precision=precision, max_seq_len=48),
                                 progress=False)
        assert Graphs(quantized).manifest["parity"]["failures"] == []


@pytest.mark.parametrize("arch", ARCHS)
def test_random_configs_export_and_match_transformers(arch, tmp_path_factory):
    @settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(configs(arch))
    def check(drawn):
        base, changes = drawn
        _check(base, changes, tmp_path_factory.mktemp(arch), QUANTIZED[arch])

    check()


# The shapes that failed inside the parity gate with ONNX Runtime's own message before the
# fallback attention (a head of 24, a head of 8, Phi-3-style 0.75 of a head of 16, StableLM's
# 0.25 of 80), each exported and compared with transformers.
@pytest.mark.parametrize("arch, changes", [
    ("llama_tiny", dict(head_dim=24)),
    ("qwen3_tiny", dict(head_dim=8, hidden_size=32)),
    ("phi3_tiny", dict(head_dim=16, hidden_size=32, num_attention_heads=2,
                       partial_rotary_factor=0.75, rope_scaling=None)),
    ("phi3_tiny", dict(head_dim=80, hidden_size=160, num_attention_heads=2,
                       partial_rotary_factor=0.25, rope_scaling=None)),
    ("bloom_tiny", dict(head_dim=24, hidden_size=72, num_attention_heads=3,
                        num_key_value_heads=3, intermediate_size=288)),
])
def test_shapes_the_fused_kernel_refuses(arch, changes, tmp_path):
    _check(get_config(arch), changes, tmp_path)


# Gemma 4's switches, each off somewhere and on somewhere (gemma4_tiny has every one on): none
# of them; and keys that are values with experts but no shared layers, no per-layer inputs, one
# head size for both kinds and a layer pattern ending in two full layers.
@pytest.mark.parametrize("changes, quantized", [
    (dict(attention_k_eq_v=False, num_global_key_value_heads=None, num_kv_shared_layers=0,
         use_double_wide_mlp=False, hidden_size_per_layer_input=0, enable_moe_block=False,
         moe=None), None),
    (dict(num_kv_shared_layers=0, use_double_wide_mlp=False, hidden_size_per_layer_input=0,
         global_head_dim=None, layer_types=("sliding_attention", "sliding_attention",
                                            "full_attention", "full_attention")), "int4"),
    # the released head sizes, 256 and 512, with RoPE on a quarter of the full layers' pairs
    (dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
         global_head_dim=512, intermediate_size=64, embedding_multiplier=8.0,
         rope_scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25}), None),
], ids=["all-off", "k-eq-v-and-experts", "heads-256-and-512"])
def test_gemma4_switches(changes, quantized, tmp_path):
    # the experts' case quantized too (the random draw above is quantized as well)
    _check(get_config("gemma4_tiny"), changes, tmp_path, (quantized,) if quantized else ())


@pytest.mark.parametrize("precision, options", [
    ("fp16", {}), ("int8", {}), ("int4", {"accuracy_level": 0, "embedding_bits": None}),
    ("int4", {"accuracy_level": 4, "quant_scheme": "zero_point"})],
    ids=["fp16", "int8", "int4-exact", "int4-fast"])
def test_the_plain_attention_through_the_precisions(precision, options, tmp_path):
    """A head of 24 (plain attention) at every precision: the export's parity gate (ONNX
    Runtime against the torch decoder holding the written tensors) passes within the ladder's
    thresholds, and fp16 is within the fp16 tolerance of transformers."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from tests.hf_models import save_hf_checkpoint
    from tests.tolerances import ORT_FP16

    cfg = get_config("llama_tiny").replace(head_dim=24)
    hf = save_hf_checkpoint(cfg, tmp_path / "hf", seed=5, tokenizer=True)
    out = tmp_path / "onnx"
    export_model(open_checkpoint(tmp_path / "hf"), out,
                 ExportOptions(precision=precision, max_seq_len=48, **options), progress=False)
    graphs = Graphs(out)
    assert graphs.manifest["kv_cache"]["attention"] == "plain"
    parity = graphs.manifest["parity"]
    assert parity["scope"] == "whole model"
    assert parity["failures"] == [] and parity["kl_divergence"] <= parity["thresholds"]["kl"]
    if precision == "fp16":
        rng = np.random.default_rng(3)
        rows = [rng.integers(0, cfg.vocab_size, n + 6).tolist() for n in (7, 3)]
        got = batch_logits(graphs, rows, [7, 3], 6)
        want = hf_logits(hf, rows, [7, 3], 6)
        assert max(np.abs(g - w).max() for g, w in zip(got, want)) <= ORT_FP16

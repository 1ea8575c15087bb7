"""The CUDA path, checked on the CPU (CI has no GPU; ``pytest -m gpu`` runs tests/gpu on one):
folders built for CUDA (fp16 activations for quantized weights) against transformers, the
provider choice for folders that cannot run wholly on CUDA, ORT's fallback and placement logs,
and the decode bookkeeping that CUDA graphs need."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.errors import ConfigError, ExportError, ProviderError
from llm_onnx.export import ExportOptions
from llm_onnx.model_folder import load_manifest
from llm_onnx.runtime.core import engine as engine_mod
from llm_onnx.runtime.core import providers
from llm_onnx.runtime.core.engine import Engine, RuntimeOptions, graph_bucket
from tests.export.test_export import PROMPT_LENS, STEPS, rows_for
from tests.ort_helpers import Graphs, batch_logits, fidelity, hf_logits
from tests.perturb import ATTENTION_OUTPUT, perturbed


@pytest.fixture(autouse=True)
def fresh_probe():
    providers.cuda_status.cache_clear()
    yield
    providers.cuda_status.cache_clear()


# ----------------------------------------------------------------------------- export for CUDA

# Quantized weights with fp16 activations (what a CUDA folder computes in) against transformers
# fp32 on the float weights. Measured: KL <= 2e-4 (int8), <= 0.01 (int4) on these inputs.
CUDA_BARS = {"int8": {"kl": 1e-3, "margin": 0.05, "top1": 1.0, "clear": 5},
             "int4": {"kl": 0.03, "margin": 0.25, "top1": 0.8, "clear": 1}}


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama_tiny", "qwen3_tiny"])
def test_cuda_folders_compute_in_fp16_and_match_transformers(arch, precision, tiny_export,
                                                             tiny_hf):
    folder = tiny_export(arch, precision, target="cuda")
    m = load_manifest(folder)
    assert m.precision.target == "cuda" and m.kv_cache.dtype == "float16"
    assert m.precision.activations == "float16" and m.precision.quantization.accuracy_level == 0
    assert m.precision.quantization.scheme == "zero_point"  # one MatMulNBits per projection
    assert m.cuda_blockers() == []
    rows = rows_for(arch)
    got = batch_logits(Graphs(folder), rows, PROMPT_LENS, STEPS)
    want = hf_logits(tiny_hf(arch)[0], rows, PROMPT_LENS, STEPS)
    bar = CUDA_BARS[precision]
    f = fidelity(want, got, margin=bar["margin"])
    assert f["kl"] <= bar["kl"] and f["top1_clear"] >= bar["top1"] and f["clear"] >= bar["clear"], f
    with perturbed(tiny_hf(arch)[0], scale=0.3, pattern=ATTENTION_OUTPUT) as moved:
        assert fidelity(hf_logits(moved, rows, PROMPT_LENS, STEPS), got,
                        margin=bar["margin"])["kl"] > bar["kl"]


def test_the_runtime_path_matches_the_graphs(tiny_export):
    """The parity gate's CUDA leg (run_engine: rows prefilled alone, decoded together) on the
    CPU: the same logits as the plain graph run."""
    from llm_onnx.export.validate import DECODE_STEPS, run_engine, run_onnx
    from llm_onnx.families import get_config

    folder = tiny_export("qwen3_tiny", "int4", target="cuda")
    cfg = get_config("qwen3_tiny")
    fed = [np.array([[3], [5], [7]])] * DECODE_STEPS
    a = run_engine(Engine(folder, RuntimeOptions(provider="cpu")), cfg.vocab_size, fed)
    b = run_onnx(folder, cfg, np.float16, cfg.vocab_size, fed)
    for x, y in zip(a.logits, b.logits):
        np.testing.assert_allclose(x, y, atol=2e-3)


def test_fp32_alibi_and_kernel_limits_are_refused_for_cuda():
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.export import export_model
    from llm_onnx.families import PRESETS

    with pytest.raises(ConfigError, match="GroupQueryAttention"):
        ExportOptions(precision="fp32", target="cuda")
    with pytest.raises(ExportError, match="ALiBi"):
        export_model(random_checkpoint(PRESETS["bloom_tiny"], "b"), "/nonexistent/x",
                     ExportOptions(precision="fp16", target="cuda"), progress=False)
    with pytest.raises(ExportError, match="multiples of 64"):
        export_model(random_checkpoint(PRESETS["qwen3_moe_tiny"], "m"), "/nonexistent/x",
                     ExportOptions(precision="int4", target="cuda"), progress=False)
    with pytest.raises(ExportError, match="block size 256"):
        export_model(random_checkpoint(PRESETS["qwen3_tiny"], "q"), "/nonexistent/x",
                     ExportOptions(precision="int4", target="cuda", block_size=256),
                     progress=False)


def test_auto_target_is_cpu_without_a_gpu_and_cuda_with_one(monkeypatch):
    from llm_onnx.export.export import resolve_target
    from llm_onnx.families import PRESETS

    cfg = PRESETS["qwen3_tiny"]
    monkeypatch.setattr(providers, "cuda_status", lambda device_id=0: (False, "none"))
    assert resolve_target(ExportOptions(precision="int4"), cfg).target == "cpu"
    monkeypatch.setattr(providers, "cuda_status", lambda device_id=0: (True, "up"))
    assert resolve_target(ExportOptions(precision="int4"), cfg).target == "cuda"
    assert resolve_target(ExportOptions(precision="fp32"), cfg).target == "cpu"
    assert resolve_target(ExportOptions(precision="fp16"), PRESETS["bloom_tiny"]).target == "cpu"


# ----------------------------------------------------------------------------- provider choice

def _fake_cuda(monkeypatch):
    """A CUDA probe that says yes, and sessions created on the CPU whatever is asked (the folder
    is refused or moved to the CPU before any CUDA session would be made)."""
    monkeypatch.setattr(engine_mod, "resolve_provider",
                        lambda requested, device_id=0: providers.CPU if requested == "cpu"
                        else providers.CUDA)


def test_a_cpu_folder_under_auto_runs_on_cpu_and_says_why(monkeypatch, tiny_export, caplog):
    folder = tiny_export("llama_tiny", "int4")  # built for the CPU: float32 attention
    _fake_cuda(monkeypatch)
    with caplog.at_level("WARNING", logger="llm_onnx"):
        engine = Engine(folder, RuntimeOptions(provider="auto"))
    assert engine.provider == providers.CPU and engine.device == "cpu"
    assert len(engine.notes) == 1 and "float32" in engine.notes[0]
    assert "--target cuda" in caplog.text


def test_a_cpu_folder_under_provider_cuda_is_refused_with_the_fix(monkeypatch, tiny_export):
    folder = tiny_export("llama_tiny", "fp32")
    _fake_cuda(monkeypatch)
    with pytest.raises(ProviderError, match="--target cuda"):
        Engine(folder, RuntimeOptions(provider="cuda"))


def test_the_ep_error_banner_on_stdout_is_the_reason(monkeypatch):
    """onnxruntime's Python wrapper prints its fallback on stdout (print), not stderr."""
    monkeypatch.setattr(providers.ort, "get_available_providers",
                        lambda: [providers.CUDA, providers.CPU])

    class Session:
        def __init__(self, model, so, providers=None):
            print("EP Error: /onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:129 "
                  "std::conditional_t<THRW, void, onnxruntime::common::Status> "
                  "onnxruntime::CudaCall(ERRTYPE, const char*, const char*, SUCCTYPE, const "
                  "char*, const char*, int) CUDA failure 35: CUDA driver version is "
                  "insufficient for CUDA runtime version ; GPU=0 using "
                  "['CUDAExecutionProvider', 'CPUExecutionProvider']")
            print("Falling back to ['CPUExecutionProvider'] and retrying.")

        def get_providers(self):
            return [providers.CPU]

    monkeypatch.setattr(providers.ort, "InferenceSession", Session)
    usable, reason = providers.cuda_status(0)
    assert not usable and "CUDA driver version is insufficient" in reason
    assert "onnxruntime_src" not in reason


def test_the_probe_uses_the_configured_device(monkeypatch):
    seen = []
    monkeypatch.setattr(providers.ort, "get_available_providers",
                        lambda: [providers.CUDA, providers.CPU])

    class Session:
        def __init__(self, model, so, providers=None):
            seen.append(providers[0])

        def get_providers(self):
            return [providers_mod.CUDA]

    providers_mod = providers
    monkeypatch.setattr(providers.ort, "InferenceSession", Session)
    assert providers.resolve_provider("cuda", device_id=3) == providers.CUDA
    assert seen == [(providers.CUDA, {"device_id": 3})]


@pytest.mark.parametrize("choice, entry", [(None, None), (True, "1"), (False, "0")])
def test_the_fpa_intb_choice_reaches_the_cuda_session(monkeypatch, tiny_export, choice, entry):
    """RuntimeOptions.cuda_fpa_intb becomes ONNX Runtime's session entry on CUDA sessions only
    (left unset by default, so ORT's own default and its environment variable still apply)."""
    folder = tiny_export("qwen3_tiny", "int4", target="cuda")
    _fake_cuda(monkeypatch)
    made = []
    real = Engine._create

    class OnCuda:  # a CPU session that reports the provider it was asked for
        def __init__(self, session):
            self.session = session

        def get_providers(self):
            return [providers.CUDA, providers.CPU]

    def create(path, so, provider_list):
        try:
            entry = so.get_session_config_entry(engine_mod.FPA_INTB_ENTRY)
        except RuntimeError:  # ORT: "does not have configuration with key"
            entry = None
        made.append((entry, provider_list[0]))
        return OnCuda(real(path, so, [providers.CPU]))

    monkeypatch.setattr(Engine, "_create", staticmethod(create))
    engine = Engine(folder, RuntimeOptions(provider="cuda", cuda_fpa_intb=choice))
    assert engine.provider == providers.CUDA
    assert made and all(e == entry and p[0] == providers.CUDA for e, p in made), made
    made.clear()
    Engine(folder, RuntimeOptions(provider="cpu", cuda_fpa_intb=choice))
    assert made == [(None, providers.CPU)]  # the CPU provider never gets the CUDA entry


# ONNX Runtime's verbose log, verbatim
PLACEMENT_LOG = """\
2026-11-22 21:58:47.1 [V:onnxruntime:, session_state.cc:1 VerifyEachNodeIsAssignedToAnEp] Node placements
2026-11-22 21:58:47.1 [V:onnxruntime:, session_state.cc:1 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 60
2026-11-22 21:58:47.1 [V:onnxruntime:, session_state.cc:1 VerifyEachNodeIsAssignedToAnEp]   MatMulNBits (/model/layers.0/mlp/MatMulNBits)
2026-11-22 21:58:47.1 [V:onnxruntime:, session_state.cc:1 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 3
2026-11-22 21:58:47.1 [V:onnxruntime:, session_state.cc:1 VerifyEachNodeIsAssignedToAnEp]   Squeeze (n0_Squeeze)
2026-11-22 21:58:47.1 [V:onnxruntime:, session_state.cc:1 VerifyEachNodeIsAssignedToAnEp]   Sub (n0_Sub)
2026-11-22 21:58:47.1 [V:onnxruntime:, session_state.cc:1 VerifyEachNodeIsAssignedToAnEp]   GroupQueryAttention (/model/layers.0/attn/GroupQueryAttention)
2026-11-22 21:58:47.1 [V:onnxruntime:, graph.cc:9 Other] something else (entirely)
"""  # noqa: E501


def test_placement_log_names_the_compute_nodes_left_on_the_cpu():
    p = providers.parse_placement(PLACEMENT_LOG)
    assert p.found and p.counts == {providers.CUDA: 60, providers.CPU: 3}
    assert p.compute_on_cpu() == ["GroupQueryAttention"]  # shape arithmetic is not counted
    whole = providers.parse_placement(PLACEMENT_LOG.splitlines()[0] + "\n2026-11-22 x [V:o, "
                                      "a.cc:1 F]  All nodes placed on [CUDAExecutionProvider]. "
                                      "Number of nodes: 9\n")
    assert whole.counts == {providers.CUDA: 9} and whole.compute_on_cpu() == []


# ----------------------------------------------------------------------------- CUDA graphs

def test_graph_buckets():
    assert graph_bucket(1, 0, 8) == 1
    assert graph_bucket(3, 0, 8) == 4
    assert graph_bucket(5, 0, 6) == 6  # no bucket fits the cache: its own row count
    assert graph_bucket(9, 0, 32) == 16
    assert graph_bucket(2, 1, 8) is None  # not from row 0: no graph


def test_graph_decode_pads_to_the_bucket_and_keeps_riding_rows(monkeypatch, tiny_export):
    """The CUDA-graph bookkeeping on the CPU provider: a bucket of 4 rows decodes 3, the fourth
    rides along without advancing, and the logits equal a plain decode's."""
    folder = tiny_export("llama_tiny", "fp16", target="cuda")
    plain = Engine(folder, RuntimeOptions(provider="cpu"))
    graphs = Engine(folder, RuntimeOptions(provider="cpu"))
    graphs.cuda_graph = True  # the bookkeeping only; ORT's capture needs a GPU
    results = []
    for engine in (plain, graphs):
        cache = engine.new_cache(4, 24)
        for row, ids in enumerate(([1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11])):
            engine.prefill(cache, row, ids)
        steps = [np.asarray(engine.decode(cache, np.array([5, 6, 7]))).copy() for _ in range(3)]
        results.append((steps, cache.lengths.copy()))
    for a, b in zip(results[0][0], results[1][0]):
        assert a.shape == b.shape == (3, plain.vocab_size)
        np.testing.assert_allclose(a, b, atol=1e-3)
    assert results[1][1].tolist() == [6, 5, 7, 2]  # row 3 rode along, its length kept


def test_a_refused_capture_falls_back_with_one_line(monkeypatch, tiny_export):
    folder = tiny_export("llama_tiny", "fp16", target="cuda")
    engine = Engine(folder, RuntimeOptions(provider="cpu"))
    engine.cuda_graph = True
    cache = engine.new_cache(2, 16)
    engine.prefill(cache, 0, [1, 2, 3])
    engine.prefill(cache, 1, [4, 5])
    want = Engine(folder, RuntimeOptions(provider="cpu"))
    wcache = want.new_cache(2, 16)
    want.prefill(wcache, 0, [1, 2, 3])
    want.prefill(wcache, 1, [4, 5])

    class Refusing:
        def __init__(self, binding):
            self.binding, self.replays = binding, 0

        def run(self, *a):
            raise RuntimeError("CUDA graph capture failed: operation not permitted\nmore")

    real = cache.decode_binding

    def decode_binding(session, start, rows, vocab, run_options=None, graph_ids=None):
        binding = real(session, start, rows, vocab, run_options, graph_ids)
        return Refusing(binding) if graph_ids is not None else binding

    monkeypatch.setattr(cache, "decode_binding", decode_binding)
    got = engine.decode(cache, np.array([7, 8]))
    np.testing.assert_allclose(got, want.decode(wcache, np.array([7, 8])), atol=1e-3)
    assert not engine.cuda_graph and len(engine.notes) == 1
    assert engine.notes[0].startswith("CUDA graphs off: capturing") and "\n" not in engine.notes[0]

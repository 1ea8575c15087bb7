"""The engine: ONNX Runtime sessions over a model folder, and the two ways of running tokens
through the model with the KV cache bound in place (a chunk of one row, one token of many rows).

Memory: by default one session runs both phases on prefill.onnx (dynamic sequence length), so the
weights are loaded and prepacked once. Two sessions over the same weights.data each prepack their
own copy of every weight (measured in docs/performance.md), so ``sessions="pair"`` (prefill.onnx
and decode.onnx in separate sessions) exists for providers where the static decode graph pays
for itself (CUDA graphs), not as the CPU default.

``EngineProtocol`` is what the generator needs of an engine; ``Engine`` runs ONNX graphs, the
tests' fakes script logits.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import onnxruntime as ort

from llm_onnx.errors import GenerationError, ProviderError
from llm_onnx import model_folder as names
from llm_onnx.runtime.kv_cache import KVCache, KVLayout
from llm_onnx.model_folder import Manifest, load_manifest
from llm_onnx.runtime.onnx_check import check_external_data
from llm_onnx.runtime.providers import CPU, CUDA, quiet_session_options, resolve_provider

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
    """

    provider: str = "auto"
    threads: int | None = None
    optimization: str = "all"
    sessions: str = "single"
    verify: bool = True
    cuda_device: int = 0
    profile_dir: str | None = None

    def __post_init__(self) -> None:
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise ProviderError(f"optimization {self.optimization!r} is not one of "
                                f"{', '.join(OPTIMIZATION_LEVELS)}.")
        if self.sessions not in ("single", "pair"):
            raise ProviderError(f"sessions must be 'single' or 'pair', got {self.sessions!r}.")
        if self.threads is not None and self.threads < 1:
            raise ProviderError(f"threads must be at least 1, got {self.threads}.")


@runtime_checkable
class CacheProtocol(Protocol):
    """What a generator reads of a cache (KVCache; the fakes' caches)."""

    batch: int
    length: int

    def length_of(self, row: int) -> int: ...

    def truncate(self, row: int, length: int) -> None: ...

    def grow(self, length: int) -> None: ...

    def copy_prefix(self, src: int, dst: int, length: int) -> bool: ...


@runtime_checkable
class EngineProtocol(Protocol):
    """What a Generator needs of an engine: Engine runs the ONNX graphs; tests' fakes implement
    the same four members with scripted logits."""

    vocab_size: int
    context_length: int

    def new_cache(self, batch: int, length: int) -> CacheProtocol:
        """A cache of ``batch`` empty rows of ``length`` positions."""
        ...

    def prefill(self, cache: CacheProtocol, row: int, ids: Sequence[int] | np.ndarray,
                ) -> np.ndarray:
        """Run T tokens through one row after its valid positions; (V,) logits of the last."""
        ...

    def decode(self, cache: CacheProtocol, tokens: np.ndarray, active: np.ndarray | None = None,
               first_row: int = 0) -> np.ndarray:
        """One token for each of rows [first_row, first_row + len(tokens)); (n, V) logits;
        inactive rows ride along without advancing."""
        ...


class Engine:
    """A loaded model folder: manifest, ORT session(s), and runs of tokens through a KVCache.
    Thread-safe: each request (or scheduler) brings its own KVCache, which owns its bindings."""

    def __init__(self, folder: Path | str, options: RuntimeOptions | None = None) -> None:
        self.options = options or RuntimeOptions()
        self.manifest: Manifest = load_manifest(Path(folder), verify=self.options.verify)
        m = self.manifest
        self.vocab_size = m.vocab_size
        self.context_length = m.context_length
        self.provider = resolve_provider(self.options.provider)
        self.device = "cuda" if self.provider == CUDA else "cpu"
        kv = m.kv_cache
        self.layout = KVLayout(num_layers=kv.num_layers, kv_heads=kv.num_key_value_heads,
                               head_dim=kv.head_dim,
                               dtype=np.float16 if kv.dtype == "float16" else np.float32,
                               device=self.device, device_id=self.options.cuda_device)
        self.prefill_session = self._session(m.path("prefill"))
        self.decode_session = (self.prefill_session if self.options.sessions == "single"
                               else self._session(m.path("decode")))

    # ------------------------------------------------------------------ sessions

    def _session(self, path: Path) -> ort.InferenceSession:
        check_external_data(path)
        so = quiet_session_options()
        so.intra_op_num_threads = self.options.threads or default_threads()
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = OPTIMIZATION_LEVELS[self.options.optimization]
        if self.options.profile_dir is not None:
            so.enable_profiling = True
            so.profile_file_prefix = str(Path(self.options.profile_dir) / path.stem)
        providers: list = [CPU]
        if self.provider == CUDA:
            providers = [(CUDA, {"device_id": self.options.cuda_device,
                                 "arena_extend_strategy": "kSameAsRequested",
                                 "do_copy_in_default_stream": "1"}), CPU]
        try:
            session = ort.InferenceSession(str(path), so, providers=providers)
        except Exception as e:  # ORT's own exception types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ProviderError(f"{path}: ONNX Runtime cannot load this graph ({first[:300]}).") from e
        if self.provider == CUDA and CUDA not in session.get_providers():
            raise ProviderError(f"{path}: the CUDA session fell back to CPU.")
        return session

    def end_profiling(self) -> list[Path]:
        """Stop the profiler (RuntimeOptions.profile_dir) and return its trace files."""
        if self.options.profile_dir is None:
            raise GenerationError("this engine was loaded without RuntimeOptions(profile_dir=...).")
        sessions = [self.prefill_session]
        if self.decode_session is not self.prefill_session:
            sessions.append(self.decode_session)
        return [Path(s.end_profiling()) for s in sessions]

    def describe(self) -> str:
        threads = self.options.threads or default_threads()
        where = f"CUDA (device {self.options.cuda_device})" if self.provider == CUDA else \
            f"CPU ({threads} thread{'s' if threads > 1 else ''})"
        return f"{self.manifest.name} [{self.manifest.precision.precision}] on {where}"

    # ------------------------------------------------------------------ cache and steps

    def new_cache(self, batch: int, length: int) -> KVCache:
        if length > self.context_length:
            raise GenerationError(f"{length} tokens do not fit in the model's context of "
                                  f"{self.context_length} tokens.")
        return KVCache(self.layout, batch, length)

    def prefill(self, cache: KVCache, row: int, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Run ``ids`` (T >= 1 tokens) through row ``row`` after its valid positions; returns the
        (V,) float32 logits of the last one and advances the row's length by T.

        Batch 1 over the row's slice of the buffers: GroupQueryAttention continues a prompt over
        a past only at batch 1, which is all a chunked prefill needs.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        t = ids.shape[1]
        past = cache.length_of(row)
        total = past + t
        if t < 1:
            raise GenerationError("prefill needs at least one token.")
        if total > cache.length:
            raise GenerationError(f"the KV cache holds {cache.length} positions but {total} are "
                                  "needed.")
        binding = self.prefill_session.io_binding()
        binding.bind_cpu_input(names.INPUT_IDS, ids)
        binding.bind_cpu_input(names.SEQLENS_K, np.array([total - 1], dtype=np.int32))
        binding.bind_cpu_input(names.TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
        cache.bind(binding, row, row + 1)
        logits = np.empty((1, 1, self.vocab_size), dtype=np.float32)
        binding.bind_ortvalue_output(names.LOGITS, ort.OrtValue.ortvalue_from_numpy(logits))
        self.prefill_session.run_with_iobinding(binding)
        cache.advance(row, t)
        return logits[0, 0]

    def decode(self, cache: KVCache, tokens: np.ndarray, active: np.ndarray | None = None,
               first_row: int = 0) -> np.ndarray:
        """One token for each row of [first_row, first_row + n), n = len(tokens), in one batched
        run; returns (n, V) float32 logits and advances the length of the active rows by one.

        Rows with ``active[i]`` false (free rows, rows between prefill chunks, inside the range)
        ride along: their token is written at their first invalid position, which they never
        read, and their length stays, so a free row keeps its cached prefix. A full idle row
        gives up its last position for this. Riding along costs a row of compute: the generator
        keeps running rows together at the bottom of the cache.
        """
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = tokens.shape[0]
        rows = slice(first_row, first_row + n)
        if n < 1 or first_row < 0 or first_row + n > cache.batch:
            raise GenerationError(f"decode of rows [{first_row}, {first_row + n}) does not fit a "
                                  f"cache of {cache.batch} rows.")
        active = np.ones(n, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        lengths = cache.lengths[rows]
        if (lengths[active] >= cache.length).any():
            raise GenerationError(f"the KV cache holds {cache.length} positions but "
                                  f"{int(lengths[active].max()) + 1} are needed.")
        for i in np.flatnonzero(~active & (lengths >= cache.length)):
            cache.truncate(first_row + int(i), cache.length - 1)
        seqlens = cache.lengths[rows]  # the new token's position in each row
        binding = cache.decode_binding(self.decode_session, first_row, n, self.vocab_size)
        logits = binding.run(tokens, seqlens, int(seqlens.max()) + 1)
        cache.advance(first_row + np.flatnonzero(active), 1)
        return logits

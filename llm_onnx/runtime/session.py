"""ONNX Runtime sessions over a model folder, and one forward step with the KV cache bound in place.

Memory: by default one session runs both phases on prefill.onnx (dynamic sequence length), so the
weights are loaded and prepacked once. Two sessions over the same weights.data each prepack their
own copy of every weight (measured in docs/performance.md), so ``sessions="pair"`` (prefill.onnx
and decode.onnx in separate sessions) exists for providers where the static decode graph pays
for itself (CUDA graphs), not as the CPU default.

KV cache: one (B, Hkv, max_len, D) buffer per layer and per K/V, allocated for the request's
needs, bound as both ``past_key_values.N`` and ``present.N`` so GroupQueryAttention writes the new
rows into it: a decode step moves token ids in and logits out, nothing else.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from llm_onnx.errors import GenerationError, ProviderError
from llm_onnx.runtime import names
from llm_onnx.runtime.manifest import Manifest, load_manifest
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


class KVCache:
    """Per-request cache buffers, (B, Hkv, length, D) per layer for keys and values.

    ``lengths[b]`` counts the valid positions of row b. The buffers are OrtValues (on the GPU with
    CUDA) that the graphs update in place.
    """

    def __init__(self, engine: Engine, batch: int, length: int) -> None:
        self.engine, self.batch, self.length = engine, batch, length
        self.lengths = np.zeros(batch, dtype=np.int64)
        shape = (batch, engine.kv_heads, length, engine.head_dim)
        self.values = [engine.new_buffer(shape) for _ in range(2 * engine.num_layers)]
        self._decode: _DecodeBinding | None = None  # built on the first decode step

    def grow(self, length: int) -> None:
        """Reallocate with room for ``length`` positions, keeping the valid rows."""
        if length <= self.length:
            return
        old, old_len = self.values, self.length
        shape = (self.batch, self.engine.kv_heads, length, self.engine.head_dim)
        self.values = [self.engine.new_buffer(shape) for _ in range(2 * self.engine.num_layers)]
        for dst, src in zip(self.values, old):
            self.engine.copy_prefix(src, dst, old_len)
        self.length = length
        self._decode = None  # bound to the old buffers


class _DecodeBinding:
    """An IO binding kept for the life of a cache: the KV buffers stay bound as past and present,
    and the token ids, lengths and logits live in numpy arrays that ORT reads and writes in place.
    A decode step then fills three small arrays and runs; no per-step binding calls."""

    def __init__(self, engine: Engine, cache: KVCache, session: ort.InferenceSession) -> None:
        b = cache.batch
        self.ids = np.zeros((b, 1), dtype=np.int64)
        self.seqlens = np.zeros(b, dtype=np.int32)
        self.total = np.zeros((), dtype=np.int32)
        self.logits = np.empty((b, 1, engine.vocab_size), dtype=np.float32)
        self.session = session
        self.binding = session.io_binding()
        for name, arr in ((names.INPUT_IDS, self.ids), (names.SEQLENS_K, self.seqlens),
                          (names.TOTAL_SEQUENCE_LENGTH, self.total)):
            self.binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr))
        engine.bind_cache(self.binding, cache)
        self.binding.bind_ortvalue_output(names.LOGITS, ort.OrtValue.ortvalue_from_numpy(self.logits))

    def run(self, tokens: np.ndarray, seqlens: np.ndarray, total: int) -> np.ndarray:
        self.ids[:, 0] = tokens[:, 0]
        self.seqlens[:] = seqlens
        self.total[...] = total
        self.session.run_with_iobinding(self.binding)
        return self.logits[:, 0]


class Engine:
    """A loaded model folder: manifest, ORT session(s) and the step function. Thread-safe: each
    request brings its own KVCache and binding."""

    def __init__(self, folder: Path | str, options: RuntimeOptions | None = None) -> None:
        self.options = options or RuntimeOptions()
        self.manifest: Manifest = load_manifest(Path(folder), verify=self.options.verify)
        m = self.manifest
        self.num_layers = m.num_layers
        self.kv_heads = int(m.data["kv_cache"]["num_key_value_heads"])
        self.head_dim = int(m.data["kv_cache"]["head_dim"])
        self.kv_dtype = np.float16 if m.kv_dtype == "float16" else np.float32
        self.vocab_size = m.vocab_size
        self.context_length = m.context_length
        self.provider = resolve_provider(self.options.provider)
        self.device = "cuda" if self.provider == CUDA else "cpu"
        self.prefill = self._session(m.path("prefill"))
        self.decode = self.prefill if self.options.sessions == "single" else self._session(m.path("decode"))
        self._lock = threading.Lock()

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
        sessions = [self.prefill] if self.decode is self.prefill else [self.prefill, self.decode]
        return [Path(s.end_profiling()) for s in sessions]

    def describe(self) -> str:
        threads = self.options.threads or default_threads()
        where = f"CUDA (device {self.options.cuda_device})" if self.provider == CUDA else \
            f"CPU ({threads} thread{'s' if threads > 1 else ''})"
        return f"{self.manifest.data.get('name', 'model')} [{self.manifest.data['precision']['precision']}] on {where}"

    # ------------------------------------------------------------------ buffers

    def new_buffer(self, shape: tuple[int, ...]) -> ort.OrtValue:
        if self.device == "cuda":
            return ort.OrtValue.ortvalue_from_shape_and_type(shape, self.kv_dtype, "cuda",
                                                             self.options.cuda_device)
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype=self.kv_dtype))

    def copy_prefix(self, src: ort.OrtValue, dst: ort.OrtValue, length: int) -> None:
        """dst[:, :, :length] = src[:, :, :length] (growing a cache)."""
        if self.device == "cpu":
            d = dst.numpy()  # a view on CPU
            d[:, :, :length] = src.numpy()[:, :, :length]
            return
        host = dst.numpy()  # CUDA: round trip through the host, only when a chat outgrows its cache
        host[:, :, :length] = src.numpy()[:, :, :length]
        dst.update_inplace(host)

    def new_cache(self, batch: int, length: int) -> KVCache:
        if length > self.context_length:
            raise GenerationError(f"{length} tokens do not fit in the model's context of "
                                  f"{self.context_length} tokens.")
        return KVCache(self, batch, length)

    # ------------------------------------------------------------------ one step

    def step(self, cache: KVCache, ids: np.ndarray, prompt_lengths: np.ndarray | None = None,
             ) -> np.ndarray:
        """Run new tokens through the model; returns (B, V) float32 logits of each row's last new
        token and advances ``cache.lengths``.

        On an empty cache this is a first prompt: ``ids`` (B, T) right-padded, row b's tokens are
        ids[b, :prompt_lengths[b]]. Otherwise every row gets T new tokens (T > 1 only for B = 1:
        GroupQueryAttention's limit on continuing a prompt over a past).
        """
        b, t = ids.shape
        first = not cache.lengths.any()
        if first:
            new_lengths = (np.full(b, t, dtype=np.int64) if prompt_lengths is None
                           else np.asarray(prompt_lengths, dtype=np.int64))
            seqlens = new_lengths - 1
            total = t
        else:
            if t > 1 and b > 1:
                raise GenerationError("continuing a batch of several rows takes one token per row.")
            new_lengths = cache.lengths + t
            seqlens = new_lengths - 1
            total = int(seqlens.max()) + 1
        if total > cache.length:
            raise GenerationError(f"the KV cache holds {cache.length} positions but {total} are needed.")
        if t == 1 and not first:
            if cache._decode is None:
                cache._decode = _DecodeBinding(self, cache, self.decode)
            logits = cache._decode.run(ids, seqlens, total)
            cache.lengths = new_lengths
            return logits
        binding = self.prefill.io_binding()
        binding.bind_cpu_input(names.INPUT_IDS, np.ascontiguousarray(ids, dtype=np.int64))
        binding.bind_cpu_input(names.SEQLENS_K, seqlens.astype(np.int32))
        binding.bind_cpu_input(names.TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
        self.bind_cache(binding, cache)
        logits = np.empty((b, 1, self.vocab_size), dtype=np.float32)
        binding.bind_ortvalue_output(names.LOGITS, ort.OrtValue.ortvalue_from_numpy(logits))
        self.prefill.run_with_iobinding(binding)
        cache.lengths = new_lengths
        return logits[:, 0]

    def bind_cache(self, binding: ort.IOBinding, cache: KVCache) -> None:
        """Each layer's buffers as both past (input) and present (output): updated in place."""
        for i in range(self.num_layers):
            k, v = cache.values[2 * i], cache.values[2 * i + 1]
            binding.bind_ortvalue_input(names.PAST_KEY.format(i), k)
            binding.bind_ortvalue_input(names.PAST_VALUE.format(i), v)
            binding.bind_ortvalue_output(names.PRESENT_KEY.format(i), k)
            binding.bind_ortvalue_output(names.PRESENT_VALUE.format(i), v)

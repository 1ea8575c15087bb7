"""The engine: ONNX Runtime sessions over a model folder, and the two ways of running tokens
through the model with the KV cache bound in place (a chunk of one row, one token of many rows).

Memory: by default one session runs both phases on prefill.onnx (dynamic sequence length), so the
weights are loaded and prepacked once. Two sessions over the same weights.data each prepack their
own copy of every weight (measured in docs/performance.md), so ``sessions="pair"`` (prefill.onnx
and decode.onnx in separate sessions) exists for providers where the static decode graph pays
for itself (CUDA graphs), not as the CPU default.

``Engine`` runs ONNX graphs; what the generator needs of an engine is ``EngineProtocol``
(engine_protocol.py), which the tests' fakes implement with scripted logits.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from llm_onnx import kernels
from llm_onnx import model_folder as names
from llm_onnx.errors import GenerationError, ProviderError
from llm_onnx.model_folder import Manifest, load_manifest
from llm_onnx.runtime.core.device_pick import DevicePicker
from llm_onnx.runtime.core.kv_cache import KVCache, KVLayout, empty_image_inputs, kv_dtype
from llm_onnx.runtime.core.onnx_check import check_external_data
from llm_onnx.runtime.core.providers import (
    CPU,
    CUDA,
    captured_output,
    parse_placement,
    quiet_run_options,
    quiet_session_options,
    resolve_provider,
)
from llm_onnx.runtime.core.recurrent import HybridCache, StateLayout

# RuntimeOptions and the constants it uses live in runtime_options.py; importable from here too
from llm_onnx.runtime.core.runtime_options import (  # noqa: F401
    FPA_INTB_ENTRY,
    OPTIMIZATION_LEVELS,
    RuntimeOptions,
    default_threads,
)
from llm_onnx.runtime.core.vision import VisionEncoder

log = logging.getLogger("llm_onnx")

GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def graph_bucket(rows: int, first_row: int, cache_rows: int) -> int | None:
    """The captured batch size that decodes rows [0, rows): the smallest bucket >= rows that
    the cache has rows for (the cache's own row count when no bucket fits). None when the step
    does not start at row 0 (it then runs without a graph)."""
    if first_row != 0:
        return None
    for bucket in GRAPH_BUCKETS:
        if rows <= bucket <= cache_rows:
            return bucket
    return cache_rows if rows <= cache_rows else None


def not_generating(manifest: Manifest) -> str:
    """Why an embedding model's folder does not generate, and what does."""
    return (f"{manifest.folder} is an embedding model (exported with --task embed): it returns "
            "embeddings (Model.embed, `llm-onnx embed`, POST /v1/embeddings), not text. "
            "Generate with a folder exported with --task generate (the default).")


def _no_room(cache: KVCache, needed: int) -> GenerationError:
    return GenerationError(f"the KV cache holds {cache.length} positions but {needed} are needed.")


class _NodesOnCpu(ProviderError):
    """A CUDA session that ONNX Runtime would partly run on the CPU."""


class Engine:
    """A loaded model folder: manifest, ORT session(s), and runs of tokens through a KVCache.
    Thread-safe: each request (or scheduler) brings its own KVCache, which owns its bindings."""

    def __init__(self, folder: Path | str, options: RuntimeOptions | None = None,
                 manifest: Manifest | None = None) -> None:
        self.options = options or RuntimeOptions()
        self.manifest: Manifest = manifest or load_manifest(Path(folder),
                                                            verify=self.options.verify)
        m = self.manifest
        self.vocab_size = m.vocab_size
        self.context_length = m.context_length
        self.notes: list[str] = []  # one line each: why not CUDA, why no CUDA graphs
        self.placement: dict[str, str] = {}  # graph file -> "CUDA: n, CPU: m" (CUDA only)
        self.provider = resolve_provider(self.options.provider, self.options.cuda_device)
        if self.provider == CUDA:
            blockers = m.cuda_blockers()
            if blockers:
                self._leave_cuda(f"{m.folder}: {blockers[0]}")
        self.cuda_graph = self.provider == CUDA and self.options.cuda_graph is not False
        try:
            self._open_sessions()
        except _NodesOnCpu as e:
            self._leave_cuda(str(e))
            self.cuda_graph = False
            self._open_sessions()
        self._graph_ids = itertools.count(1)  # gpu_graph_id 0 is ORT's own
        # Seconds decode runs spent inside ONNX Runtime; the host's time between two decode runs
        # with no other run between them (bench's host_us_per_step), and how many such gaps.
        self.decode_run_s, self.decode_gap_s, self.decode_gaps = 0.0, 0.0, 0
        self._decode_ended: float | None = None
        # Every run logs errors only (a session made with check_placement was created verbose)
        # and, with CUDA graphs on, prefill and ungraphed decode run without one (id -1).
        self.run_options = quiet_run_options(-1 if self.cuda_graph else None)
        # decode(greedy=True) picks on the device (DevicePicker): no logits to the host
        self.picks_on_device = self.provider == CUDA
        self._picker: DevicePicker | None = None
        # from 2 rows (H200, qwen3_8b): the pick 0.07 ms at 1-16 rows, the host's copy and
        # argmax 0.06 ms at 1 row, 1.3 at 32 (docs/gpu-report.md)
        self.pick_min_rows = 2

    @classmethod
    def from_manifest(cls, manifest: Manifest, options: RuntimeOptions | None = None) -> Engine:
        """An engine over graphs described by ``manifest`` (its ``folder``), without reading
        manifest.json: the export's parity gate, before the real manifest exists."""
        assert manifest.folder is not None
        return cls(manifest.folder, options, manifest=manifest)

    def _leave_cuda(self, reason: str) -> None:
        """A folder that cannot run wholly on CUDA: an error for provider="cuda", the CPU with
        a one-line reason for "auto" (never CUDA with silent CPU islands)."""
        if self.options.provider == "cuda":
            raise ProviderError(f"{reason}. It cannot run wholly on CUDA; re-export it for the GPU "
                                "with `llm-onnx export --target cuda` (fp16, int8 or int4), or "
                                "run it with --provider cpu.")
        note = f"running on CPU, not CUDA: {reason} (re-export with --target cuda)"
        log.warning(note)
        self.notes.append(note)
        self.provider = CPU

    def _open_sessions(self) -> None:
        m = self.manifest
        if m.task != "generate":
            raise GenerationError(not_generating(m))
        self.device = "cuda" if self.provider == CUDA else "cpu"
        kv = m.kv_cache
        self.layout = KVLayout(num_layers=kv.num_layers, kv_heads=kv.num_key_value_heads,
                               head_dim=kv.head_dim,
                               dtype=kv_dtype(kv.dtype),
                               device=self.device, device_id=self.options.cuda_device,
                               layers=kv.layers,
                               shapes=tuple(kv.buffer_shape(j)
                                            for j in range(len(kv.layer_indices)))
                               if kv.shapes is not None else None,
                               sources={int(k): v for k, v in kv.sources.items()}
                               if kv.sources else None)
        rs = m.recurrent_state
        self.state_layout = None if rs is None else StateLayout(
            layers=rs.layers, conv_shape=rs.conv_shape, recurrent_shape=rs.recurrent_shape)
        self.prefill_session = self._session(m.path("prefill"))
        self.decode_session = (self.prefill_session if self.options.sessions == "single"
                               else self._session(m.path("decode")))
        # a folder that takes images: vision.onnx, and the image inputs of prefill.onnx
        self.vision = VisionEncoder(m, self._session) if m.images is not None else None
        self._image_inputs = {i.name: i for i in self.prefill_session.get_inputs()} \
            if m.images is not None else {}

    # ------------------------------------------------------------------ sessions

    def _session(self, path: Path) -> ort.InferenceSession:
        check_external_data(path)
        so = quiet_session_options()
        so.intra_op_num_threads = self.options.threads or default_threads()
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = OPTIMIZATION_LEVELS[self.options.optimization]
        if self.manifest.kernels is not None:  # llm-onnx's own operators (ModelFolderError if absent)
            kernels.register_for_folder(so, self.manifest.kernels.ops_version,
                                        self.manifest.kernels.ops, self.manifest.folder)
        if self.options.profile_dir is not None:
            so.enable_profiling = True
            so.profile_file_prefix = str(Path(self.options.profile_dir) / path.stem)
        if self.provider != CUDA:
            # No memory pattern: ONNX Runtime records a run's allocations and, at the next run
            # of the same shapes, takes them as one new block beside the arena's chunks, which
            # it keeps; the second of two 6,000-token prompts then peaked 137-299 MiB higher
            # (SmolLM2; 40 MiB at 1,024 tokens), at the same speed without it (2026-11-27,
            # docs/performance.md#memory-of-a-loaded-model).
            so.enable_mem_pattern = False
            return self._create(path, so, [CPU])
        # No spinning: the CPU threads only launch kernels; spinning would burn cores.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if self.options.cuda_fpa_intb is not None:
            so.add_session_config_entry(FPA_INTB_ENTRY, "1" if self.options.cuda_fpa_intb else "0")
        if self.options.check_placement:
            so.log_severity_level = 0  # verbose, captured: ORT's own "Node placements" log
        cuda = {"device_id": str(self.options.cuda_device),
                "arena_extend_strategy": "kSameAsRequested", "do_copy_in_default_stream": "1"}
        if self.cuda_graph:
            cuda["enable_cuda_graph"] = "1"
        with captured_output() as captured:
            try:
                session = self._create(path, so, [(CUDA, cuda), CPU])
                failure = None
            except ProviderError as e:
                failure = e
        if failure is not None and self.cuda_graph:
            self._no_graphs(f"ONNX Runtime refused CUDA graphs for {path.name} "
                            f"({str(failure).split('(', 1)[-1].rstrip(').')})")
            return self._session(path)
        if failure is not None:
            raise failure
        if CUDA not in session.get_providers():
            raise ProviderError(f"{path}: the CUDA session fell back to CPU.")
        placement = parse_placement(captured()) if self.options.check_placement else None
        if placement is not None and placement.found:
            self.placement[path.name] = placement.summary()
            on_cpu = placement.compute_on_cpu()
            if on_cpu:
                raise _NodesOnCpu(f"{path}: ONNX Runtime would run {', '.join(on_cpu)} on the CPU")
        return session

    def _no_graphs(self, reason: str) -> None:
        note = f"CUDA graphs off: {reason}"
        log.warning(note)
        self.notes.append(note)
        self.cuda_graph = False

    @staticmethod
    def _create(path: Path, so: ort.SessionOptions, providers: list) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(str(path), so, providers=providers)
        except Exception as e:  # ORT's own exception types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ProviderError(f"{path}: ONNX Runtime cannot load this graph ({first[:300]}).") from e

    def end_profiling(self) -> list[Path]:
        """Stop the profiler (RuntimeOptions.profile_dir) and return its trace files."""
        if self.options.profile_dir is None:
            raise GenerationError("this engine was loaded without RuntimeOptions(profile_dir=...).")
        sessions = [self.prefill_session]
        if self.decode_session is not self.prefill_session:
            sessions.append(self.decode_session)
        return [Path(s.end_profiling()) for s in sessions]

    def where(self) -> str:
        """Where the graphs run: 'CPU (2 threads)' or 'CUDA (device 0)'."""
        threads = self.options.threads or default_threads()
        return f"CUDA (device {self.options.cuda_device})" if self.provider == CUDA else \
            f"CPU ({threads} thread{'s' if threads > 1 else ''})"

    def describe(self) -> str:
        return f"{self.manifest.name} [{self.manifest.precision.precision}] on {self.where()}"

    # ------------------------------------------------------------------ cache and steps

    @property
    def kv_bytes_per_position(self) -> int:
        """Bytes of keys and values one position of a row holds (every attention layer)."""
        lay = self.layout
        return lay.position_values * np.dtype(lay.dtype).itemsize

    @property
    def state_bytes_per_row(self) -> int:
        """Bytes a row holds whatever its length: a recurrent state, its checkpoints and the
        copy a speculative verify takes (0 without linear-attention layers)."""
        if self.state_layout is None:
            return 0
        return self.state_layout.row_bytes * (2 + self.options.state_checkpoints)

    def row_bytes(self, positions: int) -> int:
        """Most bytes a row of a cache holds at ``positions`` positions."""
        return self.kv_bytes_per_position * positions + self.state_bytes_per_row

    def new_cache(self, batch: int, length: int) -> KVCache:
        if length > self.context_length:
            raise GenerationError(f"{length} tokens do not fit in the model's context of "
                                  f"{self.context_length} tokens.")
        if self.state_layout is not None:
            return HybridCache(self.layout, self.state_layout, batch, length,
                               self.options.state_checkpoints)
        return KVCache(self.layout, batch, length)

    def prefill(self, cache: KVCache, row: int, ids: Sequence[int] | np.ndarray,
                images: Any = None) -> np.ndarray:
        """Run ``ids`` (T >= 1 tokens) through row ``row`` after its valid positions; returns the
        (V,) float32 logits of the last one and advances the row's length by T. ``images``: an
        ImageChunk (generation/images.py) for a folder that takes images: the run's position
        rows and the image embeddings among its tokens (None: text, at the row's positions).

        Batch 1 over the row's slice of the buffers: GroupQueryAttention continues a prompt over
        a past only at batch 1, which is all a chunked prefill needs.
        """
        return self._chunk(cache, row, ids, 1, images)[0]

    @property
    def verifies(self) -> bool:
        """Whether a run can return the logits of every token it ran (``verify``): folders
        exported since prefill.onnx took logits_window, or with --all-logits."""
        return self.manifest.graphs["prefill"].logits in ("window", "all")

    def cannot_verify(self) -> str:
        return (f"{self.manifest.folder}: this folder's prefill.onnx returns the last token's "
                "logits only, which speculative decoding cannot use; re-export it with this "
                "version of llm-onnx (or decode without --speculative).")

    def verify(self, cache: KVCache, row: int, ids: Sequence[int] | np.ndarray,
               images: Any = None) -> np.ndarray:
        """``prefill`` that returns the (T, V) logits of every token it ran: a speculative step
        checks the k drafted tokens after the last picked one in one run (rejected positions are
        dropped afterwards with ``cache.truncate``); a scored prompt gets each token's logprob."""
        if not self.verifies:
            raise GenerationError(self.cannot_verify())
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return self._chunk(cache, row, ids, ids.shape[0], images)

    def _chunk(self, cache: KVCache, row: int, ids: Sequence[int] | np.ndarray,
               window: int, images: Any = None) -> np.ndarray:
        """Run a chunk of one row; the (window, V) logits of its last ``window`` tokens."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        t = ids.shape[1]
        past = cache.length_of(row)
        total = past + t
        if t < 1:
            raise GenerationError("prefill needs at least one token.")
        if total > cache.length:
            raise _no_room(cache, total)
        binding = self.prefill_session.io_binding()
        binding.bind_cpu_input(names.INPUT_IDS, ids)
        binding.bind_cpu_input(names.SEQLENS_K, np.array([total - 1], dtype=np.int32))
        binding.bind_cpu_input(names.TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
        every = self.manifest.graphs["prefill"].logits == "all"
        if window > 1 and not every:
            # an overridable initializer: bind_cpu_input does not find it, an OrtValue does
            binding.bind_ortvalue_input(names.LOGITS_WINDOW, ort.OrtValue.ortvalue_from_numpy(
                np.zeros(window, dtype=np.int64)))
        cache.bind(binding, row, row + 1)
        if cache.takes_valid_tokens:
            binding.bind_cpu_input(names.VALID_TOKENS, np.array([t], dtype=np.int32))
        if self._image_inputs:
            self._bind_images(binding, cache, row, past, t, images)
        logits = np.empty((1, t if every else window, self.vocab_size), dtype=np.float32)
        binding.bind_ortvalue_output(names.LOGITS, ort.OrtValue.ortvalue_from_numpy(logits))
        self._decode_ended = None  # the time to the next decode run is not a decode step's
        self.prefill_session.run_with_iobinding(binding, self.run_options)
        cache.advance(row, t)
        return logits[0, -window:]

    def _bind_images(self, binding: ort.IOBinding, cache: KVCache, row: int, past: int, t: int,
                     images: Any) -> None:
        """The image inputs of a chunk that prefill.onnx takes: ``images``' (an ImageChunk), or
        text at the row's positions (its length plus its position offset), causal."""
        feed: dict[str, np.ndarray | None]
        if images is None:
            rows = np.arange(past, past + t, dtype=np.int64) + cache.position_deltas[row]
            feed = {names.POSITION_IDS: np.broadcast_to(rows, (3, 1, t)),
                    names.ATTEND_UNTIL: np.zeros((1, t), np.int64),
                    **empty_image_inputs(self._image_inputs)}
        else:
            if images.positions.shape[-1] != t:
                raise GenerationError(f"the image inputs of a run of {t} tokens have positions "
                                      f"{images.positions.shape}.")
            feed = {names.POSITION_IDS: images.positions.reshape(-1, 1, t),
                    names.IMAGE_EMBEDS: images.embeds, names.IMAGE_TOKEN_INDEX: images.index,
                    names.DEEPSTACK_EMBEDS: images.deepstack,
                    names.ATTEND_UNTIL: None if images.attend_until is None else
                    images.attend_until.reshape(1, t)}
        for name, value in feed.items():
            if name in self._image_inputs and value is not None:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))

    def decode(self, cache: KVCache, tokens: np.ndarray, active: np.ndarray | None = None,
               first_row: int = 0, greedy: bool = False) -> np.ndarray:
        """One token for each row of [first_row, first_row + n), n = len(tokens), in one batched
        run; returns (n, V) float32 logits and advances the length of the active rows by one.
        ``greedy`` where ``picks_on_device``: (n,) int64 greedy ids instead, picked where the
        logits are (DevicePicker); the logits as ever if an active row's are not all finite.

        Rows with ``active[i]`` false (free rows, rows between prefill chunks, inside the range)
        ride along: their token is written at their first invalid position, which they never
        read, and their length stays, so a free row keeps its cached prefix. A full idle row
        gives up its last position for this (a cache with a spare position writes there). Riding
        along costs a row of compute: the generator keeps running rows together at the bottom of
        the cache.
        """
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        n = tokens.shape[0]
        if n < 1 or first_row < 0 or first_row + n > cache.batch:
            raise GenerationError(f"decode of rows [{first_row}, {first_row + n}) does not fit a "
                                  f"cache of {cache.batch} rows.")
        active = np.ones(n, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        # CUDA graphs replay fixed batch sizes: the rows up to the bucket ride along, inactive.
        bucket = graph_bucket(n, first_row, cache.batch) if self.cuda_graph else None
        if bucket is None and active.all():  # every row runs: no masks, one slice
            return self._decode_all(cache, tokens, first_row, greedy)
        if bucket is not None and bucket > n:
            tokens = np.concatenate([tokens, np.zeros(bucket - n, dtype=np.int64)])
            active = np.concatenate([active, np.zeros(bucket - n, dtype=bool)])
        rows = slice(first_row, first_row + tokens.shape[0])
        lengths = cache.lengths[rows]
        if (lengths[active] >= cache.length).any():
            raise _no_room(cache, int(lengths[active].max()) + 1)
        for i in np.flatnonzero(~active & (lengths >= cache.length + cache.spare)):
            cache.truncate(first_row + int(i), cache.length - 1)
        seqlens = cache.lengths[rows]  # the new token's position in each row
        if bucket is not None:
            logits = self._graph_decode(cache, tokens, seqlens, active, greedy)
        else:
            binding = cache.decode_binding(self.decode_session, first_row, n, self.vocab_size,
                                           self.run_options)
            logits = self._run(binding, tokens, seqlens, int(seqlens.max()) + 1, active, greedy)
        cache.advance(first_row + np.flatnonzero(active), 1)
        return logits[:n]

    def _run(self, binding, tokens, seqlens, total: int, active, greedy=False) -> np.ndarray:
        """A decode binding's run, its seconds inside ONNX Runtime added to decode_run_s."""
        greedy = greedy and self.picks_on_device and len(binding.ids) >= self.pick_min_rows
        logits = binding.run(tokens, seqlens, total, active, fetch=not greedy)
        self.decode_run_s += binding.last_run_s
        if self._decode_ended is not None:  # the host's time since the previous decode run
            self.decode_gap_s += binding.run_began - self._decode_ended
            self.decode_gaps += 1
        self._decode_ended = binding.run_began + binding.last_run_s
        if greedy:
            try:
                self._picker = self._picker or DevicePicker(self.provider,
                                                            self.options.cuda_device)
                ids = binding.pick(self._picker)
            except Exception as e:  # noqa: BLE001 - ORT refused the pick graph: logits from now on
                self.picks_on_device = False
                self.notes.append(f"greedy picks on the host: the device pick failed ({e})")
                log.warning(self.notes[-1])
                return binding.fetch()
            bad = ids < 0 if active is None else (ids < 0) & active
            logits = binding.fetch() if bad.any() else ids
        return logits

    def _decode_all(self, cache: KVCache, tokens: np.ndarray, first_row: int,
                    greedy: bool) -> np.ndarray:
        """decode() when every row runs and no CUDA graph replays it: the same checks and run,
        fewer numpy temporaries (host work after a run meets cold caches: docs/performance.md)."""
        n = tokens.shape[0]
        rows = slice(first_row, first_row + n)
        seqlens = cache.lengths[rows]  # the new token's position in each row
        longest = int(seqlens.max())
        if longest >= cache.length:
            raise _no_room(cache, longest + 1)
        binding = cache.decode_binding(self.decode_session, first_row, n, self.vocab_size,
                                       self.run_options)
        logits = self._run(binding, tokens, seqlens, longest + 1, None, greedy)
        cache.advance(rows, 1)
        return logits[:n]

    def _graph_decode(self, cache: KVCache, tokens: np.ndarray, seqlens: np.ndarray,
                      active: np.ndarray, greedy: bool) -> np.ndarray:
        """Rows [0, len(tokens)) through the CUDA graph of that batch size (captured at its
        first run); a failed capture turns graphs off and decodes without one."""
        rows = tokens.shape[0]
        binding = cache.decode_binding(self.decode_session, 0, rows, self.vocab_size,
                                       self.run_options, graph_ids=self._graph_ids)
        # ORT runs a graph's first call twice (a warm-up run, then the capture), and recurrent
        # states updated in place would take that step twice: the states as they were, then
        # the call again (a replay, once). Seen on an H200: Qwen3.5's steps 11% off.
        hybrid = cache if binding.replays == 0 and isinstance(cache, HybridCache) else None
        saved = hybrid.states_copy() if hybrid is not None else []
        try:
            if hybrid is not None:
                self._run(binding, tokens, seqlens, cache.length, active)
                hybrid.states_restore(saved)
            return self._run(binding, tokens, seqlens, cache.length, active, greedy)
        except Exception as e:  # noqa: BLE001 - ORT's capture errors: decode without graphs
            if binding.replays:
                raise
            if hybrid is not None:
                hybrid.states_restore(saved)
            self._no_graphs(f"capturing the decode graph of {rows} rows failed "
                            f"({str(e).strip().splitlines()[0][:200] if str(e).strip() else e})")
            plain = cache.decode_binding(self.decode_session, 0, rows, self.vocab_size,
                                         self.run_options)
            return self._run(plain, tokens, seqlens, int(seqlens.max()) + 1, active, greedy)

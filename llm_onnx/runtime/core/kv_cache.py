"""The KV cache: per layer one (batch, Hkv, length, D) buffer of keys and one of values, a row per
sequence (a "slot"), each row with its own valid length.

GroupQueryAttention reads row b's first ``seqlens_k[b] + 1`` positions and writes the new tokens'
keys and values right after the row's past, so a buffer bound as both ``past_key_values.N`` and
``present.N`` is updated in place. Rows [start, stop) of a C-contiguous buffer are one contiguous
(stop - start, Hkv, length, D) block at ``base + start * row_bytes``: one row is prefilled alone
(batch 1) over that block and then decoded with the rows beside it (batch n), with no copy. The
binding takes a device pointer, so the same code serves host buffers (CPU) and device buffers
(CUDA).

    rows of one buffer          a prefill chunk of row 2         a decode step of rows 0..3
    ┌──────────────────┐        binds rows [2, 3)                binds rows [0, 4)
    │ 0 ████████░░░░░░ │                                         (rows not decoding this step
    │ 1 ██████████████ │        ┌──────────────────┐              get a dummy token written past
    │ 2 ████░░░░░░░░░░ │  ───▶  │ 2 ████████░░░░░░ │              their valid length, which they
    │ 3 ██████░░░░░░░░ │        └──────────────────┘              ignore: see Engine.decode)
    └──────────────────┘
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnxruntime as ort

from llm_onnx import model_folder as names
from llm_onnx.errors import GenerationError
from llm_onnx.runtime.core.device_copy import Copy2D, HostMirror, cuda_copy2d
from llm_onnx.runtime.core.device_pick import DevicePicker, PickBinding
from llm_onnx.runtime.core.providers import quiet_run_options

KV_DTYPES = {"float32": np.float32, "float16": np.float16, "int8": np.int8}


def kv_dtype(name: str) -> type:
    """The numpy dtype of a manifest's kv_cache.dtype. An int8 cache's rows are copied and cut
    back like float ones: its scales are per layer, not per row, so its bytes mean the same in
    any row."""
    if name not in KV_DTYPES:
        raise GenerationError(f"the model folder's KV cache is {name!r}, which this llm-onnx does "
                              f"not allocate (it knows {', '.join(KV_DTYPES)}); upgrade llm-onnx "
                              "or re-export the model.")
    return KV_DTYPES[name]


@dataclass(frozen=True)
class KVLayout:
    """Shape and place of a model's cache: what the manifest's ``kv_cache`` section says, plus
    the device the engine runs on."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: type  # np.float32, np.float16, or np.int8 (an int8 cache: the graphs hold its scales)
    device: str = "cpu"  # "cpu" or "cuda"
    device_id: int = 0
    layers: tuple[int, ...] | None = None  # the layers that own buffers (None: all of them)
    # (KV heads, head size) per layer of layer_indices where they differ (Gemma 4's full
    # layers); None: (kv_heads, head_dim) for every buffer
    shapes: tuple[tuple[int, int], ...] | None = None
    # Gemma 4: {KV-shared layer: the buffer-owning layer whose buffer its present is bound to}
    sources: dict[int, int] | None = None

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return self.layers if self.layers is not None else tuple(range(self.num_layers))

    def row_shape(self, length: int, j: int = 0) -> tuple[int, int, int]:
        """One row's (Hkv, length, D) of the j-th buffer-owning layer."""
        if self.shapes is None:
            return (self.kv_heads, length, self.head_dim)
        heads, head_dim = self.shapes[j]
        return (heads, length, head_dim)

    @property
    def position_values(self) -> int:
        """Keys and values one position holds over every buffer-owning layer (numbers)."""
        return 2 * sum(self.row_shape(1, j)[0] * self.row_shape(1, j)[2]
                       for j in range(len(self.layer_indices)))


class KVCache:
    """Cache buffers for ``batch`` rows of ``length`` positions each.

    ``length_of(row)`` counts the valid positions of a row; the engine advances it when it runs
    tokens through the row, ``truncate`` drops positions from the end (rewinding a sequence, or
    keeping a prefix for the next request in this slot). Buffers are OrtValues (on the GPU with
    CUDA) that the graphs update in place.
    """

    def __init__(self, layout: KVLayout, batch: int, length: int) -> None:
        if batch < 1 or length < 1:
            raise GenerationError(f"a KV cache needs at least one row and one position, got "
                                  f"{batch} x {length}.")
        self.layout, self.batch, self.length = layout, batch, length
        self._lengths = np.zeros(batch, dtype=np.int64)
        # a folder that takes images: each row's position offset after its prompt (token i at
        # position i + delta in every multimodal RoPE row; generation/images.py)
        self.position_deltas = np.zeros(batch, dtype=np.int64)
        self._buffers = [self._new_buffer(length, j // 2)
                         for j in range(2 * len(layout.layer_indices))]
        # (session id, first row, rows, CUDA graph) -> its binding
        self._decode: dict[tuple[int, int, int, bool], _DecodeBinding] = {}

    # ------------------------------------------------------------------ lengths

    @property
    def lengths(self) -> np.ndarray:
        """Valid positions of every row (a read-only view)."""
        view = self._lengths.view()
        view.flags.writeable = False
        return view

    def length_of(self, row: int) -> int:
        return int(self._lengths[row])

    def truncate(self, row: int, length: int) -> None:
        """Keep at most the first ``length`` positions of ``row`` (later ones become stale and are
        overwritten by the next tokens run through the row)."""
        if length < 0:
            raise GenerationError(f"cannot truncate a cache row to {length} positions.")
        self._lengths[row] = min(int(self._lengths[row]), length)

    def kept(self, row: int, length: int) -> int:
        """The most of ``row``'s first ``length`` positions that ``truncate`` keeps exactly: a KV
        cache keeps any prefix (a recurrent state only those it has a copy of)."""
        return min(length, self.length_of(row))

    def checkpoint(self, row: int, transient: bool = False) -> None:
        """Remember ``row`` as it is now, to cut back to it later: nothing to do for keys and
        values, which stay per position (see HybridCache)."""

    def checkpoint_at(self, start: int, stop: int, prompt_length: int,
                      reuse_points: tuple[int, ...] = ()) -> int | None:
        """Where in (start, stop) a prompt's run should pause for a checkpoint: never here."""
        return None

    @property
    def state_bytes_per_row(self) -> int:
        """Bytes a row holds besides its positions' keys and values (recurrent states)."""
        return 0

    # whether the graphs take valid_tokens (models with linear-attention layers)
    takes_valid_tokens = False

    def advance(self, rows: slice | np.ndarray | int, count: int | np.ndarray) -> None:
        """Record that ``count`` positions were written after the valid ones of ``rows``."""
        self._lengths[rows] += count

    def clear(self) -> None:
        self._lengths[:] = 0

    # ------------------------------------------------------------------ buffers

    # Positions allocated past ``length`` per row: a row riding along in a decode step writes
    # its dummy token there instead of giving up its last position (HybridCache: 1, since a
    # recurrent state cannot give one up).
    spare = 0

    def _new_buffer(self, length: int, j: int = 0) -> ort.OrtValue:
        """A zeroed buffer of the j-th buffer-owning layer (its own shape: Gemma 4)."""
        shape = (self.batch, *self.layout.row_shape(length + self.spare, j))
        zeros = _lazy_zeros(shape, self.layout.dtype)
        if self.layout.device == "cuda":
            # Zeroed, not left as whatever the allocator held: attention kernels that mask
            # positions past a row's length still multiply them by zero, and NaN * 0 is NaN.
            return ort.OrtValue.ortvalue_from_numpy(zeros, "cuda", self.layout.device_id)
        return ort.OrtValue.ortvalue_from_numpy(zeros)

    def host_view(self, index: int) -> np.ndarray:
        """Buffer ``index`` (2 * j for keys, 2 * j + 1 for values of the j-th layer that owns a
        buffer) as numpy: the buffer itself on the CPU, a copy on CUDA."""
        return self._buffers[index].numpy()

    def grow(self, length: int) -> None:
        """Reallocate with room for ``length`` positions per row, keeping every row's valid ones."""
        if length <= self.length:
            return
        keep = int(self._lengths.max())
        old = self._buffers
        self._buffers = [self._new_buffer(length, j // 2) for j in range(len(old))]
        for src, dst in zip(old, self._buffers):
            host = dst.numpy()  # a view on the CPU; a host copy on CUDA, written back below
            host[:, :, :keep] = src.numpy()[:, :, :keep]
            if self.layout.device == "cuda":  # only when a conversation outgrows its cache
                dst.update_inplace(host)
        self.length = length
        self._decode.clear()  # bound to the old buffers

    def bind(self, binding: ort.IOBinding, start: int, stop: int) -> None:
        """Bind rows [start, stop) of every layer's buffers as both past (input) and present
        (output) of ``binding``: GroupQueryAttention then updates them in place."""
        lay = self.layout
        owner = {i: j for j, i in enumerate(lay.layer_indices)}
        readers: dict[int, list[int]] = {}  # Gemma 4: the shared layers reading each owner
        for shared, source in (lay.sources or {}).items():
            readers.setdefault(source, []).append(shared)
        for i, j in owner.items():  # (Gemma 4: buffers of two shapes)
            shape = [stop - start, *lay.row_shape(self.length + self.spare, j)]
            row_bytes = int(np.prod(lay.row_shape(self.length + self.spare, j))) \
                * np.dtype(lay.dtype).itemsize
            for buffer, past, present in ((self._buffers[2 * j], names.PAST_KEY, names.PRESENT_KEY),
                                          (self._buffers[2 * j + 1], names.PAST_VALUE,
                                           names.PRESENT_VALUE)):
                ptr = buffer.data_ptr() + start * row_bytes
                binding.bind_input(past.format(i), lay.device, lay.device_id, lay.dtype, shape, ptr)
                for layer in (i, *readers.get(i, ())):  # a shared layer's present: this buffer
                    binding.bind_output(present.format(layer), lay.device, lay.device_id,
                                        lay.dtype, shape, ptr)

    def decode_binding(self, session: ort.InferenceSession, start: int, rows: int,
                       vocab_size: int, run_options: ort.RunOptions | None = None,
                       graph_ids: Iterator[int] | None = None) -> _DecodeBinding:
        """The binding that decodes rows [start, start + rows) with ``session``, made once per
        range and kept until the buffers change. With ``graph_ids`` (CUDA graphs) its inputs and
        logits live at fixed device addresses and it replays the CUDA graph numbered by the
        next id (captured at its first run)."""
        key = (id(session), start, rows, graph_ids is not None)
        binding = self._decode.get(key)
        if binding is None:
            binding = self._decode[key] = _DecodeBinding(
                self, session, start, rows, vocab_size, run_options,
                next(graph_ids) if graph_ids is not None else None)
        return binding

    def copy_prefix(self, src: int, dst: int, length: int) -> bool:
        """Make row ``dst`` hold row ``src``'s first ``length`` positions (a prompt that starts
        like a free row's cached one runs only the rest). On a GPU the copy stays on the device
        (``device_copy``); False where it cannot (no CUDA runtime library to call)."""
        length = min(length, self.length_of(src))
        if self.layout.device == "cpu" and self._copy2d is None:
            for buffer in self._buffers:
                view = buffer.numpy()  # the buffer itself on the CPU
                view[dst, :, :length] = view[src, :, :length]
        else:
            if self._copy2d is None:
                self._copy2d = cuda_copy2d(self.layout.device_id) or False
            if self._copy2d is False:
                return False
            try:
                self._copy_rows(self._copy2d, src, dst, length)
            except RuntimeError:  # the runtime refused: prompts run in full from now on
                self._copy2d = False
                return False
        self._lengths[dst] = length
        return True

    # The strided copy copy_prefix uses off the CPU (None: chosen at the first copy; False: none
    # available). Tests set device_copy.host_copy2d to drive the device path on host buffers.
    _copy2d: Copy2D | Literal[False] | None = None

    def _copy_rows(self, copy2d: Copy2D, src: int, dst: int, length: int) -> None:
        """Positions [0, length) of row ``src`` to row ``dst`` in every buffer: per buffer one
        strided copy of Hkv runs (one a head) of ``length * D`` values at the row's pitch."""
        itemsize = np.dtype(self.layout.dtype).itemsize
        for index, buffer in enumerate(self._buffers):
            heads, positions, head_dim = self.layout.row_shape(self.length + self.spare,
                                                               index // 2)
            pitch = positions * head_dim * itemsize  # bytes of one head's positions
            row_bytes = heads * pitch
            base = buffer.data_ptr()
            copy2d(base + dst * row_bytes, pitch, base + src * row_bytes, pitch,
                   length * head_dim * itemsize, heads)


def empty_image_inputs(inputs: dict) -> dict[str, np.ndarray]:
    """No images for a graph that takes them: image_embeds (0, D), image_token_index (0,),
    deepstack_embeds (K, 0, D), their fixed sizes read from the graph's inputs."""
    out = {}
    for name, dtype in ((names.IMAGE_EMBEDS, np.float32), (names.IMAGE_TOKEN_INDEX, np.int64),
                        (names.DEEPSTACK_EMBEDS, np.float32)):
        if name in inputs:
            shape = [d if isinstance(d, int) else 0 for d in inputs[name].shape]
            if name == names.DEEPSTACK_EMBEDS:
                shape[1] = 0
            out[name] = np.zeros(shape, dtype=np.float16 if "float16" in inputs[name].type
                                 else dtype)
    return out


def _lazy_zeros(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A zero array in anonymous memory that the kernel maps 4 KiB page by page as it is first
    written: a cache for a long context costs memory as it fills.

    Not np.zeros: numpy asks for transparent huge pages on large arrays, and a cache row's first
    tokens then touch one 2 MiB page per head and layer, each zeroed (and compacted for) on the
    spot. On SmolLM2 with 8192 positions per row that made a new request's first 32-token
    prefill take 700-900 ms instead of 50 ms (measured in the server)."""
    count = int(np.prod(shape))
    itemsize = np.dtype(dtype).itemsize
    memory = mmap.mmap(-1, max(count * itemsize, 1))
    return np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)  # keeps memory alive


class _DecodeBinding:
    """An IO binding kept for the life of a cache's buffers: a range of rows bound as past and
    present, and the token ids, lengths and logits in numpy arrays that ORT reads and writes in
    place. A decode step fills three small arrays and runs; no per-step binding calls.

    With a ``graph_id`` (CUDA graphs) ids, lengths and logits are device buffers at fixed
    addresses, updated in place before each replay, and total_sequence_length (a CPU input of
    GroupQueryAttention, frozen into the captured graph) is the cache length: each row's own
    length comes from seqlens_k, which is all a one-token step reads."""

    def __init__(self, cache: KVCache, session: ort.InferenceSession, start: int, rows: int,
                 vocab_size: int, run_options: ort.RunOptions | None = None,
                 graph_id: int | None = None) -> None:
        self.ids = np.zeros((rows, 1), dtype=np.int64)
        self.seqlens = np.zeros(rows, dtype=np.int32)
        # models with linear-attention layers: which rows really run their token (1) or ride
        # along (0, their recurrent states stay as they are)
        self.valid = np.ones(rows, dtype=np.int32) if cache.takes_valid_tokens else None
        self.total = np.zeros((), dtype=np.int32)
        self.logits = np.empty((rows, 1, vocab_size), dtype=np.float32)
        self.session, self.graph_id, self.replays = session, graph_id, 0
        self.run_began = self.last_run_s = 0.0  # the last run's start and seconds in ORT
        self.picks: PickBinding | None = None  # pick(): a DevicePicker bound to the logits
        self.binding = session.io_binding()
        self.run_options = run_options or quiet_run_options()
        self.on_device = cache.layout.device != "cpu"
        # total_sequence_length stays in host memory (a CPU input of GroupQueryAttention), so
        # ORT reads the array itself at each run.
        self.binding.bind_ortvalue_input(names.TOTAL_SEQUENCE_LENGTH,
                                         ort.OrtValue.ortvalue_from_numpy(self.total))
        if not self.on_device:
            host = [(names.INPUT_IDS, self.ids), (names.SEQLENS_K, self.seqlens)]
            if self.valid is not None:
                host.append((names.VALID_TOKENS, self.valid))
            for name, arr in host:
                self.binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr))
            self.device_logits = ort.OrtValue.ortvalue_from_numpy(self.logits)
        else:
            # On a GPU, ORT copies a host input to the device when it is *bound*, not when it
            # runs: a host array updated in place would be read once (measured: every decode
            # step then saw the first step's ids and lengths). Device buffers, updated before
            # each run, at fixed addresses (which CUDA graphs also need).
            dev, dev_id = cache.layout.device, cache.layout.device_id
            self.device_ids = ort.OrtValue.ortvalue_from_numpy(self.ids, dev, dev_id)
            self.device_seqlens = ort.OrtValue.ortvalue_from_numpy(self.seqlens, dev, dev_id)
            self.device_logits = ort.OrtValue.ortvalue_from_shape_and_type(
                self.logits.shape, np.float32, dev, dev_id)
            self.binding.bind_ortvalue_input(names.INPUT_IDS, self.device_ids)
            self.binding.bind_ortvalue_input(names.SEQLENS_K, self.device_seqlens)
            # the logits come back into one page-locked host array, not a new one a step
            self.host_logits = HostMirror.make(self.logits.shape, np.float32, dev_id)
            if self.valid is not None:
                self.device_valid = ort.OrtValue.ortvalue_from_numpy(self.valid, dev, dev_id)
                self.binding.bind_ortvalue_input(names.VALID_TOKENS, self.device_valid)
        self.positions = self._bind_image_inputs(session, cache, start, rows)
        if graph_id is not None:
            self.total[...] = cache.length  # frozen into the captured graph
            self.run_options = quiet_run_options(graph_id)
        cache.bind(self.binding, start, start + rows)
        self.binding.bind_ortvalue_output(names.LOGITS, self.device_logits)

    def run(self, tokens: np.ndarray, seqlens: np.ndarray, total: int,
            active: np.ndarray | None = None, fetch: bool = True) -> np.ndarray | None:
        """One decode run; its (rows, V) logits on the host, or (``fetch`` false) None: they
        stay in ``device_logits`` for ``pick`` (and ``fetch`` later if need be)."""
        self.ids[:, 0] = tokens
        self.seqlens[:] = seqlens
        if self.valid is not None:
            self.valid[:] = 1 if active is None else active
            if self.on_device:
                self.device_valid.update_inplace(self.valid)
        if self.graph_id is None:
            self.total[...] = total
        if self.positions is not None:  # each row's next position, in all three rows
            self.positions[:, :, 0] = seqlens + self.deltas[self.start:self.start + len(seqlens)]
            if self.on_device:
                self.device_positions.update_inplace(self.positions)
        if self.on_device:
            self.device_ids.update_inplace(self.ids)
            self.device_seqlens.update_inplace(self.seqlens)
        self.run_began = time.perf_counter()
        self.session.run_with_iobinding(self.binding, self.run_options)
        self.last_run_s = time.perf_counter() - self.run_began
        self.replays += 1
        return self.fetch() if fetch else None

    def _bind_image_inputs(self, session: ort.InferenceSession, cache: KVCache, start: int,
                           rows: int) -> np.ndarray | None:
        """A graph that takes images: position_ids (3, rows, 1) (Qwen), filled at each run from
        the rows' lengths and position offsets, attend_until zeros (Gemma: causal), and no
        image embeddings (a decode step is text)."""
        inputs = {i.name: i for i in session.get_inputs()}
        for name, value in empty_image_inputs(inputs).items():
            self.binding.bind_cpu_input(name, value)
        if names.ATTEND_UNTIL in inputs:
            self.binding.bind_cpu_input(names.ATTEND_UNTIL, np.zeros((rows, 1), np.int64))
        if names.POSITION_IDS not in inputs:
            return None
        self.deltas, self.start = cache.position_deltas, start
        positions = np.zeros((3, rows, 1), dtype=np.int64)
        if self.on_device:
            self.device_positions = ort.OrtValue.ortvalue_from_numpy(
                positions, cache.layout.device, cache.layout.device_id)
            self.binding.bind_ortvalue_input(names.POSITION_IDS, self.device_positions)
        else:
            self.binding.bind_ortvalue_input(names.POSITION_IDS,
                                             ort.OrtValue.ortvalue_from_numpy(positions))
        return positions

    def fetch(self) -> np.ndarray:
        """The last run's (rows, V) logits in host memory."""
        if self.on_device:
            if self.host_logits is not None:
                try:
                    return self.host_logits.copy(self.device_logits.data_ptr())[:, 0]
                except RuntimeError:  # the runtime refused the copy: ORT's own, from now on
                    self.host_logits = None
            return self.device_logits.numpy()[:, 0]
        return self.logits[:, 0]

    def pick(self, picker: DevicePicker) -> np.ndarray:
        """The last run's greedy id of each row, taken where the logits are (DevicePicker),
        -1 for a row whose logits hold a NaN or an infinity."""
        if self.picks is None:
            self.picks = picker.bind(self.device_logits)
        return self.picks.pick()

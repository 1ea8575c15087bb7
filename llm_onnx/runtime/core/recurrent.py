"""The per-row state of hybrid models (Qwen3.5's Gated DeltaNet layers) beside their KV cache.

A linear-attention layer remembers a row's past in two fixed-size tensors, its conv state
(K-1, C) and its recurrent state (Hv, dk, dv), bound in place like the KV cache's rows. Unlike
keys and values they hold no positions: a row's state is the state after all of its tokens, and
cannot be cut back to fewer. So ``HybridCache`` keeps copies of a row's states (checkpoints) at
chosen lengths, and cutting a row back (``truncate``) restores the latest checkpoint at or
before the length asked for; the generator then runs the tokens after it again (it always runs
what the cache does not hold), so every caller of ``truncate`` stays correct:

    rewind, a new prompt reusing a prefix   back to the checkpoint at or before that length
    a rejected speculative draft            back to the copy taken before the verify run
                                            ("transient": one per row, replaced each time)
    a prompt's run                          pauses for a checkpoint at its reuse points (where a
                                            chat's system message and earlier turns end: what
                                            other requests share), ``CHECKPOINT_MARGIN`` tokens
                                            before its end (a chat's next turn re-renders the
                                            reply after it) and every ``CHECKPOINT_INTERVAL``
                                            tokens

Checkpoints are host copies of one row (``row_bytes`` each; at most ``checkpoints`` per row, the
oldest dropped first), so they cost memory, not model runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnxruntime as ort

from llm_onnx import model_folder as names
from llm_onnx.errors import GenerationError
from llm_onnx.runtime.core.device_copy import RowIO, cuda_row_io
from llm_onnx.runtime.core.kv_cache import KVCache, KVLayout, _lazy_zeros

CHECKPOINT_MARGIN = 8  # tokens before a prompt's end
CHECKPOINT_INTERVAL = 1024  # tokens between checkpoints of a long prompt


@dataclass(frozen=True)
class StateLayout:
    """The linear-attention layers' states (the manifest's ``recurrent_state``)."""

    layers: tuple[int, ...]
    conv_shape: tuple[int, ...]  # per row
    recurrent_shape: tuple[int, ...]  # per row

    @property
    def row_bytes(self) -> int:
        """Bytes of one row's states, every layer (float32)."""
        return 4 * len(self.layers) * (int(np.prod(self.conv_shape))
                                       + int(np.prod(self.recurrent_shape)))


Snapshot = list[np.ndarray]  # a row's states, layer by layer: conv, recurrent, conv, ...


class HybridCache(KVCache):
    """A KV cache for the attention layers and recurrent states for the linear-attention layers
    of ``batch`` rows; see the module docstring for what cutting a row back means here.

    Args:
        layout: the KV cache of the attention layers (``layout.layers``: which ones).
        state: the linear-attention layers' states.
        checkpoints: most checkpoints kept per row (besides one transient copy).
    """

    takes_valid_tokens = True
    spare = 1  # a full row riding along writes its dummy keys and values past its length

    def __init__(self, layout: KVLayout, state: StateLayout, batch: int, length: int,
                 checkpoints: int = 4) -> None:
        super().__init__(layout, batch, length)
        self.state = state
        self.max_checkpoints = checkpoints
        self._states = [self._new_state(shape) for _ in state.layers
                        for shape in (state.conv_shape, state.recurrent_shape)]
        self._saved: list[dict[int, Snapshot]] = [{} for _ in range(batch)]
        self._transient: list[tuple[int, Snapshot] | None] = [None] * batch
        self.restored_tokens = 0  # positions dropped past a request (re-run from a checkpoint)

    def _new_state(self, shape: tuple[int, ...]) -> ort.OrtValue:
        zeros = _lazy_zeros((self.batch, *shape), np.float32)
        if self.layout.device == "cuda":
            return ort.OrtValue.ortvalue_from_numpy(zeros, "cuda", self.layout.device_id)
        return ort.OrtValue.ortvalue_from_numpy(zeros)

    # ------------------------------------------------------------------ rows of the states

    # How rows of the states move on a GPU (None: chosen at first use; False: whole buffers
    # through numpy, where no CUDA runtime can be called). Tests set device_copy.RowIO() to drive
    # the row path on host buffers.
    _row_io: RowIO | Literal[False] | None = None

    def _device_rows(self) -> RowIO | None:
        if self._row_io is None:
            self._row_io = (cuda_row_io(self.layout.device_id) if self.layout.device == "cuda"
                            else None) or False
        return self._row_io or None

    def _shapes(self) -> list[tuple[int, ...]]:
        return [shape for _ in self.state.layers
                for shape in (self.state.conv_shape, self.state.recurrent_shape)]

    def _row(self, row: int) -> Snapshot:
        io = self._device_rows()
        if io is not None:
            try:
                out = []
                for buf, shape in zip(self._states, self._shapes()):
                    host = np.empty(shape, dtype=np.float32)
                    io.to_host(host.ctypes.data, buf.data_ptr() + row * host.nbytes, host.nbytes)
                    out.append(host)
                return out
            except RuntimeError:  # the runtime refused: whole buffers from now on
                self._row_io = False
        return [buf.numpy()[row].copy() for buf in self._states]

    def _set_row(self, row: int, snapshot: Snapshot | None) -> None:
        io = self._device_rows()
        if io is not None:
            try:
                for i, (buf, shape) in enumerate(zip(self._states, self._shapes())):
                    nbytes = 4 * int(np.prod(shape))
                    ptr = buf.data_ptr() + row * nbytes
                    if snapshot is None:
                        io.zero(ptr, nbytes)
                    else:
                        src = np.ascontiguousarray(snapshot[i], dtype=np.float32)
                        io.to_device(ptr, src.ctypes.data, nbytes)
                return
            except RuntimeError:  # the runtime refused: whole buffers from now on
                self._row_io = False
        for i, buf in enumerate(self._states):
            host = buf.numpy()  # the buffer itself on the CPU; a host copy on CUDA
            host[row] = 0 if snapshot is None else snapshot[i]
            if self.layout.device == "cuda":
                buf.update_inplace(host)

    @property
    def state_bytes_per_row(self) -> int:
        """The live states and the most checkpoints a row keeps (and its transient copy)."""
        return self.state.row_bytes * (2 + self.max_checkpoints)

    def checkpoints(self, row: int) -> list[int]:
        """The lengths ``row`` can be cut back to exactly (its own length besides)."""
        kept = set(self._saved[row])
        if self._transient[row] is not None:
            kept.add(self._transient[row][0])  # type: ignore[index]
        return sorted(kept)

    def kept(self, row: int, length: int) -> int:
        current = self.length_of(row)
        if length >= current:
            return current
        return max((p for p in self.checkpoints(row) if p <= length), default=0)

    def checkpoint(self, row: int, transient: bool = False) -> None:
        """Copy ``row``'s states at its current length; ``transient``: as the row's one copy
        for a speculative verify (replacing the previous), else as a checkpoint (the oldest
        dropped beyond ``max_checkpoints``)."""
        length = self.length_of(row)
        if length == 0:
            return  # zeros: no copy needed
        if transient:
            self._transient[row] = (length, self._row(row))
            return
        if self.max_checkpoints < 1 or length in self._saved[row]:
            return
        saved = self._saved[row]
        saved[length] = self._row(row)
        while len(saved) > self.max_checkpoints:
            del saved[next(iter(saved))]  # the oldest taken

    def checkpoint_at(self, start: int, stop: int, prompt_length: int,
                      reuse_points: tuple[int, ...] = ()) -> int | None:
        """The first length in (start, stop) where a prompt's run pauses for a checkpoint: the
        prompt's reuse points (where a later prompt may part from it: the end of a chat's
        system message, of its earlier turns), a margin before its end, and every
        CHECKPOINT_INTERVAL tokens; none that would leave the prompt's last run one token."""
        if self.max_checkpoints < 1:
            return None
        wanted = [p for p in range(CHECKPOINT_INTERVAL, prompt_length, CHECKPOINT_INTERVAL)]
        wanted += [*reuse_points, prompt_length - CHECKPOINT_MARGIN]
        return min((p for p in wanted if start < p < stop and p < prompt_length - 1),
                   default=None)

    def truncate(self, row: int, length: int) -> None:
        """Cut ``row`` back to ``kept(row, length)`` positions (the latest checkpoint at or
        before ``length``, zeros at none), which may be fewer than asked for."""
        if length < 0:
            raise GenerationError(f"cannot truncate a cache row to {length} positions.")
        current = self.length_of(row)
        if length >= current:
            return
        target = self.kept(row, length)
        if target == 0:
            self._set_row(row, None)
        else:
            transient = self._transient[row]
            snapshot = (transient[1] if transient is not None and transient[0] == target
                        else self._saved[row][target])
            self._set_row(row, snapshot)
        self.restored_tokens += length - target
        self._lengths[row] = target
        self._drop_after(row, target)

    def _drop_after(self, row: int, length: int) -> None:
        """Forget copies of ``row`` past ``length``: they belong to tokens no longer there."""
        self._saved[row] = {p: s for p, s in self._saved[row].items() if p <= length}
        if self._transient[row] is not None and self._transient[row][0] > length:  # type: ignore[index]
            self._transient[row] = None

    def clear(self) -> None:
        super().clear()
        for row in range(self.batch):
            self._set_row(row, None)
            self._saved[row] = {}
            self._transient[row] = None

    def copy_prefix(self, src: int, dst: int, length: int) -> bool:
        """Row ``dst`` takes row ``src``'s first ``length`` positions, which must be a length
        ``src`` keeps exactly (``kept``): its keys and values, and the states at that length."""
        length = min(length, self.length_of(src))
        if self.kept(src, length) != length or not super().copy_prefix(src, dst, length):
            return False
        if length == self.length_of(src):
            snapshot = self._row(src)
        else:
            transient = self._transient[src]
            snapshot = (transient[1] if transient is not None and transient[0] == length
                        else self._saved[src][length])
        self._set_row(dst, snapshot)
        self._saved[dst] = {length: [a.copy() for a in snapshot]} if length else {}
        self._transient[dst] = None
        return True

    # ------------------------------------------------------------------ binding

    def bind(self, binding: ort.IOBinding, start: int, stop: int) -> None:
        """Rows [start, stop) of the KV buffers and of the states, each as past and present."""
        super().bind(binding, start, stop)
        lay = self.layout
        st = self.state
        for j, layer in enumerate(st.layers):
            for buffer, shape, past, present in (
                    (self._states[2 * j], st.conv_shape, names.PAST_CONV, names.PRESENT_CONV),
                    (self._states[2 * j + 1], st.recurrent_shape, names.PAST_RECURRENT,
                     names.PRESENT_RECURRENT)):
                ptr = buffer.data_ptr() + start * 4 * int(np.prod(shape))
                dims = [stop - start, *shape]
                binding.bind_input(past.format(layer), lay.device, lay.device_id, np.float32,
                                   dims, ptr)
                binding.bind_output(present.format(layer), lay.device, lay.device_id,
                                    np.float32, dims, ptr)

    def states_copy(self) -> list[np.ndarray]:
        """Every row's states, on the host (see ``states_restore``)."""
        return [np.array(buf.numpy(), copy=True) for buf in self._states]

    def states_restore(self, copy: list[np.ndarray]) -> None:
        """Every row's states as ``states_copy`` took them."""
        for buf, host in zip(self._states, copy):
            if self.layout.device == "cuda":
                buf.update_inplace(host)
            else:
                buf.numpy()[...] = host  # the buffer itself

    def state_view(self, layer: int, which: str) -> np.ndarray:
        """A linear-attention layer's ``"conv"`` or ``"recurrent"`` state of every row (the
        buffer itself on the CPU, a copy on CUDA)."""
        j = self.state.layers.index(layer)
        return self._states[2 * j + (which == "recurrent")].numpy()

"""copy_prefix's device path (a strided cudaMemcpy2D a buffer) driven on host buffers with
device_copy.host_copy2d: its pointers, pitches and widths must move exactly what the numpy copy
of the CPU path moves, for every layout a cache can have (two buffer shapes as in Gemma 4's full
layers, a hybrid cache's spare position, an int8 cache). The CUDA call itself ran on a GPU
(docs/gpu-report.md); this checks the arithmetic around it on every CI run."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.runtime.core.device_copy import cuda_copy2d, host_copy2d
from llm_onnx.runtime.core.kv_cache import KVCache, KVLayout
from llm_onnx.runtime.core.recurrent import HybridCache, StateLayout


def _filled(cache: KVCache, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for buffer in cache._buffers:
        view = buffer.numpy()
        view[...] = rng.integers(-100, 100, view.shape).astype(view.dtype)


LAYOUTS = {
    "float32": KVLayout(num_layers=3, kv_heads=2, head_dim=8, dtype=np.float32),
    "int8": KVLayout(num_layers=2, kv_heads=4, head_dim=16, dtype=np.int8),
    "fp16, two shapes": KVLayout(num_layers=3, kv_heads=2, head_dim=8, dtype=np.float16,
                                 layers=(0, 2), shapes=((2, 8), (1, 32))),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("hybrid", [False, True])
def test_pointer_copy_moves_what_the_numpy_copy_moves(name, hybrid):
    def make() -> KVCache:
        layout = LAYOUTS[name]
        if hybrid:
            state = StateLayout(layers=(1,), conv_shape=(3, 6), recurrent_shape=(2, 4, 4))
            return HybridCache(layout, state, batch=3, length=11)
        return KVCache(layout, batch=3, length=11)

    reference, pointers = make(), make()
    pointers._copy2d = host_copy2d
    for cache in (reference, pointers):
        _filled(cache, seed=7)
        cache.advance(slice(None), np.array([6, 4, 0]))
        cache.checkpoint(0)  # a hybrid row copies only lengths it holds states for
        cache.advance(0, 3)
        assert cache.copy_prefix(0, 2, 6)
        assert cache.copy_prefix(0, 1, 20)  # more than row 0 holds: what it holds
    for a, b in zip(reference._buffers, pointers._buffers):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert list(pointers.lengths) == list(reference.lengths) == [9, 9, 6]
    # the copy left everything else alone: row 0 is as filled, row 2's positions past 6 too
    fresh = make()
    _filled(fresh, seed=7)
    for a, b in zip(fresh._buffers, pointers._buffers):
        np.testing.assert_array_equal(a.numpy()[0], b.numpy()[0])
        np.testing.assert_array_equal(a.numpy()[2, :, 6:], b.numpy()[2, :, 6:])
        np.testing.assert_array_equal(a.numpy()[0, :, :6], b.numpy()[2, :, :6])


def test_without_a_cuda_runtime_a_device_cache_declines(monkeypatch):
    """No CUDA runtime library: copy_prefix answers False (the prompt then runs in full)."""
    import llm_onnx.runtime.core.device_copy as device_copy

    monkeypatch.setattr(device_copy, "_cudart", None)
    assert device_copy.cuda_copy2d(0) is None
    cache = KVCache(LAYOUTS["float32"], batch=2, length=4)
    cache._copy2d = device_copy.cuda_copy2d(0) or False
    cache.advance(0, 3)
    assert not cache.copy_prefix(0, 1, 3)
    assert cache.length_of(1) == 0


def test_cuda_copy2d_is_none_or_callable():
    assert cuda_copy2d(0) is None or callable(cuda_copy2d(0))


class _FakeCudart:
    """cudaMemcpy / cudaHostRegister / cudaSetDevice on host memory (ctypes.memmove)."""

    def __init__(self, register_ok: bool = True) -> None:
        self.register_ok, self.registered, self.copies = register_ok, [], []
        self.last_error = 0

    def cudaHostRegister(self, ptr, size, flags):
        self.registered.append((ptr, size))
        if not self.register_ok:
            self.last_error = 712  # cudaErrorHostMemoryAlreadyRegistered
            return 712
        return 0

    def cudaHostUnregister(self, ptr):
        self.registered.remove(next(r for r in self.registered if r[0] == ptr))
        return 0

    def cudaGetLastError(self):
        error, self.last_error = self.last_error, 0
        return error

    def cudaSetDevice(self, device):
        return 0

    def cudaMemcpy(self, dst, src, size, kind):
        import ctypes

        if self.fail_copies:
            self.last_error = 1
            return 1
        self.copies.append((dst, src, size, kind))
        ctypes.memmove(dst, src, size)
        return 0

    def cudaGetErrorString(self, code):
        return b"invalid argument"

    fail_copies = False


@pytest.mark.parametrize("register_ok", [True, False])
def test_host_mirror_copies_into_one_lasting_page_aligned_array(monkeypatch, register_ok):
    """The decode step's logits on a GPU come back into one array made once (pinned where the
    runtime allows): each copy takes the whole buffer from the pointer given, device to host."""
    import llm_onnx.runtime.core.device_copy as device_copy

    fake = _FakeCudart(register_ok)
    monkeypatch.setattr(device_copy, "_load_cudart", lambda: fake)
    mirror = device_copy.HostMirror.make((3, 1, 10), np.float32, device_id=0)
    assert mirror.pinned == register_ok
    assert mirror.array.ctypes.data % 4096 == 0 and fake.registered == [
        (mirror.array.ctypes.data, 120)]
    first = np.arange(30, dtype=np.float32).reshape(3, 1, 10)
    got = mirror.copy(first.ctypes.data)
    np.testing.assert_array_equal(got, first)
    second = -first
    again = mirror.copy(second.ctypes.data)
    assert again is got  # the same array, refilled
    np.testing.assert_array_equal(got, second)
    assert [c[2:] for c in fake.copies] == [(120, 2), (120, 2)]  # whole buffer, device to host
    # a failed registration leaves no CUDA error behind for ONNX Runtime's next kernel check
    assert fake.last_error == 0
    mirror.close()  # unpinned before its pages go back (else the next pin there fails)
    assert fake.registered == [] if register_ok else len(fake.registered) == 1


def test_a_refused_copy_raises_and_leaves_no_cuda_error_behind(monkeypatch):
    """ONNX Runtime's next kernel check would report a CUDA error left set as its own."""
    import llm_onnx.runtime.core.device_copy as device_copy

    fake = _FakeCudart()
    monkeypatch.setattr(device_copy, "_load_cudart", lambda: fake)
    mirror = device_copy.HostMirror.make((2, 3), np.float32, device_id=0)
    fake.fail_copies = True
    with pytest.raises(RuntimeError, match="cudaMemcpy failed: CUDA error 1 .invalid argument"):
        mirror.copy(np.zeros(6, np.float32).ctypes.data)
    assert fake.last_error == 0


def test_without_a_cuda_runtime_there_is_no_mirror(monkeypatch):
    import llm_onnx.runtime.core.device_copy as device_copy

    monkeypatch.setattr(device_copy, "_cudart", None)
    assert device_copy.HostMirror.make((2, 4), np.float32, 0) is None


def test_hybrid_state_rows_move_alone_as_whole_buffers_did():
    """A hybrid cache's checkpoints and restores on a GPU move one row of each state buffer
    (device_copy.RowIO: pointer arithmetic driven here on host memory), not the whole buffer:
    every state must end exactly as with the numpy path, through checkpoints, a cut back to one,
    a restore to zeros, and a prefix copied between rows."""
    from llm_onnx.runtime.core.device_copy import RowIO

    state = StateLayout(layers=(1, 2), conv_shape=(3, 6), recurrent_shape=(2, 4, 5))
    layout = KVLayout(num_layers=3, kv_heads=2, head_dim=8, dtype=np.float32, layers=(0,))

    def run(rows_alone: bool) -> list[np.ndarray]:
        cache = HybridCache(layout, state, batch=3, length=12)
        if rows_alone:
            cache._row_io = RowIO()
        rng = np.random.default_rng(0)
        for step in range(3):
            for buf in cache._states:  # the model's run writes new states into every row
                buf.numpy()[...] = rng.standard_normal(buf.numpy().shape)
            cache.advance(slice(None), np.array([2, 3, 1]))
            cache.checkpoint(0)
            cache.checkpoint(1, transient=step == 2)
        cache.truncate(0, 4)  # back to the checkpoint at 4
        cache.truncate(2, 0)  # zeros
        assert cache.copy_prefix(1, 2, 6)  # row 1's checkpoint at 6
        return [buf.numpy().copy() for buf in cache._states] + [np.array(cache.lengths)]

    for got, want in zip(run(True), run(False)):
        np.testing.assert_array_equal(got, want)

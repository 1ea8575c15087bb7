"""Copies between rows of a cache buffer that lives on a GPU.

ONNX Runtime's Python API moves whole OrtValues between host and device but cannot copy part of
one device buffer to another place on the device. Copying a cached prompt prefix from one cache
row to another (``KVCache.copy_prefix``) needs exactly that: for each layer, ``Hkv`` runs of
``length * D`` values, one per head, at a fixed pitch (the row's allocated positions) in both
rows. That is one strided copy, CUDA's ``cudaMemcpy2D``, called here through ctypes from the
CUDA runtime library that ONNX Runtime's CUDA provider has already loaded (``preload_dlls`` or
the system's), so it runs on the same device context as the sessions.

``host_copy2d`` does the same on host memory (a ``memmove`` per run): the CPU tests drive the
pointer arithmetic of the device path with it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import mmap
import os
from collections.abc import Callable
from typing import Literal

import numpy as np

# copy2d(dst, dst_pitch, src, src_pitch, width, height): ``height`` runs of ``width`` bytes, the
# k-th at dst + k * dst_pitch and src + k * src_pitch (all in bytes)
Copy2D = Callable[[int, int, int, int, int, int], None]

_CUDA_MEMCPY_HOST_TO_DEVICE = 1
_CUDA_MEMCPY_DEVICE_TO_HOST = 2
_CUDA_MEMCPY_DEVICE_TO_DEVICE = 3
_cudart: ctypes.CDLL | Literal[False] | None = False  # False: not looked for yet; None: not found


def host_copy2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int,
                height: int) -> None:
    """``cudaMemcpy2D``'s contract on host memory."""
    for k in range(height):
        ctypes.memmove(dst + k * dst_pitch, src + k * src_pitch, width)


def _load_cudart() -> ctypes.CDLL | None:
    """The CUDA runtime already in the process (ONNX Runtime's CUDA provider needs it), or one
    from the nvidia-cuda-runtime wheel or the library path; None if there is none."""
    global _cudart
    if _cudart is not False:
        return _cudart
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    try:  # the pip wheel's copy (what onnxruntime.preload_dlls loads)
        import nvidia  # type: ignore[import-not-found]

        for root in getattr(nvidia, "__path__", []):
            names += sorted(glob.glob(os.path.join(root, "cu*", "lib", "libcudart.so.*")))
            names += sorted(glob.glob(os.path.join(root, "cuda_runtime", "lib",
                                                   "libcudart.so.*")))
    except ImportError:
        pass
    found = ctypes.util.find_library("cudart")
    if found:
        names.append(found)
    _cudart = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaMemcpy2D.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_size_t, ctypes.c_size_t,
                                     ctypes.c_int]
        lib.cudaMemcpy2D.restype = ctypes.c_int
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_int]
        lib.cudaMemcpy.restype = ctypes.c_int
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostRegister.restype = ctypes.c_int
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaHostUnregister.restype = ctypes.c_int
        lib.cudaGetLastError.restype = ctypes.c_int
        lib.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        lib.cudaMemset.restype = ctypes.c_int
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaSetDevice.restype = ctypes.c_int
        lib.cudaDeviceSynchronize.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        _cudart = lib
        break
    return _cudart


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        lib.cudaGetLastError()  # not left for ONNX Runtime's next kernel to report as its own
        raise RuntimeError(f"{what} failed: CUDA error {code} "
                           f"({lib.cudaGetErrorString(code).decode(errors='replace')})")


def _on_device(lib: ctypes.CDLL, device_id: int, what: str, call: Callable[[], int],
               wait: bool = True) -> None:
    """``call`` (a CUDA runtime call returning its error code) on GPU ``device_id``; ``wait``:
    then wait for the device. ONNX Runtime's runs go on its own streams, which do not wait for
    the legacy default stream these copies run on, and a copy from pageable memory may still be
    in flight when cudaMemcpy returns."""
    _check(lib, lib.cudaSetDevice(device_id), "cudaSetDevice")
    _check(lib, call(), what)
    if wait:
        _check(lib, lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def cuda_copy2d(device_id: int) -> Copy2D | None:
    """A device-to-device ``Copy2D`` on GPU ``device_id``, or None where the CUDA runtime
    library cannot be loaded. Each call waits for the copy to finish."""
    lib = _load_cudart()
    if lib is None:
        return None

    def copy2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int,
               height: int) -> None:
        _on_device(lib, device_id, "cudaMemcpy2D", lambda: lib.cudaMemcpy2D(
            dst, dst_pitch, src, src_pitch, width, height, _CUDA_MEMCPY_DEVICE_TO_DEVICE))

    return copy2d


class HostMirror:
    """A host array that a device buffer is copied into after each run, kept for the life of
    the buffer: page-locked (``cudaHostRegister``) where the CUDA runtime allows it, so the copy
    runs at the bus's speed. ``OrtValue.numpy()`` instead allocates a fresh pageable array per
    call; on an H200 that made the 32-row decode step's logits (19 MB at a 151,936-token
    vocabulary) cost more host time than the model run itself.

    ``copy(src_ptr)`` fills the array from device memory at ``src_ptr``; None from ``make``
    where the CUDA runtime cannot be loaded (callers keep ``numpy()`` then)."""

    def __init__(self, array: np.ndarray, lib: ctypes.CDLL, device_id: int) -> None:
        self.array, self._lib, self._device_id = array, lib, device_id
        self.pinned = lib.cudaHostRegister(array.ctypes.data, array.nbytes, 0) == 0
        if not self.pinned:
            # A failed CUDA call leaves its error as the thread's "last error", and ONNX
            # Runtime's next kernel check reads it as its own failure (seen on an H200: a Cast
            # node failing with cudaErrorHostMemoryAlreadyRegistered). Clear it here.
            lib.cudaGetLastError()

    def close(self) -> None:
        """Unpin the array (before its memory goes back: pages registered with CUDA and then
        unmapped make the next registration at that address fail)."""
        if self.pinned:
            self.pinned = False
            if self._lib.cudaHostUnregister(self.array.ctypes.data) != 0:
                self._lib.cudaGetLastError()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to unpin
            pass

    @classmethod
    def make(cls, shape: tuple[int, ...], dtype: type, device_id: int) -> HostMirror | None:
        lib = _load_cudart()
        if lib is None:
            return None
        count = int(np.prod(shape))
        nbytes = max(count * np.dtype(dtype).itemsize, 1)
        memory = mmap.mmap(-1, nbytes)  # page-aligned, as cudaHostRegister wants
        array: np.ndarray = np.frombuffer(memory, dtype=dtype, count=count).reshape(shape)
        array[...] = 0  # touch every page once, here rather than in the first copy
        return cls(array, lib, device_id)

    def copy(self, src_ptr: int) -> np.ndarray:
        lib, array = self._lib, self.array
        # a device-to-host cudaMemcpy returns when the copy is done: no wait needed
        _on_device(lib, self._device_id, "cudaMemcpy", lambda: lib.cudaMemcpy(
            array.ctypes.data, src_ptr, array.nbytes, _CUDA_MEMCPY_DEVICE_TO_HOST), wait=False)
        return array


class RowIO:
    """Whole-row copies between a device buffer and host memory (a hybrid cache's states: a
    checkpoint takes one row, a restore writes one back), instead of the whole (rows, ...)
    buffer through ``OrtValue.numpy()`` / ``update_inplace`` each time. This class works on host
    memory (``ctypes.memmove``): the CPU tests drive the callers' pointer arithmetic with it;
    ``cuda_row_io`` gives the device one."""

    def to_host(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def to_device(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def zero(self, dst: int, nbytes: int) -> None:
        ctypes.memset(dst, 0, nbytes)


class _CudaRowIO(RowIO):
    def __init__(self, lib: ctypes.CDLL, device_id: int) -> None:
        self._lib, self._device_id = lib, device_id

    def to_host(self, dst: int, src: int, nbytes: int) -> None:
        lib = self._lib
        _on_device(lib, self._device_id, "cudaMemcpy",
                   lambda: lib.cudaMemcpy(dst, src, nbytes, _CUDA_MEMCPY_DEVICE_TO_HOST))

    def to_device(self, dst: int, src: int, nbytes: int) -> None:
        lib = self._lib
        _on_device(lib, self._device_id, "cudaMemcpy",
                   lambda: lib.cudaMemcpy(dst, src, nbytes, _CUDA_MEMCPY_HOST_TO_DEVICE))

    def zero(self, dst: int, nbytes: int) -> None:
        lib = self._lib
        _on_device(lib, self._device_id, "cudaMemset", lambda: lib.cudaMemset(dst, 0, nbytes))


def cuda_row_io(device_id: int) -> RowIO | None:
    """Row copies on GPU ``device_id``; None where the CUDA runtime cannot be loaded."""
    lib = _load_cudart()
    return None if lib is None else _CudaRowIO(lib, device_id)

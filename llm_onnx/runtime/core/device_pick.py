"""Greedy picks where the logits are: on the GPU, a decode step's token ids come back instead of
its logits.

On CUDA a decode step's logits are (rows, 1, vocab) float32 in device memory; bringing them to
the host to take one argmax a row moves 19 MB at 32 rows of a 151,936-token vocabulary, and that
copy plus the rows' argmax were most of a 32-row step's host time on an H200
(docs/gpu-report.md). A greedy step needs one id a row: this module runs a two-node graph on the
logits where they lie (``TopK`` with k = 1, whose ties go to the lower index, as numpy's argmax;
and ``ReduceSum``, finite exactly when every logit of the row is) and brings back 8 + 4 bytes a
row. A row whose sum is not finite (a NaN or an infinity somewhere) is left to the host's own
slow path (``Sampler``), so the ids equal ``Sampler.pick_one`` on every input.

The graph is written here as protobuf bytes (the runtime does not depend on the ``onnx``
package); tests check it against ``onnx``'s checker and a numpy reference.
"""

from __future__ import annotations

import struct

import numpy as np
import onnxruntime as ort

LOGITS, IDS, SUMS = "logits", "ids", "sums"


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int64 values: ten bytes of two's complement
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _int_attribute(name: str, value: int) -> bytes:  # AttributeProto: name, i, type = INT
    return _bytes(1, name) + _int(3, value) + _int(20, 2)


def _node(op: str, inputs: list[str], outputs: list[str], attributes: list[bytes]) -> bytes:
    return (b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs)
            + _bytes(4, op) + b"".join(_bytes(5, a) for a in attributes))


def _int64_tensor(name: str, value: int) -> bytes:  # TensorProto: dims, data_type, name, raw
    return _int(1, 1) + _int(2, 7) + _bytes(8, name) + _bytes(9, struct.pack("<q", value))


def _value_info(name: str, elem_type: int, dims: list[str]) -> bytes:
    shape = b"".join(_bytes(1, _bytes(2, d)) for d in dims)  # Dimension.dim_param
    return _bytes(1, name) + _bytes(2, _bytes(1, _int(1, elem_type) + _bytes(2, shape)))


def pick_model() -> bytes:
    """The ONNX model (opset 13): ``logits`` float (rows, steps, vocab) -> ``ids`` int64
    (rows, steps, 1), the first index of each row's maximum, and ``sums`` float (rows, steps)."""
    graph = (_bytes(1, _node("TopK", [LOGITS, "k"], ["top", IDS],
                             [_int_attribute("axis", -1), _int_attribute("largest", 1),
                              _int_attribute("sorted", 1)]))
             + _bytes(1, _node("ReduceSum", [LOGITS, "axes"], [SUMS],
                               [_int_attribute("keepdims", 0)]))
             + _bytes(2, "device_pick")
             + _bytes(5, _int64_tensor("k", 1)) + _bytes(5, _int64_tensor("axes", -1))
             + _bytes(11, _value_info(LOGITS, 1, ["rows", "steps", "vocab"]))
             + _bytes(12, _value_info(IDS, 7, ["rows", "steps", "one"]))
             + _bytes(12, _value_info(SUMS, 1, ["rows", "steps"])))
    opset = _bytes(1, "") + _int(2, 13)
    return _int(1, 8) + _bytes(2, "llm-onnx") + _bytes(7, graph) + _bytes(8, opset)


class DevicePicker:
    """The pick graph in its own session on the decode graphs' device; ``bind`` ties it to one
    device logits buffer (a decode binding's, at a fixed address) for the life of that buffer."""

    def __init__(self, provider: str = "CPUExecutionProvider", device_id: int = 0) -> None:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 1
        providers: list = ["CPUExecutionProvider"]
        if provider == "CUDAExecutionProvider":
            providers.insert(0, (provider, {"device_id": str(device_id)}))
        self.session = ort.InferenceSession(pick_model(), so, providers=providers)
        self.run_options = ort.RunOptions()
        self.run_options.log_severity_level = 3
        self.run_options.add_run_config_entry("gpu_graph_id", "-1")  # see quiet_run_options

    def bind(self, logits: ort.OrtValue) -> PickBinding:
        return PickBinding(self, logits)


class PickBinding:
    """``pick()``: the greedy id of every row of the bound logits, -1 for a row that holds a NaN
    or an infinity (its caller brings that row's logits to the host)."""

    def __init__(self, picker: DevicePicker, logits: ort.OrtValue) -> None:
        rows, steps, _ = logits.shape()
        self.ids = np.zeros((rows, steps, 1), dtype=np.int64)
        self.sums = np.zeros((rows, steps), dtype=np.float32)
        self._picker = picker
        self._binding = picker.session.io_binding()
        self._binding.bind_ortvalue_input(LOGITS, logits)
        self._binding.bind_ortvalue_output(IDS, ort.OrtValue.ortvalue_from_numpy(self.ids))
        self._binding.bind_ortvalue_output(SUMS, ort.OrtValue.ortvalue_from_numpy(self.sums))

    def pick(self) -> np.ndarray:
        self._picker.session.run_with_iobinding(self._binding, self._picker.run_options)
        return np.where(np.isfinite(self.sums[:, 0]), self.ids[:, 0, 0], -1)

"""weights.data: 64-byte aligned tensors, duplicates stored once, sha256 computed while writing."""

from __future__ import annotations

import numpy as np

from llm_onnx.export.weights import WeightFile
from llm_onnx.model_folder import sha256_file


def test_duplicates_are_stored_once_and_the_hash_matches_the_file(tmp_path):
    wf = WeightFile(tmp_path / "weights.data")
    a = np.arange(10, dtype=np.float32)
    b = np.arange(7, dtype=np.uint8)
    wf.write("a", iter([a[:4], a[4:]]), (10,), np.dtype(np.float32))
    wf.write("b", iter([b]), (7,), np.dtype(np.uint8))
    wf.write("a_again", iter([a.reshape(2, 5)]), (2, 5), np.dtype(np.float32))  # same bytes
    wf.write("c", iter([a * 2]), (10,), np.dtype(np.float32))
    wf.close()
    t = wf.tensors
    assert t["a_again"].offset == t["a"].offset and t["a_again"].shape == (2, 5)
    assert all(s.offset % 64 == 0 for s in t.values())
    raw = (tmp_path / "weights.data").read_bytes()
    assert len(raw) == t["c"].offset + t["c"].length
    assert np.frombuffer(raw[t["c"].offset:], np.float32).tolist() == (a * 2).tolist()
    assert wf.sha256 == sha256_file(tmp_path / "weights.data")

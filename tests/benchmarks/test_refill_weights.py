"""python -m benchmarks.tools.refill_weights: how a full-size random-weights folder travels to the GPU machine
(graphs and small tensors packed, the large weights filled again there). Kept tensors must come
back byte for byte, the filled folder must pass the runtime's own checks (file sizes and sha256
in the manifest) and run, and a folder packed with everything kept must come back identical."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from benchmarks.tools import refill_weights as refill


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("precision", ["fp16", "int4"])
def test_pack_and_fill_again(tiny_export, tmp_path, precision):
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    folder = tiny_export("qwen3_tiny", precision, target="cuda")
    table = refill.tensor_table(folder)
    assert table and all(a["offset"] + a["length"] <= b["offset"] for a, b in zip(table, table[1:]))

    # everything kept: the same bytes
    refill.pack(folder, tmp_path / "all.tar.xz", keep_bytes=1 << 40, keep_quantized=True)
    same = refill.unpack(tmp_path / "all.tar.xz", tmp_path / "all")
    assert _sha(same / "weights.data") == _sha(folder / "weights.data")
    assert {p.name for p in same.iterdir()} == {p.name for p in folder.iterdir()}

    # only small tensors kept: those bytes back, the others new, and the folder loads and runs
    refill.pack(folder, tmp_path / "small.tar.xz", keep_bytes=2048)
    filled = refill.unpack(tmp_path / "small.tar.xz", tmp_path / "small")
    old, new = (folder / "weights.data").read_bytes(), (filled / "weights.data").read_bytes()
    assert len(old) == len(new) and old != new
    for entry in table:
        a, b = entry["offset"], entry["offset"] + entry["length"]
        assert (old[a:b] == new[a:b]) == (entry["length"] <= 2048 and entry["type"] != 2), \
            entry["name"]
    engine = Engine(filled, RuntimeOptions(provider="cpu", verify=True))
    cache = engine.new_cache(1, 16)
    logits = engine.prefill(cache, 0, np.arange(5))
    assert np.isfinite(logits).all()

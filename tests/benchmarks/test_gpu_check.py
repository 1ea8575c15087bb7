"""The GPU check's own code (python -m benchmarks.gpu.check), on the CPU (CI has no GPU): the
MatMulNBits check against its numpy reference, the speed loop over a tiny folder built for CUDA,
and the report."""

from __future__ import annotations

import json

import numpy as np

from benchmarks.gpu import check, correctness, kernels, speed


def test_matmulnbits_check_passes_on_onnx_runtime_and_fails_on_wrong_scales(monkeypatch):
    results = kernels.check_matmulnbits("cpu")
    assert set(results) == {f"int{b}/block{s}" for b in (4, 8) for s in (16, 32, 64, 128, 256)}
    assert all(r["ok"] and not r["errors"] for r in results.values()), results
    # The same check with the reference's scales off by 1%: it must fail.
    from llm_onnx.export import quant

    real = quant.dequantize
    monkeypatch.setattr(quant, "dequantize", lambda q, s, *a, **k: real(q, s * 1.01, *a, **k))
    assert not any(r["ok"] for r in kernels.check_matmulnbits("cpu").values())


def test_speed_loop_and_report(tiny_export, tmp_path):
    folder = tiny_export("llama_tiny", "int4", target="cuda")
    measured = speed.measure_speed(folder, "cpu", batches=(1, 2), steps=2, prefills=(8,),
                                   fpa_intb=True)
    for key in ("decode_tok_s_b1_graphs", "decode_tok_s_b2_graphs", "prefill_tok_s_8",
                "ttft_ms_56"):
        assert isinstance(measured[key], float) and measured[key] > 0, key
    # No CUDA here, so no graphs: the second load (without graphs) is skipped as redundant.
    assert measured["no_graphs_same_as_graphs"] and not measured["cuda_graph_used_graphs"]
    assert measured["cuda_fpa_intb"] is True  # ignored by the CPU provider, recorded all the same
    results = {"started": "now", "environment": {"onnxruntime": "x"}, "speed": {"int4": measured},
               "matmulnbits": {"int4/block32": {"ok": True, "relative_max_diff": 1e-4}},
               "errors": {}}
    check.write_report(tmp_path, results)
    assert json.loads((tmp_path / "gpu_check.json").read_text())["speed"]["int4"]["weights_bytes"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "## matmulnbits" in md and "| int4/block32 | yes |" in md and "## speed" in md
    assert np.isfinite(measured["decode_tok_s_b1_graphs"])


def test_kernel_timings_check_each_path_against_numpy(monkeypatch):
    shapes = {"small": (96, 128)}  # K not a multiple of 64: a ragged last block at 64
    results = kernels.bench_kernels("cpu", shapes, blocks=(32, 64), ms=(1, 3),
                                      target_bytes=1 << 16, reps=2)
    assert set(results) == {f"small/block{b}/{p}" for b in (32, 64)
                            for p in ("default", "fpa_intb")}
    for entry in results.values():
        assert entry["ok"] and entry["relative_max_diff"] < 5e-3, entry
        assert entry["copies"] > 1 and entry["us_m1"] > 0 and entry["gb_s_m3"] > 0, entry
    # A reference that reads the zero points one nibble off must fail every case.
    real = kernels.nbits_reference
    monkeypatch.setattr(kernels, "nbits_reference",
                        lambda x, ops, *a: real(x, {**ops, "z": ops["z"] ^ 0x11}, *a))
    again = kernels.bench_kernels("cpu", shapes, blocks=(32,), ms=(1,), target_bytes=1 << 16,
                                    reps=1)
    assert not any(e["ok"] for e in again.values()), again


def test_families_part_on_one_new_family(tmp_path, monkeypatch):
    """The new-family part over one hybrid folder on the CPU: the parity on the device is then
    the CPU against itself (zero), which still runs every step of it."""
    monkeypatch.setattr(correctness, "FAMILY_CASES", (("qwen3_5_tiny", "fp16"),))
    results = correctness.check_families(tmp_path, "cpu")
    entry = results["qwen3_5_tiny/fp16"]
    assert entry["ok"], entry
    assert entry["runtime_no_graphs"]["relative_max_diff"] == 0.0
    assert entry["decode_tok_s_b1_graphs"] > 0 and entry["export_gate"]["cpu_kl"] is not None
    assert entry["state_rewind"]["relative_max_diff"] == 0.0, entry["state_rewind"]
    assert entry["state_rewind"]["after_vs_cpu"] == 0.0


def test_state_rewind_catches_a_row_copy_at_the_wrong_offset(tiny_export, monkeypatch):
    """state_rewind through the device path's pointer arithmetic (device_copy.RowIO on host
    memory, as on CUDA): exact with the right offsets; a copy written back one row off (into
    row 0) fails it."""
    from llm_onnx.runtime.core import device_copy
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions
    from llm_onnx.runtime.core.recurrent import HybridCache

    engine = Engine(tiny_export("qwen3_5_tiny", "fp32"), RuntimeOptions(provider="cpu"))
    monkeypatch.setattr(HybridCache, "_row_io", device_copy.RowIO())
    good = correctness.state_rewind(engine, engine.vocab_size)
    assert good["ok"] and good["relative_max_diff"] == 0.0 and good["row_copies"] == "RowIO"

    class OneRowOff(device_copy.RowIO):
        def to_device(self, dst: int, src: int, nbytes: int) -> None:
            super().to_device(dst - nbytes, src, nbytes)

    monkeypatch.setattr(HybridCache, "_row_io", OneRowOff())
    assert not correctness.state_rewind(engine, engine.vocab_size)["ok"]

"""The GPU check's correctness parts: where every node runs (placement), the runtime on the
device against the CPU over a conversation (parity), the same for the 2026 families' tiny
models with a recurrent state's rewind (families)."""

from __future__ import annotations

import gc
import json
import traceback
from pathlib import Path

import numpy as np

from benchmarks.gpu.device import decode_rate, export_tiny, raw_placement

PRECISIONS = ("fp32", "fp16", "int8", "int4")


PLACEMENT_MODELS = ("qwen3_tiny", "qwen3_moe_tiny", "bloom_tiny")


def check_placement(root: Path, provider: str) -> dict:
    from llm_onnx.errors import LlmOnnxError
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    results = {}
    for name in PLACEMENT_MODELS:
        for precision in PRECISIONS:
            key = f"{name}/{precision}"
            entry: dict = {}
            target = "cuda" if precision != "fp32" and name != "bloom_tiny" else "cpu"
            try:
                folder = export_tiny(name, precision, target, root)
                entry["target"] = target
                if provider == "cuda":
                    entry["ort"] = raw_placement(folder / "prefill.onnx")
                engine = Engine(folder, RuntimeOptions(provider="auto", check_placement=True))
                entry["runtime_provider"] = engine.provider
                entry["notes"] = engine.notes
                entry["placement"] = engine.placement
                del engine
                try:
                    Engine(folder, RuntimeOptions(provider="cuda"))
                    entry["provider_cuda"] = "loaded"
                except LlmOnnxError as e:
                    entry["provider_cuda"] = f"refused: {e}"
                expect_gpu = provider == "cuda" and target == "cuda"
                on_cpu = entry.get("ort", {}).get("compute_on_cpu", [])
                entry["ok"] = (not expect_gpu or (entry["runtime_provider"].startswith("CUDA")
                                                  and not on_cpu)) and \
                    (target == "cuda" or provider != "cuda"
                     or entry["provider_cuda"].startswith("refused"))
            except Exception as e:  # noqa: BLE001 - recorded, the next model runs
                entry.update(ok=False, error=f"{type(e).__name__}: {e}",
                             trace=traceback.format_exc(limit=3))
            results[key] = entry
            print(f"placement {key}: {'ok' if entry.get('ok') else 'FAIL'} "
                  f"{entry.get('runtime_provider', '')} {entry.get('placement', '')} "
                  f"{entry.get('ort', {}).get('compute_on_cpu', '')} {entry.get('error', '')}",
                  flush=True)
    return results


def _run_conversation(engine, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """Batch of 2 ragged prompts, 6 decode steps together, then a second chat turn on row 0
    (a prefill continuing its past) after the cache grew, then 4 more steps of both rows.
    Tokens are fixed (teacher forcing), so two runs see the same inputs."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    cache = engine.new_cache(2, 24)
    lens = (13, 5)
    prompts = [rng.integers(0, vocab, n) for n in lens]
    out.append(np.stack([engine.prefill(cache, r, p) for r, p in enumerate(prompts)]))
    for _ in range(6):
        out.append(np.asarray(engine.decode(cache, rng.integers(0, vocab, 2))).copy())
    cache.grow(80)  # a conversation outgrowing its cache
    out.append(engine.prefill(cache, 0, rng.integers(0, vocab, 17))[None].copy())  # turn 2
    active = np.array([True, True])
    out.append(np.asarray(engine.decode(cache, rng.integers(0, vocab, 2), active)).copy())
    for _ in range(3):
        out.append(np.asarray(engine.decode(cache, rng.integers(0, vocab, 2))).copy())
    return out


def state_rewind(engine, vocab: int, seed: int = 1) -> dict:
    """Models with a recurrent state (Qwen3.5): the middle row of three checkpointed (one row's
    states copied out: on CUDA by cudaMemcpy at the row's offset), four steps decoded, the row
    cut back to the checkpoint (the copy written back) and the same four tokens decoded again
    alone: its logits must repeat, and the other rows' states must be untouched."""
    rng = np.random.default_rng(seed)
    cache = engine.new_cache(3, 32)
    for row, n in enumerate((7, 11, 4)):
        engine.prefill(cache, row, rng.integers(0, vocab, n))
    cache.checkpoint(1)
    steps = [rng.integers(0, vocab, 3) for _ in range(4)]
    first = [np.asarray(engine.decode(cache, t)).copy() for t in steps]
    cache.truncate(1, cache.length_of(1) - len(steps))
    again = [np.asarray(engine.decode(cache, t[1:2], first_row=1)).copy() for t in steps]
    diff = max(float(np.abs(a[1] - b[0]).max()) for a, b in zip(first, again))
    scale = max(1.0, max(float(np.abs(a[1]).max()) for a in first))
    after = np.asarray(engine.decode(cache, np.array([5, 5, 5]))).copy()  # rows 0, 2 go on
    return {"relative_max_diff": diff / scale, "row_copies": type(cache._row_io).__name__,
            "ok": diff / scale < 1e-3, "logits_after": after}


def check_parity(root: Path, provider: str) -> dict:
    results = {}
    for name in ("qwen3_tiny", "qwen3_moe_tiny"):
        for precision in ("fp16", "int4"):
            key = f"{name}/{precision}"
            try:
                entry = _parity_entry(export_tiny(name, precision, "cuda", root), provider)
            except Exception as e:  # noqa: BLE001
                entry = {"ok": False, "error": f"{type(e).__name__}: {e}",
                         "trace": traceback.format_exc(limit=4)}
            results[key] = entry
            print(f"parity {key}: {'ok' if entry.get('ok') else 'FAIL'} "
                  f"{json.dumps({k: v for k, v in entry.items() if k != 'trace'})[:600]}",
                  flush=True)
            gc.collect()
    return results


def _parity_entry(folder: Path, provider: str) -> dict:
    """The export's parity gate as recorded, then the runtime on ``provider`` against the
    runtime on the CPU over _run_conversation, without and with CUDA graphs."""
    from llm_onnx.model_folder import read_manifest
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    parity = read_manifest(folder).parity
    entry: dict = {"export_gate": {
        "cpu_relative_logits_diff": parity.relative_logits_diff,
        "cpu_kl": parity.kl_divergence,
        "cuda_relative_logits_diff": parity.cuda_relative_logits_diff,
        "cuda_kl": parity.cuda_kl_divergence,
        "cuda_greedy_agreement": parity.cuda_greedy_agreement}}
    vocab = read_manifest(folder).vocab_size
    ref = _run_conversation(Engine(folder, RuntimeOptions(provider="cpu")), vocab)
    for graphs in (False, True):
        engine = Engine(folder, RuntimeOptions(provider=provider, cuda_graph=graphs))
        got = _run_conversation(engine, vocab)
        diffs = [float(np.abs(a - b).max()) for a, b in zip(ref, got)]
        scale = max(1.0, max(float(np.abs(a).max()) for a in ref))
        agree = float(np.mean([(a.argmax(-1) == b.argmax(-1)).mean()
                               for a, b in zip(ref, got)]))
        entry[f"runtime_{'graphs' if graphs else 'no_graphs'}"] = {
            "relative_max_diff": max(diffs) / scale, "greedy_agreement": agree,
            "cuda_graph_used": bool(engine.cuda_graph), "notes": engine.notes,
            # per run of the conversation: prefill, 6 decode steps, turn 2, 4 decode steps
            "relative_diff_by_run": [round(d / scale, 6) for d in diffs],
            "logits_scale": scale}
        del engine
    entry["ok"] = all(v["relative_max_diff"] < 2e-2 for k, v in entry.items()
                      if k.startswith("runtime_"))
    return entry


# The 2026 families, tiny random checkpoints exported for CUDA: the hybrid
# linear attention (qwen3_5), its MoE form, attention sinks and clamped-SwiGLU experts (gpt_oss),
# Gemma 4's shared-KV and two-shape layers, and SmolLM3's no-RoPE layers.
FAMILY_CASES = (("qwen3_5_tiny", "fp16"), ("qwen3_5_tiny", "int4"), ("qwen3_5_moe_tiny", "int4"),
                ("gpt_oss_tiny", "fp16"), ("gpt_oss_tiny", "int4"), ("gemma4_tiny", "fp16"),
                ("gemma4_tiny", "int4"), ("smollm3_tiny", "fp16"))


def check_families(root: Path, provider: str, cases: tuple[tuple[str, str], ...] | None = None
                   ) -> dict:
    """Per new-family folder: where ONNX Runtime puts every node of both graphs, what the
    runtime decides, parity on the device against the CPU (with and without CUDA graphs), and
    batch-1 decode with CUDA graphs (a tiny model: the per-step cost of the host and the
    launches, not of the weights)."""
    from llm_onnx.model_folder import read_manifest
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    results = {}
    for name, precision in cases or FAMILY_CASES:
        key = f"{name}/{precision}"
        entry: dict = {}
        try:
            folder = export_tiny(name, precision, "cuda", root)
            if provider == "cuda":
                entry["ort"] = {g: raw_placement(folder / f"{g}.onnx")
                                for g in ("prefill", "decode") if (folder / f"{g}.onnx").is_file()}
            engine = Engine(folder, RuntimeOptions(provider="auto", check_placement=True))
            entry.update(runtime_provider=engine.provider, notes=engine.notes,
                         placement=engine.placement)
            del engine
            entry.update(_parity_entry(folder, provider))
            if read_manifest(folder).recurrent_state is not None:
                vocab = read_manifest(folder).vocab_size
                rewind = state_rewind(Engine(folder, RuntimeOptions(provider=provider)), vocab)
                cpu = state_rewind(Engine(folder, RuntimeOptions(provider="cpu")), vocab)
                got, ref = rewind.pop("logits_after"), cpu.pop("logits_after")
                rewind["after_vs_cpu"] = float(np.abs(got - ref).max()) / max(
                    1.0, float(np.abs(ref).max()))
                rewind["ok"] = rewind["ok"] and rewind["after_vs_cpu"] < 2e-2
                entry["state_rewind"] = rewind
                entry["ok"] = entry["ok"] and rewind["ok"]
            engine = Engine(folder, RuntimeOptions(provider=provider))
            entry["decode_tok_s_b1_graphs"] = decode_rate(engine, 1, 32, 32,
                                                           read_manifest(folder).vocab_size)
            entry["cuda_graph_used"] = bool(engine.cuda_graph)
            del engine
            on_cpu = [op for g in entry.get("ort", {}).values() for op in g["compute_on_cpu"]]
            entry["ok"] = entry["ok"] and (provider != "cuda" or (
                entry["runtime_provider"].startswith("CUDA") and not on_cpu))
        except Exception as e:  # noqa: BLE001 - recorded, the next model runs
            entry.update(ok=False, error=f"{type(e).__name__}: {e}",
                         trace=traceback.format_exc(limit=4))
        results[key] = entry
        print(f"families {key}: {'ok' if entry.get('ok') else 'FAIL'} "
              f"{json.dumps({k: v for k, v in entry.items() if k != 'trace'}, default=str)[:700]}",
              flush=True)
        gc.collect()
    return results

"""What the GPU checks share: the GPU's environment and memory (nvidia-smi), the tiny presets
and the full-size qwen3_8b exported for a target, where ONNX Runtime places a graph's nodes, and
the decode rate of an engine's rows."""

from __future__ import annotations

import contextlib
import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np


def environment() -> dict:
    import onnxruntime as ort

    from llm_onnx.runtime.core.providers import cuda_status

    env = {"python": platform.python_version(), "onnxruntime": ort.__version__,
           "providers": ort.get_available_providers(), "cuda_usable": list(cuda_status())}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        env["gpu"] = out.stdout.strip()
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines():
            if "CUDA Version" in line:
                env["driver_cuda"] = line.split("CUDA Version:")[1].split("|")[0].strip()
    except (OSError, subprocess.SubprocessError) as e:
        env["gpu"] = f"nvidia-smi unavailable ({e})"
    from importlib import metadata

    for dist in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cudnn-cu13",
                 "nvidia-cublas", "nvidia-cublas-cu13", "onnxruntime-gpu", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            env[dist] = metadata.version(dist)
    with contextlib.suppress(Exception):
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["torch_cudnn"] = torch.backends.cudnn.version()
    return env


def gpu_memory_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits"], capture_output=True, text=True, timeout=30)
        return float(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def export_tiny(name: str, precision: str, target: str, root: Path, max_len: int = 256) -> Path:
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.families import PRESETS

    out = root / f"{name}-{precision}-{target}"
    cfg = PRESETS[name]
    if cfg.moe is not None and target == "cuda":
        # CUDA QMoE needs expert widths in multiples of 64 (its interleaved K tile).
        from dataclasses import replace

        cfg = cfg.replace(moe=replace(cfg.moe, moe_intermediate_size=64))
    if not (out / "manifest.json").is_file():
        export_model(random_checkpoint(cfg, name), out,
                     ExportOptions(precision=precision, target=target, max_seq_len=max_len),
                     force=True, progress=False)
    return out


def raw_placement(path: Path, device_id: int = 0) -> dict:
    """Where ONNX Runtime puts each node of one graph on CUDA (its verbose log, captured)."""
    import onnxruntime as ort

    from llm_onnx.runtime.core.providers import CPU, CUDA, captured_output, parse_placement

    so = ort.SessionOptions()
    so.log_severity_level = 0
    with captured_output() as log:
        session = ort.InferenceSession(str(path), so,
                                       providers=[(CUDA, {"device_id": str(device_id)}), CPU])
    del session
    p = parse_placement(log())
    return {"found": p.found, "counts": p.counts, "compute_on_cpu": p.compute_on_cpu(),
            "cpu_nodes": sorted({op for op, _ in p.on(CPU)})}


def export_big(precision: str, root: Path, max_len: int, block: int = 32,
               tokenizer: Path | None = None) -> Path:
    """qwen3_8b at full size with random weights. ``tokenizer``: a folder whose tokenizer.json
    and tokenizer_config.json go with it (padded with unused special tokens to the model's
    vocabulary), so that text, chat and structured-output requests work on the random model."""
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.families import PRESETS

    quantized = precision in ("int8", "int4")
    out = root / (f"qwen3_8b-{precision}" + (f"-block{block}" if quantized and block != 32 else ""))
    if not (out / "manifest.json").is_file():
        t0 = time.perf_counter()
        checkpoint = random_checkpoint(PRESETS["qwen3_8b"], "qwen3_8b")
        if tokenizer is not None:
            checkpoint.tokenizer_files, checkpoint.eos_token_ids = padded_tokenizer(
                tokenizer, PRESETS["qwen3_8b"].vocab_size)
        export_model(checkpoint, out,
                     ExportOptions(precision=precision, target="cuda", max_seq_len=max_len,
                                   quant_method="minmax", validate=False, block_size=block),
                     force=True, progress=False)
        print(f"exported qwen3_8b {precision} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def padded_tokenizer(folder: Path, vocab_size: int) -> tuple[dict[str, bytes], list[int]]:
    """A tokenizer folder's files with its vocabulary padded to ``vocab_size`` by plain tokens
    ("<u12345>") that no merge produces, so no text encodes to them, but a random model that
    picks one still streams visible text; and its end-of-sequence ids (from
    tokenizer_config.json's eos_token). Plain vocabulary entries, not added tokens: the
    constraint engine converts a vocabulary of 150,000 regular tokens in about a second, and
    took 105 s over 100,000 added ones."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in spec.get("added_tokens", [])}
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"<u{i}>"] = i
    config = json.loads((folder / "tokenizer_config.json").read_text())
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    ids = {t["content"]: t["id"] for t in spec.get("added_tokens", [])} | vocab
    eos_ids = [ids[eos]] if eos in ids else []
    return ({"tokenizer.json": json.dumps(spec, ensure_ascii=False).encode(),
             "tokenizer_config.json": (folder / "tokenizer_config.json").read_bytes()}, eos_ids)


def decode_rate(engine, batch: int, context: int, steps: int, vocab: int,
                 greedy: bool = False) -> float:
    """Decode tok/s of ``batch`` rows after ``context`` tokens each; ``greedy``: each step
    returns the rows' greedy ids where the engine picks on the device (Engine.decode), not
    their logits."""
    rng = np.random.default_rng(batch)
    cache = engine.new_cache(batch, context + steps + 8)
    for row in range(batch):
        engine.prefill(cache, row, rng.integers(0, vocab, context))
    tokens = rng.integers(0, vocab, batch)
    for _ in range(3):  # warm-up (and the graph capture)
        engine.decode(cache, tokens, greedy=greedy)
    start = time.perf_counter()
    for _ in range(steps):
        engine.decode(cache, tokens, greedy=greedy)
    return batch * steps / (time.perf_counter() - start)

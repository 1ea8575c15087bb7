"""The full-size run's workers, each a child process whose memory is its own (peak RSS from
wait4, RSS sampled every second): the export of random weights, and our load, generation and
`llm-onnx bench`. Run as `python -m benchmarks.full_size.workers --worker KIND ...` by
run_worker; they import what they use when they run."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.core.proc import module_env
from benchmarks.full_size.alone import memory


def cache_bytes(engine, positions: int) -> int:
    """A row's cache at ``positions``: keys and values of the attention layers, and a hybrid
    model's recurrent state with its checkpoints (the engine's own count)."""
    return engine.row_bytes(positions)


def word_tokenizer(vocab: int) -> bytes:
    """t0 ... t{vocab-1}, split on whitespace (as the tests' tiny checkpoints have)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok.to_str().encode()


def model_config(name: str, layers: int | None):
    from llm_onnx.families import get_config

    cfg = get_config(name)
    if layers is None:
        return cfg
    # what is given per layer is cut with the layers (kinds; SmolLM3's RoPE flags)
    kinds = cfg.layer_types[:layers] if cfg.layer_types is not None else None
    nope = cfg.positions.no_rope_layers
    rope = nope[:layers] if nope is not None else None
    return cfg.replace(num_hidden_layers=layers, layer_types=kinds, no_rope_layers=rope)


def worker_export(a: argparse.Namespace) -> dict:
    """export_model (what `llm-onnx export --config NAME --random-weights` runs), in this process."""
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.model_folder import read_manifest

    cfg = model_config(a.config, a.layers)
    ckpt = random_checkpoint(cfg, a.config)
    ckpt.tokenizer_files = {"tokenizer.json": word_tokenizer(cfg.vocab_size)}
    start = time.perf_counter()
    export_model(ckpt, Path(a.folder), ExportOptions(
        precision=a.precision, target="cpu", block_size=a.block_size,
        experts_accuracy_level=a.experts_accuracy_level,
        experts_block_size=a.experts_block_size, experts_scheme=a.experts_scheme),
                 force=True, progress=True)
    m = read_manifest(Path(a.folder))
    return {"seconds": round(time.perf_counter() - start, 1), "weights_bytes": m.weights.bytes,
            "parity": {"scope": m.parity.scope, "kl": m.parity.kl_divergence,
                       "greedy_agreement": m.parity.greedy_agreement},
            "quantized": list(m.precision.quantization.quantized)
            if m.precision.quantization else []}


def worker_ours(a: argparse.Namespace) -> dict:
    """Load the folder, generate once (memory after the prompt and the new tokens), then
    llm-onnx bench's measurement (run_bench)."""
    import numpy as np

    from llm_onnx.bench import BenchConfig, expert_bytes, run_bench, weight_bytes_read
    from llm_onnx.runtime import Model

    before = memory()
    start = time.perf_counter()
    model = Model.load(a.folder, provider="cpu", threads=a.threads)
    load_s = time.perf_counter() - start
    loaded = memory()
    m = model.engine.manifest
    prompt = np.random.default_rng(0).integers(100, m.config.vocab_size, a.prompt_len).tolist()
    first = model.generate(prompt, max_new_tokens=a.new_tokens, temperature=0.0, ignore_eos=True)
    generated = memory()
    bench = run_bench(model, BenchConfig(prompt_len=a.prompt_len, new_tokens=a.new_tokens,
                                         repeat=a.repeat, prompt_ids=prompt), before["rss"])
    t = first.timings
    return {"load_s": round(load_s, 1), "memory_before_load": before, "memory_after_load": loaded,
            "memory_after_generate": generated, "weights_bytes": m.weights.bytes,
            "kv_bytes": cache_bytes(model.engine, a.prompt_len + a.new_tokens),
            "expert_bytes": expert_bytes(m), "weight_bytes_read_batch1": weight_bytes_read(m),
            "first_run": {"ttft_s": t.ttft_s, "prefill_tok_s": t.prefill_tok_s,
                          "decode_tok_s": t.decode_tok_s},
            "bench": {k: v for k, v in bench.data.items() if k not in ("folder",)},
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


WORKERS = {"export": worker_export, "ours": worker_ours}


def run_worker(kind: str, log: Path, env: dict[str, str] | None = None, **opts) -> dict:
    """A worker in a child process (``env`` added to its environment); its peak
    RSS from wait4, and its RSS sampled every second with the export's progress-bar stage at
    that moment."""
    result = log.with_suffix(".json")
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.full_size.workers", "--worker", kind, "--result",
           str(result)]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    samples: list[tuple[float, float, str]] = []
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=err, stderr=err,
                                env={**os.environ, **module_env(env)})
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                try:
                    with open(f"/proc/{proc.pid}/status") as f:
                        rss = next(int(x.split()[1]) for x in f if x.startswith("VmRSS:"))
                except (OSError, StopIteration):
                    continue
                samples.append((round(time.perf_counter() - start, 1), round(rss / 1024),
                                progress_stage(log)))

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        thread.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{kind} worker failed; see {log}:\n{log.read_text()[-2000:]}")
    out = json.loads(result.read_text())
    out["process_peak_rss_mib"] = round(usage.ru_maxrss / 1024, 1)
    out["wall_s"] = round(time.perf_counter() - start, 1)
    out["rss_timeline"] = samples
    stages: dict[str, float] = {}
    for _, rss, stage in samples:
        stages[stage] = max(stages.get(stage, 0), rss)
    out["peak_rss_by_stage_mib"] = stages
    return out


def progress_stage(log: Path) -> str:
    """The export's progress-bar description last written to ``log`` (tqdm redraws with \\r)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 400))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    stages = re.findall(r"([A-Za-z][A-Za-z ]+?)\s+\d+%\|", tail)
    return stages[-1].strip() if stages else ""


def main() -> None:
    w = argparse.ArgumentParser()
    w.add_argument("--worker")
    w.add_argument("--result", type=Path)
    for opt in ("config", "folder", "precision", "experts-scheme"):
        w.add_argument(f"--{opt}")
    for opt in ("layers", "threads", "prompt-len", "new-tokens", "repeat", "block-size",
                "experts-accuracy-level", "experts-block-size"):
        w.add_argument(f"--{opt}", type=int)
    a = w.parse_args()
    a.result.write_text(json.dumps(WORKERS[a.worker](a)))


if __name__ == "__main__":
    main()

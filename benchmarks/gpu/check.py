"""The GPU check: one command that says whether the CUDA path works and how fast it is.

    python -m benchmarks.gpu.check --out DIR [--skip-speed] [--speed-only] [--models DIR]

On whatever CUDA GPU is present it runs, each part on its own (a failing part is recorded and
the next one runs):

  environment   onnxruntime, CUDA, cuDNN, driver and GPU versions
  placement     every precision x a dense (qwen3_tiny), an MoE (qwen3_moe_tiny) and an ALiBi
                (bloom_tiny) model: where ONNX Runtime puts each node, what the runtime decides
                (CUDA, or the CPU with its one-line reason), no compute node left on the CPU
  parity        fp16 and int4 (fp16 activations) exported for CUDA: the export's parity gate
                (torch vs ORT CPU, and torch vs the runtime on CUDA: 3 ragged prompts, batched
                decode), then the runtime on CUDA vs on the CPU over a batch of 2, a chat turn
                that reuses the cache, and a cache that grows; with and without CUDA graphs
  matmulnbits   MatMulNBits fp16, 4 and 8 bits, block sizes 16-256, M = 1, 3, 17, against numpy
  families      (only with --parts ...,families) the 2026 families' tiny models (qwen3_5 hybrid,
                its MoE, gpt_oss, gemma4, smollm3) exported for CUDA: placement of both graphs,
                parity on the device against the CPU with and without CUDA graphs, batch-1 decode
  kernels       (only with --parts ...,kernels) int4 MatMulNBits at qwen3_8b's shapes, blocks
                32/64/128, M = 1, 8, 32: microseconds and weight GB/s, ONNX Runtime's default
                kernels against its fpA_intB ones (RuntimeOptions.cuda_fpa_intb), each checked
                against numpy
  speed         qwen3_8b (random weights, full size), fp16 and int4: decode tok/s at batch 1, 8
                and 32 with and without CUDA graphs, prefill tok/s at 512 and 2048 tokens, time
                to first token, GPU memory, decode against the GPU's measured read bandwidth
  memory        GPU memory before and after 100 requests of varied size

It writes DIR/gpu_check.json and DIR/gpu_check.md. ``pytest -m gpu`` runs the correctness parts
(tests/gpu). ``--smoke`` runs the same code on the CPU with tiny sizes (how CI checks the
script itself; no GPU figures come out of it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.core import record
from benchmarks.gpu.correctness import check_families, check_parity, check_placement
from benchmarks.gpu.device import environment, export_big, export_tiny
from benchmarks.gpu.kernels import SMOKE_SHAPES, bench_kernels, check_matmulnbits
from benchmarks.gpu.speed import measure_speed, memory_after_requests


def write_report(out: Path, results: dict) -> None:
    record.write(out / "gpu_check.json", "gpu.check", results, indent=2, default=str)
    lines = ["# GPU check", "", f"Run: {results.get('started')}", ""]
    env = results.get("environment", {})
    lines += ["## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]
    for part in ("placement", "parity", "matmulnbits", "families", "kernels"):
        rows = results.get(part)
        if not isinstance(rows, dict):
            continue
        lines += [f"## {part}", "", "| case | ok | details |", "| --- | --- | --- |"]
        for case, entry in rows.items():
            if not isinstance(entry, dict):
                lines.append(f"| {case} | | {entry} |")
                continue
            details = {k: v for k, v in entry.items() if k not in ("ok", "trace")}
            lines.append(f"| {case} | {'yes' if entry.get('ok') else 'NO'} | "
                         f"{json.dumps(details, default=str)[:700].replace('|', '/')} |")
        lines.append("")
    for part in ("speed", "memory"):
        rows = results.get(part)
        if isinstance(rows, dict):
            lines += [f"## {part}", "", "```", json.dumps(rows, indent=1, default=str), "```", ""]
    errors = results.get("errors", {})
    if errors:
        lines += ["## errors", ""] + [f"- {k}: {v}" for k, v in errors.items()] + [""]
    (out / "gpu_check.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example: python -m benchmarks.gpu.check --out gpu-report")
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json/.md")
    ap.add_argument("--models", type=Path, help="where the exports go (default: a temp folder)")
    ap.add_argument("--skip-speed", action="store_true", help="correctness parts only")
    ap.add_argument("--speed-only", action="store_true", help="the qwen3_8b speed part only")
    ap.add_argument("--precisions", default="fp16,int4", help="speed part's precisions")
    ap.add_argument("--parts", default="placement,parity,matmulnbits",
                    help="parts before the speed part, comma-separated: placement, parity, "
                         "matmulnbits, families (the 2026 families' tiny models: placement, "
                         "parity, batch-1 decode), and kernels (int4 MatMulNBits timings at qwen3_8b's "
                         "shapes, ORT's default vs fpA_intB kernels, blocks 32/64/128; a few "
                         "minutes, so not in the default list)")
    ap.add_argument("--export-only", action="store_true",
                    help="only export the speed part's models into --models (e.g. in the "
                         "background while the correctness parts run)")
    ap.add_argument("--family-cases", default="",
                    help="families part: only these NAME/PRECISION cases, comma-separated "
                         "(default: all of FAMILY_CASES)")
    ap.add_argument("--requests", type=int, default=100, help="memory part's request count")
    ap.add_argument("--fpa-intb", choices=("off", "on", "both"), default="both",
                    help="speed part, quantized folders: ONNX Runtime's default MatMulNBits "
                         "kernels (off), its fpA_intB ones (on), or both (the fpA_intB run with "
                         "CUDA graphs only)")
    ap.add_argument("--block-size", type=int, default=32,
                    help="speed part: quantization block of the int8/int4 qwen3_8b exports")
    ap.add_argument("--smoke", action="store_true",
                    help="run on the CPU with tiny sizes (checks the script, measures nothing)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.models or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    root.mkdir(parents=True, exist_ok=True)
    provider = "cpu" if args.smoke else "cuda"
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "errors": {}}
    failed = False

    def part(name: str, fn, *fargs):
        nonlocal failed
        try:
            results[name] = fn(*fargs)
            if isinstance(results[name], dict) and any(
                    isinstance(v, dict) and v.get("ok") is False for v in results[name].values()):
                failed = True
        except Exception as e:  # noqa: BLE001 - every part runs
            failed = True
            results["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
            print(f"{name} FAILED: {e}", flush=True)
        write_report(args.out, results)

    if args.export_only:
        for p in args.precisions.split(","):
            export_big(p, root, 4096, args.block_size)
        return 0
    part("environment", environment)
    if not args.smoke and not results["environment"].get("cuda_usable", [False])[0]:
        print(f"no usable CUDA GPU: {results['environment'].get('cuda_usable')}", flush=True)
        return 2
    if not args.speed_only:
        wanted = args.parts.split(",")
        if "placement" in wanted:
            part("placement", check_placement, root, provider)
        if "parity" in wanted:
            part("parity", check_parity, root, provider)
        if "matmulnbits" in wanted:
            part("matmulnbits", check_matmulnbits, provider)
        if "families" in wanted:
            cases = tuple(tuple(c.split("/")) for c in args.family_cases.split(",") if c)
            part("families", check_families, root, provider, cases or None)
        if "kernels" in wanted:
            part("kernels", bench_kernels, provider, SMOKE_SHAPES if args.smoke else None)
    if not args.skip_speed:
        if args.smoke:
            folders = {p: export_tiny("qwen3_tiny", p, "cuda", root) for p in ("fp16", "int4")}
            batches, steps, prefills = (1, 2), 4, (16, 32)
        else:
            folders = {p: export_big(p, root, 4096, args.block_size)
                       for p in args.precisions.split(",")}
            batches, steps, prefills = (1, 8, 32), 64, (512, 2048)
        runs = []  # (label, folder, fpa_intb, graph modes)
        for precision, folder in folders.items():
            quantized = precision in ("int8", "int4")
            if args.fpa_intb != "on" or not quantized:
                runs.append((precision, folder, None, (True, False)))
            if args.fpa_intb != "off" and quantized:
                runs.append((f"{precision}+fpa_intb", folder, True,
                             (True,) if args.fpa_intb == "both" else (True, False)))
        speed = {}
        for label, folder, fpa, modes in runs:
            try:
                speed[label] = measure_speed(folder, provider, batches, steps, prefills,
                                             fpa_intb=fpa, graph_modes=modes)
            except Exception as e:  # noqa: BLE001
                failed = True
                speed[label] = f"failed: {type(e).__name__}: {e}"
            results["speed"] = speed
            write_report(args.out, results)
        last = folders[list(folders)[-1]]
        part("memory", memory_after_requests, last, provider,
             args.requests if not args.smoke else 5)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_report(args.out, results)
    print(f"report: {args.out / 'gpu_check.md'}; {'FAILURES' if failed else 'all parts passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

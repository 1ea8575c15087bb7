"""Peak memory and time of exporting a full-size preset with random weights.

    python -m benchmarks.tools.export_memory               # qwen3_8b, fp16 and int8
    python -m benchmarks.tools.export_memory --config qwen3_8b --precision fp16 --keep out/

Each export runs as its own `llm-onnx export` process; its peak resident set size comes from the
kernel (getrusage of the finished child), so nothing else in this process inflates it. The model
folders go to a scratch directory on the same disk and are deleted afterwards unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_export(config: str, precision: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "llm_onnx.cli", "export", "--config", config, "--random-weights",
           "--precision", precision, "--out", str(out), "--force"]
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not any other's
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"export failed ({proc.returncode}):\n{err.read().decode()[-2000:]}")
    from llm_onnx.model_folder import read_manifest

    manifest = read_manifest(out)
    return {
        "config": config, "precision": precision, "seconds": round(seconds, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "weights_gib": round(manifest.weights.bytes / 2**30, 2),
        "parity_scope": manifest.parity.scope,
        "parity_kl": manifest.parity.kl_divergence,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="qwen3_8b")
    parser.add_argument("--precision", action="append", choices=["fp32", "fp16", "int8", "int4"])
    parser.add_argument("--scratch", type=Path, help="where to write the model folders")
    parser.add_argument("--keep", type=Path, help="keep the model folders under this directory")
    args = parser.parse_args()
    precisions = args.precision or ["fp16", "int8"]
    scratch = Path(tempfile.mkdtemp(prefix="llm-onnx-export-bench-", dir=args.scratch))
    rows = []
    try:
        for precision in precisions:
            out = scratch / f"{args.config}-{precision}"
            row = run_export(args.config, precision, out)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.move(str(out), args.keep / out.name)
            else:
                shutil.rmtree(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'config':<14} {'precision':<9} {'weights GiB':>11} {'peak RSS MiB':>12} {'time s':>7}")
    for r in rows:
        print(f"{r['config']:<14} {r['precision']:<9} {r['weights_gib']:>11.2f} {r['peak_rss_mib']:>12.0f} "
              f"{r['seconds']:>7.0f}")


if __name__ == "__main__":
    main()

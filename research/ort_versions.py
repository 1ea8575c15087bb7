"""Our decode and prefill on two ONNX Runtime builds, side by side: the installed one and another
unpacked into a folder (``pip install --no-deps --target DIR onnxruntime==VERSION``), each run
as `llm-onnx bench` in its own process with that folder first on PYTHONPATH (llm-onnx itself is
pure Python), in alternating rounds (docs/performance.md, "ONNX Runtime versions").

    pip install --no-deps --target /tmp/ort132 onnxruntime==1.32.0
    python -m research.ort_versions --other /tmp/ort132 --model /tmp/sm-fp32 /tmp/sm-int8

Prints, per model folder, each build's median over rounds of `llm-onnx bench`'s medians and the
ratio other / installed, then one JSON line (with each round's figures and the load average
before it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def version(path: str | None) -> str:
    env = dict(os.environ, PYTHONPATH=path or "")
    return subprocess.run([sys.executable, "-c", "import onnxruntime; print(onnxruntime.__version__)"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def bench(folder: Path, path: str | None, a) -> dict:
    env = dict(os.environ, PYTHONPATH=path or "")
    cmd = [sys.executable, "-m", "llm_onnx.cli", "bench", "--model", str(folder), "--prompt-len",
           str(a.prompt_len), "--new-tokens", str(a.new_tokens), "--repeat", str(a.repeat),
           "--threads", str(a.threads), "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    d = json.loads(out)
    return {"decode_tok_s": d["decode_tok_s"]["median"], "prefill_tok_s": d["prefill_tok_s"]["median"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--other", required=True, help="a folder holding another onnxruntime package")
    p.add_argument("--model", nargs="+", type=Path, required=True, help="exported model folders")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    builds = {version(None): None, version(a.other): a.other}
    if len(builds) < 2:
        sys.exit(f"{a.other} holds the same onnxruntime as the installed one ({version(None)})")
    installed, other = list(builds)
    rounds: list[dict] = []
    for r in range(a.rounds):
        for folder in a.model:
            for name, path in builds.items():
                load = os.getloadavg()[0]
                rounds.append({"round": r + 1, "model": str(folder), "onnxruntime": name,
                               "load_before": load, **bench(folder, path, a)})
                print(f"round {r + 1} {folder.name} onnxruntime {name}: "
                      f"decode {rounds[-1]['decode_tok_s']:.1f}, prefill "
                      f"{rounds[-1]['prefill_tok_s']:.0f} tok/s (load {load:.2f})", flush=True)
    summary = {}
    print(f"\n| model | decode {installed} | decode {other} | ratio | prefill {installed} | "
          f"prefill {other} | ratio |\n|---|---|---|---|---|---|---|")
    for folder in a.model:
        med = {(b, k): statistics.median(x[k] for x in rounds
                                         if x["model"] == str(folder) and x["onnxruntime"] == b)
               for b in builds for k in ("decode_tok_s", "prefill_tok_s")}
        row = {k: {b: round(med[(b, k)], 1) for b in builds} for k in ("decode_tok_s",
                                                                        "prefill_tok_s")}
        summary[folder.name] = row
        d, f = row["decode_tok_s"], row["prefill_tok_s"]
        print(f"| {folder.name} | {d[installed]} | {d[other]} | {d[other] / d[installed]:.2f}x | "
              f"{f[installed]} | {f[other]} | {f[other] / f[installed]:.2f}x |")
    print(json.dumps({"installed": installed, "other": other, "summary": summary,
                      "rounds": rounds, "args": {k: str(v) for k, v in vars(a).items()}}))


if __name__ == "__main__":
    main()

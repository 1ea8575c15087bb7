"""Prompt-lookup speculation on a GPU: benchmarks/generation/speculative.py's workloads (editing a
paragraph, renaming a variable, a story) through one CUDA session, greedy, plain and speculative
runs interleaved, medians; the speedup is speculative decode tok/s over plain on the same
session, and ``same`` whether the tokens equal the plain run's.

    python -m benchmarks.gpu.speculative FOLDER --out OUT.json   # FOLDER: exported --target cuda
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.core import record
from benchmarks.generation.speculative import WORKLOADS, compare
from llm_onnx.runtime import Model
from llm_onnx.runtime.generation.speculative import SpeculativeOptions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--provider", default="cuda")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["edit", "code", "story"],
                    choices=list(WORKLOADS))
    args = ap.parse_args()
    model = Model.load(args.folder, provider=args.provider, speculative="off")
    spec = SpeculativeOptions(method="ngram")
    rows = []
    for name in args.workloads:
        prompt = model.chat_prompt(WORKLOADS[name])
        row = {"workload": name, **compare(model, prompt, args.new_tokens, args.repeat, spec)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    record.write(args.out, "gpu.speculative", {
        "date": time.strftime("%Y-%m-%d"), "engine": model.engine.describe(),
        "cuda_graph": bool(getattr(model.engine, "cuda_graph", False)),
        "new_tokens": args.new_tokens, "repeat": args.repeat, "rows": rows})
    return 0 if all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

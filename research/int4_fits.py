"""How each int4 block fit does on a float source: SmolLM2 moved off its Q4_1 grid (the folder
`python -m benchmarks.peers --off-grid` makes), exported once per fit with float activations and
a float LM head (so only the projections' fit differs), teacher-forced against transformers fp32
on the same weights.

    python -m research.int4_fits              # after one python -m benchmarks.peers --off-grid
    python -m research.int4_fits --fits awq minmax --fidelity-prompts 9

Prints one line per fit: KL(transformers || ours) and top-1 over the fidelity prompts (the 3
agreement prompts and the first --fidelity-prompts plain texts, 32 tokens each), the export time.
See docs/quantization.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.core.env import WORKER
from benchmarks.core.proc import module_env

FITS = {  # name -> llm-onnx export options
    "symmetric": ["--quant-scheme", "symmetric", "--quant-method", "minmax"],
    "minmax": ["--quant-scheme", "zero_point", "--quant-method", "minmax"],
    "offset": ["--quant-scheme", "offset", "--quant-method", "minmax"],
    "search": ["--quant-scheme", "zero_point", "--quant-method", "search"],
    "awq": ["--quant-scheme", "zero_point", "--quant-method", "awq"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "llm-onnx-bench")
    ap.add_argument("--hf", type=Path, help="the off-grid HF folder (default: the one under "
                    "WORK/models/off-grid/ made by python -m benchmarks.peers --off-grid)")
    ap.add_argument("--fits", nargs="+", choices=list(FITS), default=list(FITS))
    ap.add_argument("--fidelity-prompts", type=int, default=9)
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    hf = args.hf or next(iter(sorted((args.work / "models" / "off-grid").glob("hf-*"))), None)
    if hf is None or not (hf / "config.json").is_file():
        raise SystemExit("no off-grid HF folder: run python -m benchmarks.peers --off-grid once, "
                         "or give --hf")
    out = args.work / "int4-fits"
    out.mkdir(parents=True, exist_ok=True)
    prompts_all = json.loads((args.work / "run" / "prompts.json").read_text())
    prompts_all["fidelity"] = prompts_all.get("fidelity", [])[:args.fidelity_prompts]
    prompts = out / "prompts.json"
    prompts.write_text(json.dumps(prompts_all))
    ref = out / "reference.npz"
    worker = [args.python, "-m", WORKER]
    subprocess.run(worker + ["reference", "--result", str(out / "reference.json"), "--model",
                             str(hf), "--prompts", str(prompts), "--agree-tokens", "32",
                             "--out", str(ref)], check=True, capture_output=True,
                   env={**os.environ, **module_env()})
    print(f"{hf.name}: int4, block 32, float activations, float LM head")
    for fit in args.fits:
        folder = out / fit
        t0 = time.perf_counter()
        subprocess.run([args.python, "-m", "llm_onnx.cli", "export", "--checkpoint", str(hf),
                        "--precision", "int4", "--accuracy-level", "0", "--float-embeddings",
                        "--out", str(folder), "--force", *FITS[fit]],
                       check=True, capture_output=True)
        seconds = time.perf_counter() - t0
        result = out / f"{fit}.json"
        subprocess.run(worker + ["fidelity-ours", "--result", str(result), "--model", str(folder),
                                 "--prompts", str(prompts), "--reference", str(ref)],
                       check=True, capture_output=True, env={**os.environ, **module_env()})
        f = json.loads(result.read_text())["fidelity"]
        print(f"  {fit:<10} KL {f['kl_mean']:.4f}  top-1 {f['top1']}/{f['positions']}  "
              f"export {seconds:.0f} s", flush=True)
    ref.unlink(missing_ok=True)


if __name__ == "__main__":
    main()

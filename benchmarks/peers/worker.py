"""One step of the peer comparison (`python -m benchmarks.peers`), run as a child process in the
environment that has the right packages (the project's venv, the onnxruntime-genai venv, the
llama-cpp-python venv):

    python -m benchmarks.peers.worker STEP --result OUT.json [options]

Steps that build something write files; steps that measure write their numbers to --result.
Only the standard library is imported at module level, here and in the modules of the steps:
each step imports what it needs, so the same package runs in every venv. Not meant to be used
directly (the peer comparison drives it). The timing of every system: benchmarks.core.timing.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.peers.chart import plot
from benchmarks.peers.checkpoints import f32_gguf, hf_convert, hf_gguf, off_grid, random_hf
from benchmarks.peers.fidelity import fidelity_genai, fidelity_llama, fidelity_ours, reference
from benchmarks.peers.prompts import make_prompts
from benchmarks.peers.runs import (
    llama_quantize,
    profile_genai,
    run_genai,
    run_llama,
    run_ours,
    run_ours_speed,
    run_transformers,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="step", required=True)

    def step(name, func, *opts):
        sp = sub.add_parser(name)
        sp.set_defaults(func=func)
        sp.add_argument("--result", required=name not in ("plot",))
        for opt in opts:
            kind = int if opt in ("--prompt-len", "--threads", "--passes", "--new-tokens",
                                  "--agree-tokens") else str
            sp.add_argument(opt, type=kind, required=opt not in ("--threads", "--title"))
        return sp

    run_opts = ("--model", "--prompts", "--passes", "--new-tokens", "--agree-tokens", "--threads")
    step("hf-convert", hf_convert, "--gguf", "--out")
    step("off-grid", off_grid, "--src", "--out", "--noise", "--seed")
    step("prompts", make_prompts, "--hf", "--prompt-len")
    step("f32-gguf", f32_gguf, "--src", "--out")
    step("random-hf", random_hf, "--src", "--out", "--shape", "--seed")
    step("hf-gguf", hf_gguf, "--src", "--vocab-gguf", "--out", "--shape")
    step("run-transformers", run_transformers, *run_opts)
    step("run-ours", run_ours, "--model", "--prompts", "--agree-tokens", "--new-tokens")
    step("run-ours-speed", run_ours_speed, "--model", "--prompts", "--passes", "--new-tokens")
    step("run-genai", run_genai, "--model", "--prompts", "--passes", "--new-tokens",
         "--agree-tokens")
    step("llama-quantize", llama_quantize, "--src", "--out", "--ftype", "--threads")
    step("run-llama", run_llama, *run_opts)
    step("reference", reference, "--model", "--prompts", "--agree-tokens", "--out", "--threads")
    fid_opts = ("--model", "--prompts", "--reference", "--threads")
    step("fidelity-ours", fidelity_ours, *fid_opts)
    step("fidelity-genai", fidelity_genai, *fid_opts)
    step("fidelity-llama", fidelity_llama, *fid_opts)
    step("profile-genai", profile_genai, "--model", "--prompts", "--new-tokens")
    step("plot", plot, "--src", "--out", "--title")
    args = p.parse_args()
    if getattr(args, "threads", None) is None:
        args.threads = 2
    args.func(args)


if __name__ == "__main__":
    sys.exit(main())

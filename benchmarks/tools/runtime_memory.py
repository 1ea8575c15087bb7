"""Memory (PSS) and decode speed of the runtime's session layouts over one model folder.

    python -m benchmarks.tools.runtime_memory models/smollm2-fp32 [--tokens 64]

Each layout runs in a fresh process: load the model, generate, then read the process's
proportional set size from /proc/self/smaps_rollup (Linux). Layouts: one session over
prefill.onnx for both phases (the runtime's default), and a prefill + decode session pair.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = r"""
import json, sys, time
from llm_onnx.runtime import Model
folder, sessions, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])

def pss_mib():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024

model = Model.load(folder, sessions=sessions, verify=False)
loaded = pss_mib()
prompt = list(range(100, 228))
model.generate(prompt, max_new_tokens=8)  # warm-up
r = model.generate(prompt, max_new_tokens=tokens, stop_token_ids=[], temperature=0)
print(json.dumps({"sessions": sessions, "pss_after_load_mib": round(loaded),
                  "pss_after_generate_mib": round(pss_mib()), "load_s": round(model.load_s, 2),
                  "decode_tok_s": round(r.timings.decode_tok_s, 1),
                  "prefill_tok_s": round(r.timings.prefill_tok_s, 1)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    from llm_onnx.model_folder import read_manifest

    manifest = read_manifest(args.folder)
    print(f"{manifest.name} [{manifest.precision.precision}], weights.data "
          f"{manifest.weights.bytes / 2**20:.0f} MiB")
    for sessions in ("single", "pair"):
        out = subprocess.run([sys.executable, "-c", CHILD, args.folder, sessions, str(args.tokens)],
                             check=True, capture_output=True, text=True).stdout
        print(out.strip())


if __name__ == "__main__":
    main()

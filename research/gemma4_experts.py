"""Gemma 4's quantized experts in ONNX Runtime: the chosen experts only (RoutedGeGLUExperts, an
If per expert: the CPU export's form) against every expert densely (QuantGeGLUExperts: two
MatMulNBits over all experts, the GPU export's form), one layer at 26B-A4B's expert shape by
default, the same block-quantized random weights in both (docs/architectures.md).

    python -m research.gemma4_experts
    python -m research.gemma4_experts --experts 32 --tokens 1 64

Each form is exported from its torch module (llm_onnx/export/modules.py) with the project's
translations and run on the CPU at --threads: median ms per call for each --tokens count (random
rows, each choosing --top-k distinct experts at random), and the largest difference between the
two forms' outputs (they compute the same sum). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from llm_onnx.export import quant
from llm_onnx.export.custom_ops import fix_domains, translation_table
from llm_onnx.export.modules import QuantGeGLUExperts, RoutedGeGLUExperts
from llm_onnx.modeling.mlp import GeGLUExperts


def build(a) -> tuple[RoutedGeGLUExperts, QuantGeGLUExperts]:
    """Both forms holding the same quantized random weights (an expert at a time: the float
    stack of 26B-A4B's layer would be 3 GB)."""
    e, d, i = a.experts, a.hidden, a.width
    with torch.device("meta"):
        shape = GeGLUExperts(e, d, i, torch.float32)
    routed = RoutedGeGLUExperts(shape, a.bits, a.block, a.block, a.level).to_empty(device="cpu")
    dense = QuantGeGLUExperts(shape, a.bits, a.block, a.block, a.level).to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    kb = i // a.block  # the down projection's blocks per expert along K
    for x in range(e):
        gate_up = torch.randn(2 * i, d, generator=gen) * 0.02
        down = torch.randn(d, i, generator=gen) * 0.02
        q, s, _ = quant.quantize(gate_up, a.bits, a.block)
        routed.gate_up[x].qweight.copy_(q.reshape(routed.gate_up[x].qweight.shape))
        routed.gate_up[x].scales.copy_(s.reshape(routed.gate_up[x].scales.shape))
        rows = slice(x * 2 * i, (x + 1) * 2 * i)
        dense.gate_up.qweight[rows] = q.reshape(2 * i, *dense.gate_up.qweight.shape[1:])
        dense.gate_up.scales[rows] = s.reshape(2 * i, -1)
        q, s, _ = quant.quantize(down, a.bits, a.block)
        routed.down[x].qweight.copy_(q.reshape(routed.down[x].qweight.shape))
        routed.down[x].scales.copy_(s.reshape(routed.down[x].scales.shape))
        blocks = slice(x * kb, (x + 1) * kb)
        dense.down.qweight[:, blocks] = q.reshape(d, kb, -1)
        dense.down.scales[:, blocks] = s.reshape(d, kb)
    return routed, dense


def session(module: torch.nn.Module, d: int, k: int, path: Path, threads: int):
    n = torch.export.Dim("n")
    example = (torch.zeros(3, d), torch.zeros(3, k, dtype=torch.int64), torch.zeros(3, k))
    program = torch.onnx.export(module.eval(), example, dynamo=True, optimize=False,
                                dynamic_shapes=({0: n}, {0: n}, {0: n}),
                                custom_translation_table=translation_table())
    fix_domains(program.model)
    program.save(str(path), external_data=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--hidden", type=int, default=2816)
    p.add_argument("--width", type=int, default=704, help="each expert's intermediate size")
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--bits", type=int, default=4, choices=(4, 8))
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--level", type=int, default=4, choices=(0, 4),
                   help="MatMulNBits accuracy_level (4: int8 activations, the int4 default)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 512])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    routed, dense = build(a)
    rng = np.random.default_rng(1)
    result: dict = {"shape": {k: getattr(a, k) for k in ("experts", "hidden", "width", "top_k",
                                                          "bits", "block", "level", "threads")},
                    "load_before": os.getloadavg()[0], "tokens": {}}
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {name: session(m, a.hidden, a.top_k, Path(tmp) / f"{name}.onnx", a.threads)
                    for name, m in (("routed", routed), ("dense", dense))}
        del routed, dense
        for n in a.tokens:
            x = rng.standard_normal((n, a.hidden)).astype(np.float32)
            index = np.stack([rng.choice(a.experts, a.top_k, replace=False)
                              for _ in range(n)]).astype(np.int64)
            weight = rng.random((n, a.top_k)).astype(np.float32)
            row: dict = {}
            outs = {}
            for name, s in sessions.items():
                feed = dict(zip([i.name for i in s.get_inputs()], (x, index, weight)))
                outs[name] = s.run(None, feed)[0]
                times = []
                for _ in range(a.repeat):
                    t = time.perf_counter()
                    s.run(None, feed)
                    times.append((time.perf_counter() - t) * 1e3)
                row[f"{name}_ms"] = round(statistics.median(times), 2)
            row["speedup"] = round(row["dense_ms"] / row["routed_ms"], 1)
            scale = float(np.abs(outs["dense"]).max())
            row["max_abs_diff"] = float(np.abs(outs["routed"] - outs["dense"]).max())
            row["max_abs"] = scale
            result["tokens"][n] = row
            print(f"{n:5d} tokens: routed {row['routed_ms']:8.2f} ms  dense {row['dense_ms']:8.2f}"
                  f" ms  ({row['speedup']}x)  max |diff| {row['max_abs_diff']:.2e} of "
                  f"{scale:.2e}", flush=True)
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result))


if __name__ == "__main__":
    main()

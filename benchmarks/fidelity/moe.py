"""What a mixture of experts' quantization choices cost in fidelity, on real weights: SmolLM2-135M-
Instruct's MLPs split into experts that every token takes, so the float model is SmolLM2 itself and
the KL of each int4 form (block size, the experts' activation precision) is measured on real
weights and real activations, not on a random checkpoint's near-flat logits.

    python -m benchmarks.fidelity.moe [--experts 8] [--tokens 1024] [--work DIR]

The model ("MoE-fied" SmolLM2): each layer's MLP (intermediate 1536) becomes E experts of 1536 / E
neurons, expert e holding gate and up rows [e*I, (e+1)*I) and down columns [e*I, (e+1)*I) times E;
the router's weights are zero, so every token chooses all E experts with weight 1/E each (top-k =
E, renormalised), and the sum is the dense MLP exactly. The export then quantizes the experts
through the same QMoE path a Qwen3-30B-A3B takes (symmetric blocks, awq-weighted scale search,
accuracy_level 0 or 4), and the dense projections (attention, LM head) as for any int4 model.
The 4-bit projections are first moved off their Q4_1 grid (the peer comparison's --off-grid noise,
0.3 x each block's step, seeded), like a float checkpoint: on the grid, block 32 would be exact.

Each form is teacher-forced over the first --tokens tokens of this repository's docs (chunks of
256 over the growing cache, as benchmarks/fidelity/kv_int8.py does) and compared, position by
position, with the fp32 export of the same MoE (mean KL(fp32 || form), top-1 agreement). The dense model's fp32
export is run too: it must equal the MoE's fp32 (printed), which checks the split. The dense int4
export at each block size tells how much of a form's KL comes from the experts.

Not what it measures: routing. Every expert is always chosen here, so a form's error never flips a
token's top-k choice, which in a real MoE it can (a near-tie between the 8th and 9th expert).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.core import record
from benchmarks.fidelity.kv_int8 import gguf_path, teacher_forced, text_ids

# (label, model, ExportOptions overrides); the dense projections are int4 at block 32 in every
# MoE form, as in a default export; "experts" sets the experts' block, scheme and activations
SYM, ZP = "symmetric", "zero_point"
FORMS = [
    ("dense fp32", "dense", {"precision": "fp32"}),
    ("moe fp32", "moe", {"precision": "fp32"}),
    ("dense int4 (default)", "dense", {"precision": "int4"}),
    ("moe int4, experts b32 symmetric fp32-act (the old default)", "moe",
     {"precision": "int4", "experts": (32, SYM, 0)}),
    ("moe int4, experts b32 symmetric int8-act", "moe",
     {"precision": "int4", "experts": (32, SYM, 4)}),
    ("moe int4, experts b64 symmetric int8-act", "moe",
     {"precision": "int4", "experts": (64, SYM, 4)}),
    ("moe int4, experts b32 zero points int8-act", "moe",
     {"precision": "int4", "experts": (32, ZP, 4)}),
    ("moe int4, experts b64 zero points int8-act", "moe",
     {"precision": "int4", "experts": (64, ZP, 4)}),
    ("moe int4, experts b64 zero points fp32-act", "moe",
     {"precision": "int4", "experts": (64, ZP, 0)}),
    ("moe int4, every projection b64, experts symmetric int8-act", "moe",
     {"precision": "int4", "block_size": 64, "experts": (64, SYM, 4)}),
    ("moe int4 (default)", "moe", {"precision": "int4"}),
]


def export_options(opts: dict, max_len: int):
    from llm_onnx.export import ExportOptions

    opts = dict(opts)
    if "experts" in opts:
        block, scheme, level = opts.pop("experts")
        opts.update(experts_block_size=block, experts_scheme=scheme,
                    experts_accuracy_level=level)
    return ExportOptions(max_seq_len=max_len, target="cpu", **opts)


class MoEfied:
    """A TensorSource: ``base``'s tensors under a MoE config's names, each MLP split into
    ``experts`` experts every token takes (see the module's docstring)."""

    def __init__(self, base, cfg, experts: int) -> None:
        self.base, self.e = base, experts
        self.width = cfg.intermediate_size // experts
        from llm_onnx.modeling.shapes import checkpoint_shapes
        self._shapes = checkpoint_shapes(cfg)

    def names(self) -> list[str]:
        return list(self._shapes)

    def shape(self, name: str):
        return self._shapes[name]

    def get(self, name: str):
        import torch

        if ".mlp.gate." in name:  # the router: equal logits, every expert chosen
            return torch.zeros(self._shapes[name], dtype=torch.float32)
        if ".mlp.experts." not in name:
            return self.base.get(name)
        prefix, rest = name.split(".mlp.experts.")
        e, part, _ = rest.split(".")
        rows = slice(int(e) * self.width, (int(e) + 1) * self.width)
        dense = self.base.get(f"{prefix}.mlp.{part}.weight").float()
        if part == "down_proj":  # (D, I) columns, times E: the router weighs each expert 1/E
            return (dense[:, rows] * self.e).contiguous()
        return dense[rows].contiguous()

    def describe(self, name: str) -> str:
        return f"SmolLM2 split into {self.e} experts ({self.base.describe(name)})"


class OffGrid:
    """A TensorSource: ``base`` with its 4-bit projections moved off the Q4_1 grid (Gaussian
    noise of ``noise`` x each block's Q4_1 step, blocks of 32 along the input dimension, seeded
    by the tensor's name), as the peer worker's off_grid (benchmarks/peers/checkpoints.py) does
    for a Hugging Face folder."""

    PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __init__(self, base, noise: float, seed: int) -> None:
        self.base, self.noise, self.seed = base, noise, seed

    def __getattr__(self, attr):
        return getattr(self.base, attr)

    def get(self, name: str):
        import zlib

        import torch

        w = self.base.get(name)
        if name.split(".")[-2] not in self.PROJECTIONS or w.shape[-1] % 32:
            return w
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        blocks = w.float().reshape(w.shape[0], -1, 32)
        step = (blocks.amax(-1) - blocks.amin(-1)) / 15
        noise = torch.randn(blocks.shape, generator=g) * self.noise * step[..., None]
        return (blocks + noise).reshape(w.shape)


def checkpoints(ck, experts: int, noise: float, seed: int) -> dict:
    """{"dense": ``ck`` off its grid, "moe": the same split into ``experts`` experts}, both
    float sources (awq, zero points) to the exporter."""
    from llm_onnx.modeling.config import MoEConfig

    cfg = ck.config
    if cfg.intermediate_size % experts:
        raise SystemExit(f"--experts {experts} must divide the MLP's {cfg.intermediate_size}")
    dense = replace(ck, source=OffGrid(ck.source, noise, seed), kind="hf", storage_type=None,
                    name=f"{ck.name}-off-grid")
    moe_cfg = replace(cfg, moe=MoEConfig(num_experts=experts, num_experts_per_tok=experts,
                                         moe_intermediate_size=cfg.intermediate_size // experts,
                                         norm_topk_prob=True))
    moe = replace(dense, config=moe_cfg, source=MoEfied(dense.source, moe_cfg, experts),
                  name=f"{dense.name}-{experts}-experts")
    return {"dense": dense, "moe": moe}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help="labels of FORMS to run (default: all)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/moe-fidelity"))
    args = ap.parse_args()

    from llm_onnx.export import export_model

    print("load average before:", os.getloadavg(), flush=True)
    args.work.mkdir(parents=True, exist_ok=True)
    from llm_onnx.checkpoints import open_checkpoint

    cks = checkpoints(open_checkpoint(gguf_path()), args.experts, args.noise, args.seed)
    forms = [f for f in FORMS if not args.only or f[0] in args.only
             or f[2]["precision"] == "fp32"]
    lp, rows, folder_of = {}, [], {}
    for label, model, opts in forms:
        out = args.work / re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        if not (out / "manifest.json").is_file():
            t = time.time()
            export_model(cks[model], out, export_options(opts, args.tokens), progress=False)
            print(f"exported {label} in {time.time() - t:.0f} s", flush=True)
        folder_of[label] = out
        ids = text_ids(out, args.tokens)
        lp[label] = teacher_forced(out, ids, args.chunk, args.threads)
    ref = lp["moe fp32"]
    split = float(np.abs(lp["dense fp32"] - ref).max())
    print(f"\n{args.tokens} tokens of docs/*.md; SmolLM2 split into {args.experts} experts "
          f"(top-{args.experts}); off-grid noise {args.noise}, seed {args.seed}")
    print(f"dense fp32 vs MoE fp32: max |log-prob diff| {split:.2e} (the split is exact)")
    print(f"{'form':60s} {'mean KL':>10s} {'top-1':>7s}")
    for label, _, opts in forms:
        if opts["precision"] == "fp32":
            continue
        kl = (np.exp(ref) * (ref - lp[label])).sum(-1)
        top1 = float((ref.argmax(-1) == lp[label].argmax(-1)).mean())
        experts = json.loads((folder_of[label] / "manifest.json").read_text())["precision"][
            "quantization"].get("experts")
        rows.append({"form": label, "mean_kl": float(kl.mean()), "top1": top1,
                     "experts": experts})
        print(f"{label:60s} {kl.mean():10.3e} {top1:7.4f}")
    result = {"experts": args.experts, "tokens": args.tokens, "noise": args.noise,
              "seed": args.seed, "split_max_diff": split, "forms": rows,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    path = args.work / f"moe-fidelity-{time.strftime('%Y%m%d-%H%M%S')}.json"
    record.write(path, "fidelity.moe", result)
    print(f"\n{path}\nload average after:", os.getloadavg())


if __name__ == "__main__":
    main()

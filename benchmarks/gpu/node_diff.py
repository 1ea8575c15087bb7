"""Where a graph's CUDA run parts from its CPU run: every node output of one prefill run compared.

    python -m benchmarks.gpu.node_diff FOLDER --out OUT [--tokens 13] [--seed 0]
    python -m benchmarks.gpu.node_diff FOLDER --out OUT --smoke      # CPU against CPU

First the final logits of one prefill (a random prompt of --tokens ids, an empty cache) at each
graph optimization level on both providers, against the CPU at "all" (does a fusion or a kernel
make the difference?). Then, with optimizations off so that every node runs as written, every
float node output of prefill.onnx is made a graph output and compared between the providers: the
first nodes whose relative difference (max |cuda - cpu| / max(1, max |cpu|)) passes
--tolerance, in graph order, with their op type and inputs, and the largest differences. Results
in OUT/node_diff-<folder name>.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.core import record

FLOATS = {1: np.float32, 10: np.float16}


def _feeds(model, tokens: int, vocab: int, seed: int, positions: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        name = value.name
        t = value.type.tensor_type
        dims = [d.dim_value if d.dim_value else None for d in t.shape.dim]
        if name == "input_ids":
            feeds[name] = rng.integers(0, vocab, (1, tokens)).astype(np.int64)
        elif name == "seqlens_k":
            feeds[name] = np.array([tokens - 1], dtype=np.int32)
        elif name == "total_sequence_length":
            feeds[name] = np.array(tokens, dtype=np.int32)
        elif name == "logits_window":
            feeds[name] = np.zeros(1, dtype=np.int64)
        elif name == "valid_tokens":
            feeds[name] = np.array([tokens], dtype=np.int32)
        elif t.elem_type in FLOATS:  # a cache or state buffer: empty
            shape = [1] + [d if d is not None else positions for d in dims[1:]]
            feeds[name] = np.zeros(shape, dtype=FLOATS[t.elem_type])
        else:
            raise SystemExit(f"{name}: no rule for this input ({dims}, type {t.elem_type})")
    return feeds


def _session(data: bytes, provider: str, level: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    providers = [("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"] \
        if provider == "cuda" else ["CPUExecutionProvider"]
    return ort.InferenceSession(data, so, providers=providers)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if a64.shape != b64.shape:
        return float("inf")
    scale = max(1.0, float(np.nanmax(np.abs(a64))) if a64.size else 1.0)
    return float(np.nanmax(np.abs(a64 - b64)) / scale) if a64.size else 0.0


def main() -> int:
    import onnx
    import onnx.numpy_helper

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=13)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--positions", type=int, default=32, help="cache positions (>= --tokens)")
    ap.add_argument("--tolerance", type=float, default=1e-2)
    ap.add_argument("--smoke", action="store_true", help="CPU against CPU (checks the script)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    other = "cpu" if args.smoke else "cuda"
    path = args.folder / "prefill.onnx"
    model = onnx.load(str(path))  # weights inline: the graph is rewritten below
    from llm_onnx.model_folder import read_manifest

    vocab = read_manifest(args.folder).vocab_size
    feeds = _feeds(model, args.tokens, vocab, args.seed, args.positions)
    data = model.SerializeToString()
    result: dict = {"folder": str(args.folder), "tokens": args.tokens, "provider": other}
    reference = _session(data, "cpu", "all").run(["logits"], feeds)[0]
    result["logits_vs_cpu_all"] = {
        f"{p}/{level}": _rel(reference, _session(data, p, level).run(["logits"], feeds)[0])
        for p in ("cpu", other) for level in ("disable", "basic", "extended", "all")}
    print("logits:", json.dumps(result["logits_vs_cpu_all"]), flush=True)

    # every float node output as a graph output, optimizations off
    typed = {v.name: v.type.tensor_type.elem_type for v in
             list(onnx.shape_inference.infer_shapes(model).graph.value_info)}
    have = {o.name for o in model.graph.output}
    order, producer = [], {}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in have and typed.get(name) in (*FLOATS, 7):
                model.graph.output.append(onnx.helper.make_tensor_value_info(
                    name, typed[name], None))
                order.append(name)
                producer[name] = node
    data = model.SerializeToString()
    names = [o.name for o in model.graph.output]
    cpu = dict(zip(names, _session(data, "cpu", "disable").run(names, feeds)))
    dev = dict(zip(names, _session(data, other, "disable").run(names, feeds)))
    ints = [n for n in order if typed[n] == 7]
    result["int_outputs_that_differ"] = [
        {"output": n, "op": producer[n].op_type, "elements": int(np.size(cpu[n])),
         "differ": int((np.asarray(cpu[n]) != np.asarray(dev[n])).sum())
         if np.shape(cpu[n]) == np.shape(dev[n]) else -1}
        for n in ints if not np.array_equal(cpu[n], dev[n])]
    # TopK (MoE routers): where the picks differ, how close the k-th and (k+1)-th values were
    values = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    tops = []
    for node in model.graph.node:
        if node.op_type != "TopK" or node.input[0] not in cpu:
            continue
        k = int(np.asarray(cpu.get(node.input[1], values.get(node.input[1]))).reshape(-1)[0])
        x = np.asarray(cpu[node.input[0]], dtype=np.float64)
        x = x.reshape(-1, x.shape[-1])
        ordered = -np.sort(-x, axis=-1)
        margin = ordered[:, k - 1] - ordered[:, k] if x.shape[-1] > k else np.full(len(x), np.inf)
        a = np.sort(np.asarray(cpu[node.output[1]]).reshape(len(x), -1), axis=-1)
        b = np.sort(np.asarray(dev[node.output[1]]).reshape(len(x), -1), axis=-1)
        flipped = (a != b).any(-1)
        tops.append({"node": node.name, "k": k, "rows": len(x), "rows_picking_other": int(
            flipped.sum()), "margin_at_those_rows": [float(m) for m in margin[flipped]],
            "smallest_margin": float(margin.min()),
            "input_diff": _rel(cpu[node.input[0]], dev[node.input[0]])})
    result["topk"] = tops
    for t in tops:
        print("topk:", json.dumps(t), flush=True)
    order = [n for n in order if typed[n] in FLOATS]
    diffs = [(name, _rel(cpu[name], dev[name])) for name in order]
    first = [{"output": n, "rel": d, "op": producer[n].op_type, "node": producer[n].name,
              "inputs": list(producer[n].input)} for n, d in diffs if d > args.tolerance][:15]
    worst = sorted(diffs, key=lambda x: -x[1])[:15]
    result["first_over_tolerance"] = first
    result["largest"] = [{"output": n, "rel": d, "op": producer[n].op_type} for n, d in worst]
    result["logits_disable_all_outputs"] = _rel(cpu["logits"], dev["logits"])
    for entry in first[:8]:
        print("first over tolerance:", json.dumps(entry), flush=True)
    record.write(args.out / f"node_diff-{args.folder.name}.json", "gpu.node_diff", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

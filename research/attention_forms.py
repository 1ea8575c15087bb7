"""How fast ONNX Runtime's CPU kernels attend over a KV cache in one decode step, by the forms a
graph could use, each checked against numpy (research/README.md; docs/performance.md).

    python -m research.attention_forms                      # SmolLM2's heads, 1 and 8 rows
    python -m research.attention_forms --heads 16 --kv-heads 8 --head-dim 128 \\
        --case 1,4096,8192 --json attention.json

A case is rows,context,buffer: ``rows`` sequences each with ``context`` positions already in a
cache buffer of ``buffer`` positions (the runtime's in-place layout, (B, Hkv, buffer, D)), and one
new query per row. The forms:

- gqa: com.microsoft.GroupQueryAttention over the buffer, past and present bound to the same
  memory (what the exported graphs run; it writes the new key and value in place);
- gqa-int8: the same over an int8 cache (``--kv-cache int8``; per-channel scales);
- matmul-exact: FusedMatMul(q, K^T) + Softmax + MatMul(p, V) over K and V of exactly ``context +
  1`` positions, grouped query heads as rows of one product per KV head: what attention costs in
  ONNX Runtime's GEMMs when nothing is copied (not usable on an in-place buffer: a lower bound);
- matmul-sliced: the same over the buffer sliced to the context (what plain ops must do with an
  in-place buffer: ONNX Runtime's Slice copies);
- attention-24: ONNX's Attention (opset 24) over the whole buffer with ``nonpad_kv_seqlen``.

Each form is timed in turn with the others, a block of runs each per round (so the machine's drift
falls on all alike; blocks, not single runs, because each session's idle ONNX Runtime worker keeps
spinning for a while after its run and would take a core from the next form's), the median of
each block, then the median over ``--rounds``; ``max_err`` is the largest difference from numpy.
Only one thing should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

FORMS = ("gqa", "gqa-int8", "matmul-exact", "matmul-sliced", "attention-24")
BLOCK = 25  # runs of one form in a row (see the module docstring)
INT8_SCALE = 0.05  # the int8 cache's scale, every channel (the cache holds values within ±6.35)


def _model(nodes, inputs, outputs, opset: int, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "attention", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10  # what ONNX Runtime 1.31 reads
    return model.SerializeToString()


def _info(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def build(form: str, heads: int, kv_heads: int, head_dim: int, buffer: int) -> bytes:
    """One form's graph; inputs are named as in ``feeds``."""
    f32, group = TensorProto.FLOAT, heads // kv_heads
    out = [_info("out", f32, None)]
    if form.startswith("gqa"):
        cache = TensorProto.INT8 if form == "gqa-int8" else f32
        inputs = [_info("q", f32, ["B", 1, heads * head_dim]),
                  _info("k", f32, ["B", 1, kv_heads * head_dim]),
                  _info("v", f32, ["B", 1, kv_heads * head_dim]),
                  _info("past_key", cache, ["B", kv_heads, buffer, head_dim]),
                  _info("past_value", cache, ["B", kv_heads, buffer, head_dim]),
                  _info("seqlens_k", TensorProto.INT32, ["B"]),
                  _info("total", TensorProto.INT32, [])]
        names = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total"]
        attrs = dict(num_heads=heads, kv_num_heads=kv_heads, scale=head_dim ** -0.5)
        inits = []
        if form == "gqa-int8":
            names += ["", "", "", "", "", "scale", "scale"]
            attrs.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL",
                         kv_cache_bit_width=8)
            inits = [helper.make_tensor("scale", f32, [kv_heads * head_dim],
                                        [INT8_SCALE] * (kv_heads * head_dim))]
        node = helper.make_node("GroupQueryAttention", names, ["out", "present_key",
                                                               "present_value"],
                                domain="com.microsoft", **attrs)
        out += [_info("present_key", cache, None), _info("present_value", cache, None)]
        return _model([node], inputs, out, 21, inits)
    if form == "attention-24":
        inputs = [_info("q", f32, ["B", heads, 1, head_dim]),
                  _info("keys", f32, ["B", kv_heads, buffer, head_dim]),
                  _info("values", f32, ["B", kv_heads, buffer, head_dim]),
                  _info("lengths", TensorProto.INT64, ["B"])]
        node = helper.make_node("Attention", ["q", "keys", "values", "", "", "", "lengths"],
                                ["out"], scale=head_dim ** -0.5)
        return _model([node], inputs, out, 24)
    length = "L" if form == "matmul-exact" else buffer  # exact: K and V of the context only
    inputs = [_info("q", f32, ["B", kv_heads, group, head_dim]),
              _info("keys", f32, ["B", kv_heads, length, head_dim]),
              _info("values", f32, ["B", kv_heads, length, head_dim]),
              _info("mask", f32, ["B", 1, 1, "L"])]
    nodes, keys, values = [], "keys", "values"
    inits = []
    if form == "matmul-sliced":
        inputs.append(_info("end", TensorProto.INT64, [1]))
        inits = [helper.make_tensor("start", TensorProto.INT64, [1], [0]),
                 helper.make_tensor("axis", TensorProto.INT64, [1], [2])]
        nodes += [helper.make_node("Slice", ["keys", "start", "end", "axis"], ["k_used"]),
                  helper.make_node("Slice", ["values", "start", "end", "axis"], ["v_used"])]
        keys, values = "k_used", "v_used"
    nodes += [helper.make_node("FusedMatMul", ["q", keys], ["scores"], domain="com.microsoft",
                               transB=1, alpha=head_dim ** -0.5),
              helper.make_node("Add", ["scores", "mask"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", values], ["out"])]
    return _model(nodes, inputs, out, 21, inits)


def reference(q, keys, values, lengths):
    """numpy: q (B, H, D) over keys/values (B, Hkv, >= max(lengths), D) -> (B, H, D)."""
    b, h, d = q.shape
    group = h // keys.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    for r in range(b):
        for head in range(h):
            k = keys[r, head // group, :lengths[r]].astype(np.float64)
            s = k @ q[r, head].astype(np.float64) / np.sqrt(d)
            p = np.exp(s - s.max())
            out[r, head] = (p / p.sum()) @ values[r, head // group, :lengths[r]]
    return out


class Form:
    """A session of one form, bound once to its inputs (the cache in place for gqa)."""

    def __init__(self, form, heads, kv_heads, head_dim, rows, context, buffer, threads, rng):
        self.form = form
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        self.session = ort.InferenceSession(build(form, heads, kv_heads, head_dim, buffer), so,
                                            providers=["CPUExecutionProvider"])
        total = context + 1
        q = rng.standard_normal((rows, heads, head_dim)).astype(np.float32)
        keys = rng.uniform(-6, 6, (rows, kv_heads, buffer, head_dim)).astype(np.float32)
        values = rng.uniform(-6, 6, (rows, kv_heads, buffer, head_dim)).astype(np.float32)
        if form == "gqa-int8":  # values the int8 cache holds exactly
            keys = np.round(keys / INT8_SCALE).clip(-127, 127) * INT8_SCALE
            values = np.round(values / INT8_SCALE).clip(-127, 127) * INT8_SCALE
            keys, values = keys.astype(np.float32), values.astype(np.float32)
        self.expected = reference(q, keys, values, [total] * rows)
        io = self.session.io_binding()
        self.keep = []  # arrays the binding reads must outlive it

        def bind(name, array):
            array = np.ascontiguousarray(array)
            self.keep.append(array)
            io.bind_cpu_input(name, array)

        group = heads // kv_heads
        if form.startswith("gqa"):
            bind("q", q.reshape(rows, 1, heads * head_dim))
            # the new token's key and value: what the reference holds at position `context`
            bind("k", keys[:, :, context].reshape(rows, 1, kv_heads * head_dim))
            bind("v", values[:, :, context].reshape(rows, 1, kv_heads * head_dim))
            for name, array in (("key", keys), ("value", values)):
                if form == "gqa-int8":
                    array = np.round(array / INT8_SCALE).astype(np.int8)
                value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
                self.keep.append(value)
                io.bind_ortvalue_input(f"past_{name}", value)
                io.bind_ortvalue_output(f"present_{name}", value)
            bind("seqlens_k", np.full(rows, context, np.int32))
            bind("total", np.array(total, np.int32))
            shape = (rows, 1, heads * head_dim)
        elif form == "attention-24":
            bind("q", q.reshape(rows, heads, 1, head_dim))
            bind("keys", keys)
            bind("values", values)
            bind("lengths", np.full(rows, total, np.int64))
            shape = (rows, heads, 1, head_dim)
        else:
            bind("q", q.reshape(rows, kv_heads, group, head_dim))
            exact = form == "matmul-exact"
            bind("keys", keys[:, :, :total] if exact else keys)
            bind("values", values[:, :, :total] if exact else values)
            bind("mask", np.zeros((rows, 1, 1, total), np.float32))
            if not exact:
                bind("end", np.array([total], np.int64))
            shape = (rows, kv_heads, group, head_dim)  # query heads in order, as (Hkv, G)
        self.out = np.zeros(shape, np.float32)
        io.bind_output("out", "cpu", 0, np.float32, self.out.shape, self.out.ctypes.data)
        self.io = io

    def run(self) -> float:
        start = time.perf_counter()
        self.session.run_with_iobinding(self.io)
        return time.perf_counter() - start

    def max_err(self) -> float:
        got = self.out.reshape(self.expected.shape)
        return float(np.abs(got - self.expected).max())


def measure(heads, kv_heads, head_dim, cases, rounds, threads, forms=FORMS) -> list[dict]:
    rows_out = []
    rng = np.random.default_rng(0)
    for rows, context, buffer in cases:
        made = [Form(f, heads, kv_heads, head_dim, rows, context, buffer, threads, rng)
                for f in forms]
        for form in made:  # warm-up, and the check
            form.run()
        errors = {m.form: m.max_err() for m in made}
        times: dict[str, list[float]] = {m.form: [] for m in made}
        for r in range(rounds):  # a block of runs of each form in turn (see the module's doc)
            for m in (made if r % 2 == 0 else made[::-1]):
                times[m.form].append(statistics.median(m.run() for _ in range(BLOCK)))
        gqa = statistics.median(times["gqa"]) if "gqa" in times else None
        for m in made:
            us = 1e6 * statistics.median(times[m.form])
            rows_out.append(dict(rows=rows, context=context, buffer=buffer, form=m.form,
                                 median_us=round(us, 1), max_err=errors[m.form],
                                 vs_gqa=round(us / (1e6 * gqa), 3) if gqa else None))
    return rows_out


def _case(text: str) -> tuple[int, int, int]:
    try:
        rows, context, buffer = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--case {text!r}: expected rows,context,buffer "
                                         "(three integers, e.g. 8,192,512)") from None
    if min(rows, context) < 1 or buffer <= context:
        raise argparse.ArgumentTypeError(f"--case {text!r}: rows and context must be >= 1 and "
                                         "the buffer longer than the context")
    return rows, context, buffer


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--case", type=_case, action="append",
                        help="rows,context,buffer (repeatable; default: 1,192,512 8,192,512 "
                             "1,6000,8192)")
    parser.add_argument("--rounds", type=int, default=8,
                        help=f"blocks of {BLOCK} runs of each form, alternating (default 8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--forms", default=",".join(FORMS),
                        help=f"comma-separated subset of {', '.join(FORMS)}")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.heads % args.kv_heads:
        parser.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    forms = [f for f in args.forms.split(",") if f]
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        parser.error(f"--forms: unknown {', '.join(unknown)} (choose from {', '.join(FORMS)})")
    cases = args.case or [(1, 192, 512), (8, 192, 512), (1, 6000, 8192)]
    rows = measure(args.heads, args.kv_heads, args.head_dim, cases, args.rounds, args.threads,
                   forms)
    print(f"onnxruntime {ort.__version__}, {args.threads} threads, heads {args.heads}/"
          f"{args.kv_heads} of {args.head_dim}; median us per layer and step")
    print(f"{'rows':>4} {'context':>7} {'buffer':>6}  {'form':<14} {'us':>9} {'vs gqa':>7} "
          f"{'max err':>9}")
    for r in rows:
        print(f"{r['rows']:>4} {r['context']:>7} {r['buffer']:>6}  {r['form']:<14} "
              f"{r['median_us']:>9.1f} {r['vs_gqa'] or '':>7} {r['max_err']:>9.2e}")
    if args.json:
        args.json.write_text(json.dumps(dict(
            onnxruntime=ort.__version__, threads=args.threads, heads=args.heads,
            kv_heads=args.kv_heads, head_dim=args.head_dim, rounds=args.rounds,
            command="python -m research.attention_forms " + " ".join(argv or []), rows=rows),
            indent=1) + "\n")


if __name__ == "__main__":
    main()

"""The peer comparison's report: the table, the ratios against the speed and fidelity targets, the
profile lines and the chart."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.core import targets
from benchmarks.core.env import REPORT_PACKAGES, WORKER, Setup
from benchmarks.core.proc import StepFailed, log, module_env, run
from benchmarks.peers import GENAI, HF, LLAMA, OURS, llama_match
from benchmarks.peers.measure import PROFILE_STEPS

# ----------------------------------------------------------------------------- report


def med(row: dict | None, key: str) -> float | None:
    v = (row or {}).get(key)
    return v.get("median") if isinstance(v, dict) else v


def find(rows: list[dict], system: str, precision: str, variant: str | None = None) -> dict | None:
    for r in rows:
        if (r["system"] == system and r["precision"] == precision and "error" not in r
                and (variant is None or r.get("variant") == variant)):
            return r
    return None


def fmt_rate(row: dict, key: str) -> str:
    v = row.get(key)
    if not isinstance(v, dict):
        return "-"
    return f"{v['median']:7.1f} ({v['min']:.0f}-{v['max']:.0f})"


def fmt_ttft(row: dict) -> str:
    v = row.get("ttft_s")
    if not isinstance(v, dict):
        return "-"
    return f"{1e3 * v['median']:6.1f} ({1e3 * v['min']:.0f}-{1e3 * v['max']:.0f})"


def fmt_fidelity(row: dict) -> str:
    f = row.get("fidelity")
    if not f:
        return "-"
    if f.get("reference"):
        return "reference"
    if "error" in f:
        return "ERROR"
    # KL is >= 0; float rounding can leave an identical model a hair below
    return f"{f['top1']}/{f['positions']} · {max(f['kl_mean'], 0.0):.4f}"


def table(rows: list[dict]) -> str:
    head = ["system", "precision", "prefill tok/s", "decode tok/s", "TTFT ms", "greedy agreement",
            "forced top-1 / KL", "peak RSS MiB"]
    lines = []
    for r in rows:
        name = r["system"] + (f" [{r['variant']}]" if r.get("variant") else "")
        if "error" in r:
            lines.append([name, r["precision"], "ERROR: " + r["error"][:90], "", "", "", "", ""])
            continue
        if r["system"] == HF:
            agree = "reference"
        elif r.get("agreement"):
            agree = "/".join(str(a) for a in r["agreement"]) + f" of {len(r['greedy'][0])}"
        else:
            agree = "-"
        rss = r.get("peak_rss_mib")
        lines.append([name, r["precision"], fmt_rate(r, "prefill_tok_s"),
                      fmt_rate(r, "decode_tok_s"), fmt_ttft(r), agree, fmt_fidelity(r),
                      f"{rss:.0f}" if isinstance(rss, (int, float)) else "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def ratios_and_checks(rows: list[dict], args) -> tuple[list[dict], list[dict]]:
    genai_variant = f"{args.threads} threads"
    ratios = []
    for p in args.precision:
        ours = find(rows, OURS, p)
        if not ours:
            continue
        for peer in (find(rows, GENAI, p, genai_variant), find(rows, LLAMA, llama_match(args)[p])):
            if not peer:
                continue
            r = {"precision": p, "peer": f"{peer['system']} {peer['precision']}"
                                         f" [{peer.get('variant', '')}]"}
            for key in ("decode_tok_s", "prefill_tok_s"):
                a, b = med(ours, key), med(peer, key)
                r[key] = a / b if a and b else None
            a, b = med(ours, "ttft_s"), med(peer, "ttft_s")
            r["ttft_speedup"] = b / a if a and b else None  # > 1: our first token comes sooner
            ratios.append(r)

    checks = []

    def check(name: str, ok: bool | None, detail: str) -> None:
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        checks.append({"check": name, "status": status, "detail": detail})

    def vs(p: str, peer_sys: str, peer_prec: str, key: str, factor: float, variant=None,
           label: str = "") -> None:
        ours, peer = find(rows, OURS, p), find(rows, peer_sys, peer_prec, variant)
        a, b = med(ours, key), med(peer, key)
        what = key.split("_")[0]
        name = f"{what} {p} >= {factor:.1f}x {peer_sys} {peer_prec}{label}"
        if not a or not b:
            check(name, None, "no data")
        else:
            check(name, a >= factor * b, f"{a / b:.2f}x ({a:.1f} vs {b:.1f} tok/s)")

    g = genai_variant
    if "fp32" in args.precision:
        vs("fp32", GENAI, "fp32", "decode_tok_s", targets.DECODE_VS_GENAI["fp32"], g)
        ours = find(rows, OURS, "fp32")
        d, ceil = med(ours, "decode_tok_s"), (ours or {}).get("decode_ceiling_tok_s")
        reached = (ours or {}).get("decode_ceiling_reached")
        share = targets.DECODE_CEILING_SHARE
        name = f"decode fp32 >= {share:.0%} of our bandwidth ceiling (decode_ceiling_tok_s)"
        if reached and ceil:
            # each run against the bandwidth measured right after it (bench), median of rounds
            check(name, reached >= share, f"{reached:.0%} (median ceiling {ceil:.1f} tok/s, "
                                         f"decode {d:.1f} tok/s)")
        else:
            check(name, None, "no decode_ceiling_reached in the bench JSON")
    if "int8" in args.precision:
        vs("int8", GENAI, "int8", "decode_tok_s", targets.DECODE_VS_GENAI["int8"], g)
        vs("int8", LLAMA, "q8_0", "decode_tok_s", targets.DECODE_VS_LLAMA["int8"])
    if "int4" in args.precision:
        vs("int4", GENAI, "int4", "decode_tok_s", targets.DECODE_VS_GENAI["int4"], g)
        ours = find(rows, OURS, "int4")
        agree = (ours or {}).get("agreement")
        half = int(args.agree_tokens * targets.INT4_AGREEMENT_SHARE)
        name = f"agreement int4 >= {half}/{args.agree_tokens} on every prompt"
        check(name, None if not agree else min(agree) >= half,
              "/".join(map(str, agree)) if agree else "no data")
        vs("int4", LLAMA, llama_match(args)["int4"], "decode_tok_s",
           targets.DECODE_VS_LLAMA["int4"])
    for p, factor in targets.PREFILL_VS_GENAI.items():
        if p in args.precision:
            vs(p, GENAI, p, "prefill_tok_s", factor, g)
    for p in args.precision:
        ours, peer = find(rows, OURS, p), find(rows, GENAI, p, g)
        a, b = med(ours, "ttft_s"), med(peer, "ttft_s")
        name = f"TTFT {p} <= {GENAI} {p}"
        check(name, None if not (a and b) else a <= b,
              f"{1e3 * a:.1f} vs {1e3 * b:.1f} ms" if a and b else "no data")
    for p in args.precision:
        ours = find(rows, OURS, p)
        rss, w, kv = ((ours or {}).get(k) for k in ("peak_rss_mib", "weight_bytes", "kv_bytes"))
        name = f"peak RSS {p} <= (weights + KV) x {targets.RSS_OVER_WEIGHTS_AND_KV}"
        if rss and w:
            budget = (w + (kv or 0)) * targets.RSS_OVER_WEIGHTS_AND_KV / 2**20
            check(name, rss <= budget,
                  f"{rss:.0f} MiB vs budget {budget:.0f} MiB "
                  f"(weights {w / 2**20:.0f} + KV {(kv or 0) / 2**20:.1f} MiB)")
        else:
            check(name, None, "no data")
    if "int8" in args.precision:
        ours, peer = find(rows, OURS, "int8"), find(rows, GENAI, "int8", g)
        a, b = (ours or {}).get("agreement"), (peer or {}).get("agreement")
        name = f"agreement int8 >= {GENAI} int8 (tokens summed over prompts)"
        check(name, None if not (a and b) else sum(a) >= sum(b),
              f"{'/'.join(map(str, a))} vs {'/'.join(map(str, b))}" if a and b else "no data")
    # Beside the greedy agreement: the same comparison with teacher forcing, which a near-tie
    # cannot flip (see docs/benchmarks.md).
    for p in ("int8", "int4"):
        if p not in args.precision:
            continue
        for peer_sys, peer_prec in ((GENAI, p), (LLAMA, llama_match(args)[p])):
            a = (find(rows, OURS, p) or {}).get("fidelity") or {}
            b = (find(rows, peer_sys, peer_prec) or {}).get("fidelity") or {}
            name = f"fidelity {p}: KL to transformers <= {peer_sys} {peer_prec}'s (teacher-forced)"
            if "kl_mean" not in a or "kl_mean" not in b:
                check(name, None, "no data")
            else:
                check(name, a["kl_mean"] <= b["kl_mean"],
                      f"{a['kl_mean']:.4f} vs {b['kl_mean']:.4f}; top-1 {a['top1']} vs "
                      f"{b['top1']} of {a['positions']}")
    if getattr(args, "off_grid", False) and "int4" in args.precision:
        # issue 18's targets for a float source (the weights off the Q4_1 grid)
        a = (find(rows, OURS, "int4") or {}).get("fidelity") or {}
        b = (find(rows, GENAI, "int4") or {}).get("fidelity") or {}
        kl_share = targets.OFF_GRID_KL_VS_GENAI
        name = f"off-grid int4: KL <= {kl_share}x {GENAI} int4's"
        if "kl_mean" not in a or "kl_mean" not in b:
            check(name, None, "no data")
        else:
            check(name, a["kl_mean"] <= kl_share * b["kl_mean"],
                  f"{a['kl_mean'] / b['kl_mean']:.2f}x ({a['kl_mean']:.4f} vs {b['kl_mean']:.4f})")
        positions = a.get("positions") or 0
        top1 = targets.OFF_GRID_TOP1_OF_384
        need = -(-top1 * positions // 384) if positions else 0
        name = f"off-grid int4: top-1 >= {top1}/384 of transformers' tokens"
        check(name, None if "top1" not in a else a["top1"] >= need,
              f"{a['top1']}/{positions} (vs {b.get('top1', '?')} for {GENAI})"
              if "top1" in a else "no data")
    return ratios, checks


def profile_lines(profiles: dict[str, dict]) -> list[str]:
    """One line per precision, phase and system: the run split into weight kernels, the other
    nodes and the time outside nodes."""
    from llm_onnx.bench import WEIGHT_OPS

    lines = []
    for p, entry in profiles.items():
        for phase in ("decode", "prefill"):
            parts = []
            for system in ("ours", "genai"):
                prof = entry.get(system)
                if not prof:
                    continue
                if "error" in prof:
                    parts.append(f"{system}: {prof['error']}")
                    continue
                ph = prof[phase]
                weight_nodes = sum(o["nodes"] for o in ph["ops"] if o["op"] in WEIGHT_OPS)
                other_nodes = sum(o["nodes"] for o in ph["ops"] if o["op"] not in WEIGHT_OPS)
                other_ms = ph["node_ms"] - ph["weight_ms"]
                gbs = ph.get("weight_read_gb_s")
                parts.append(f"{system} {ph['run_ms']:.2f} ms = weights {ph['weight_ms']:.2f} "
                             f"({weight_nodes:.0f} nodes{f', {gbs:.1f} GB/s' if gbs else ''}) "
                             f"+ other {other_ms:.2f} ({other_nodes:.0f} nodes) "
                             f"+ outside nodes {ph['outside_ms']:.2f}")
            if parts:
                step = "decode step" if phase == "decode" else "prefill"
                lines.append(f"  {p:5} {step:11} " + " | ".join(parts))
    return lines


def model_label(args) -> str:
    shape = getattr(args, "shape", None)
    return f"{shape} shape, random weights" if shape else "SmolLM2-135M-Instruct"


def bandwidth_lines(rows: list[dict]) -> list[str]:
    """How close each system's decode comes to the memory-bandwidth ceiling: decode tok/s x the
    bytes its model holds, against the read bandwidth our bench measured beside its runs. Ours:
    bench's own count of the bytes a step reads. A peer's file counts a separate embedding table
    too (a token reads one row of it), so its share is an upper bound where it has one."""
    bws = [med(r, "memory_bandwidth_gb_s") for r in rows if r["system"] == OURS]
    bws = [b for b in bws if b]
    if not bws:
        return []
    bw = statistics.median(bws)
    out = [f"Share of the read bandwidth ({bw:.1f} GB/s, median of our bench's probes) reached "
           f"in decode (tok/s x bytes read per token):"]
    for r in rows:
        d = med(r, "decode_tok_s")
        if r["system"] == HF or not d or "error" in r:
            continue
        if r["system"] == OURS and r.get("decode_ceiling_reached"):
            share, what = r["decode_ceiling_reached"], "bench's bytes per step"
        elif r.get("weight_bytes"):
            share, what = d * r["weight_bytes"] / 1e9 / bw, "file bytes"
        else:
            continue
        name = r["system"] + (f" [{r['variant']}]" if r.get("variant") else "")
        out.append(f"  {r['precision']:5} {name:40} {share:4.0%} ({what})")
    return out + [""]


def report(results: dict, args) -> str:
    rows = results["rows"]
    ratios, checks = ratios_and_checks(rows, args)
    results["ratios"], results["checks"] = ratios, checks
    p = results["prompts"]
    lines = [(f"{model_label(args)}, batch 1, {args.prompt_len}-token prompt, "
              f"{args.new_tokens} new tokens, {args.rounds} round(s) x {args.passes} pass(es) after a "
              f"warm-up, systems round-robin: median "
              f"(min-max). Agreement: leading greedy tokens equal to transformers fp32's, "
              f"{len(p['agreement'])} prompt(s) ({', '.join(a['name'] for a in p['agreement'])})"
              f" x {args.agree_tokens} tokens."
              + (f" Forced top-1 / KL: fed transformers' greedy continuation of "
                 f"{len(p['agreement']) + len(p.get('fidelity', []))} prompts x {args.agree_tokens}"
                 f" tokens, positions where the system's top token is transformers' / mean "
                 f"KL(transformers || system)." if args.fidelity else "")),
             "", table(rows), ""]
    busy = max((r.get("cpu_busy_before", 0) for r in rows), default=0)
    if busy > 0.10:
        lines.insert(1, f"WARNING: something else was using the CPU ({busy:.0%} of it just before "
                        f"a measurement): these figures are not fit to compare.")
    if ratios:
        lines.append("llm-onnx / peer (tok/s: ours / theirs; TTFT: theirs / ours; "
                     "> 1 = ours faster)")
        w = max(len(r["peer"]) for r in ratios)
        for r in ratios:
            def f(x):
                return f"{x:5.2f}x" if x else "    -"
            lines.append(f"  {r['precision']:5} vs {r['peer']:{w}}  decode {f(r['decode_tok_s'])}"
                         f"  prefill {f(r['prefill_tok_s'])}  TTFT {f(r['ttft_speedup'])}")
        lines.append("")
    lines += bandwidth_lines(rows)
    lines.append("Targets:")
    lines += [f"  {c['status']:4}  {c['check']}: {c['detail']}" for c in checks]
    prof = profile_lines(results.get("profiles") or {})
    if prof:
        lines += ["", f"Where the time goes (ONNX Runtime's profiler, which slows every node a "
                      f"little; one prefill and the mean decode step of a "
                      f"{max(2, min(PROFILE_STEPS, args.new_tokens))}-token "
                      f"generation; ours vs {GENAI}'s graph at {args.threads} threads):"] + prof
    return "\n".join(lines)


def plot(results_file: Path, png: Path, args, setup: Setup) -> str | None:
    title = (f"{model_label(args)} on {os.cpu_count()} CPU cores: batch 1, "
             f"{args.prompt_len}-token prompt, {args.new_tokens} new tokens")
    python = sys.executable
    if subprocess.run([python, "-c", "import matplotlib"], check=False,
                      capture_output=True).returncode != 0:
        python = setup.venv("report", REPORT_PACKAGES, "matplotlib")
    try:
        run([python, "-m", WORKER, "plot", "--src", results_file, "--out", png, "--title",
             title], setup.logs / "plot.log", env=module_env())
        return str(png)
    except StepFailed as e:
        log(f"chart failed: {e}")
        return None



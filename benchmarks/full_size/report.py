"""The full-size run's table: exports, load and decode of each system, the machine before each
stage, and serving."""

from __future__ import annotations

from benchmarks.full_size.alone import gib, settle_line


def table(r: dict) -> str:
    lines = [f"{r['config']}, {r['layers']} layers; {r['machine']['date']}, onnxruntime "
             f"{r['machine']['onnxruntime']}, {r['machine']['cpus']} cores",
             "", "| export | weights.data GiB | peak RSS GiB | time s | parity KL |",
             "|---|---|---|---|---|"]
    for p, e in r["export"].items():
        lines.append(f"| {p} | {e['weights_bytes'] / 2**30:.2f} | {gib(e['process_peak_rss_mib'])}"
                     f" | {e['seconds']:.0f} | {e['parity']['kl']:.2g} |")
    for p, e in r["export"].items():
        stages = ", ".join(f"{k} {v / 1024:.2f}" for k, v in e["peak_rss_by_stage_mib"].items() if k)
        lines.append(f"export {p}, RSS sampled each second, peak by stage (GiB): {stages}")
    lines += ["", "| system | load s | RSS / PSS after load GiB | after generate GiB | peak GiB | "
              "TTFT s | prefill tok/s | decode tok/s | ceiling tok/s (reached) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for key, o in r["ours"].items():
        b, load, gen = o["bench"], o["memory_after_load"], o["memory_after_generate"]
        lines.append(
            f"| llm-onnx {key} | {o['load_s']:.1f} | {gib(load['rss'])} / {gib(load['pss'])} | "
            f"{gib(gen['rss'])} / {gib(gen['pss'])} | {gib(b['peak_rss_mib'])} | "
            f"{b['ttft_s']['median']:.2f} | {b['prefill_tok_s']['median']:.1f} | "
            f"{b['decode_tok_s']['median']:.2f} | {b['decode_ceiling_tok_s']:.1f} "
            f"({100 * b['decode_ceiling_reached']:.0f}%) |")
    for q, cpp in r["llama"].items():
        load, gen = cpp["memory_after_load"], cpp["memory_after_generate"]
        lines.append(f"| llama.cpp {q} | {cpp['load_s']:.1f} | {gib(load['rss'])} / "
                     f"{gib(load['pss'])} | {gib(gen['rss'])} / {gib(gen['pss'])} | "
                     f"{gib(gen.get('vmhwm'))} | {cpp['prompt_ms'] / 1e3:.2f} | "
                     f"{cpp['prefill_tok_s']:.1f} | {cpp['decode_tok_s']:.2f} | |")
    lines.append("(peak: the process's before bench's 1 GiB bandwidth probe; llama.cpp: VmHWM)")
    for key, o in r["ours"].items():
        w = (o["weights_bytes"] + o["kv_bytes"]) / 2**20
        peak, gen = o["bench"]["peak_rss_mib"], o["memory_after_generate"]["rss"]
        lines.append(f"llm-onnx {key}: RSS after generating {gen / w:.2f} x and peak "
                     f"{peak / w:.2f} x (weights + a row's cache of {r['args']['prompt_len']}+"
                     f"{r['args']['new_tokens']} positions, {w / 1024:.2f} GiB); a decode step "
                     f"reads {o['weight_bytes_read_batch1'] / 2**30:.2f} GiB of weights, the "
                     f"memory {o['bench']['memory_bandwidth_gb_s']:.1f} GB/s")
    before = [(f"export {p}", e) for p, e in r["export"].items()]
    before += [(f"llm-onnx {k}", o) for k, o in r["ours"].items()]
    before += [(f"llama.cpp {q}", cpp) for q, cpp in r["llama"].items()]
    before += [(f"serve {s['system']} {k} x{s['clients']}", s)
               for k, rows in r["serve"].items() for s in rows]
    before = [(label, e["settle"]) for label, e in before if e.get("settle")]
    if before:
        lines += ["", ("The machine before each stage, GiB (settle(): earlier stages' processes "
                       "ended, sync and writeback, the page cache dropped, a quiet CPU):")]
        lines += [f"- {label}: {settle_line(s)}" for label, s in before]
    if r["serve"]:
        lines += ["", "| serving | clients | aggregate tok/s | TTFT p50 / p99 s | inter-token "
                  "p50 ms | per-request tok/s | errors |", "|---|---|---|---|---|---|---|"]
        for key, rows in r["serve"].items():
            for s in rows:
                lines.append(f"| {s['system']} {key} | {s['clients']} | {s['aggregate_tok_s']:.2f} | "
                             f"{s['ttft_p50_s'] or 0:.2f} / {s['ttft_p99_s'] or 0:.2f} | "
                             f"{1e3 * (s['itl_p50_s'] or 0):.0f} | {s['per_request_tok_s'] or 0:.2f} "
                             f"| {s['error_count']} |")
    return "\n".join(lines)

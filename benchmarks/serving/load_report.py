"""The load test's report: the table, the serving targets at 8 clients (benchmarks.core.targets)
and the chart."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.core import targets
from benchmarks.core.proc import log

OURS, LLAMA, RAY = "llm-onnx", "llama-server", "llm-onnx on Ray"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{1e3 * value:.0f}"


def table(results: dict) -> str:
    rounds = max((r["rounds"] for r in results["runs"]), default=1)
    lines = [f"medians over {rounds} round(s) of each run" if rounds > 1 else "one round",
             "| system | precision | clients | aggregate tok/s | TTFT p50 / p99 ms | "
             "inter-token p50 / p99 ms | per-request tok/s | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        lines.append(f"| {r['system']} | {r['precision']} | {r['clients']} | "
                     f"{r['aggregate_tok_s']:.1f} | {ms(r['ttft_p50_s'])} / {ms(r['ttft_p99_s'])} | "
                     f"{ms(r['itl_p50_s'])} / {ms(r['itl_p99_s'])} | "
                     f"{r['per_request_tok_s'] or 0:.1f} | {r['error_count']} |")
    for precision, b in results["baseline"].items():
        lines.append(f"\nllm-onnx {precision} batch-1 decode (llm-onnx bench): "
                     f"{b['decode_tok_s']:.1f} tok/s, TTFT {1e3 * b['ttft_s']:.0f} ms")
    lines.append("\nwhere our server's time went (wall = model runs + host work in the "
                 "scheduler + idle):")
    for r in results["runs"]:
        p = r.get("profile")
        if p:
            lines.append(f"  {r['system']} {r['precision']} x {r['clients']}: wall "
                         f"{r['wall_s']:.1f} s = "
                         f"decode {p['decode_s']:.1f} s ({p['decode_runs']:.0f} runs, mean batch "
                         f"{p['mean_batch']:.1f} of {p['mean_rows_run']:.1f} rows run, "
                         f"{p['decode_step_ms']:.1f} ms each) + prefill "
                         f"{p['prefill_s']:.1f} s ({p['prefill_tokens']:.0f} tokens) + host "
                         f"{p['host_s']:.1f} s + idle {p['idle_s']:.1f} s")
    return "\n".join(lines)


def verdicts(results: dict, clients: int = targets.SERVE_CLIENTS) -> list[str]:
    """The serving targets (benchmarks.core.targets) at ``clients`` concurrent clients, int8
    against q8_0: MET or MISS, and the figures."""
    def find(system: str, precision: str) -> dict | None:
        return next((r for r in results["runs"] if r["system"] == system and
                     r["precision"] == precision and r["clients"] == clients), None)

    ours, peer = find(OURS, "int8"), find(LLAMA, "q8_0")
    base = results["baseline"].get("int8")
    if not (ours and peer and base):
        return [f"targets: no int8 run at {clients} clients"]
    vs_base = ours["aggregate_tok_s"] / base["decode_tok_s"]
    vs_peer = ours["aggregate_tok_s"] / peer["aggregate_tok_s"]
    ttft = (ours["ttft_p99_s"] or 0) <= (peer["ttft_p99_s"] or 0)
    want_base, want_peer = targets.SERVE_VS_BATCH1, targets.SERVE_VS_LLAMA_SERVER
    return [f"{'MET ' if vs_base >= want_base else 'MISS'} aggregate at {clients} clients >= "
            f"{want_base:g}x our batch-1 decode: {vs_base:.2f}x ({ours['aggregate_tok_s']:.1f} vs "
            f"{base['decode_tok_s']:.1f} tok/s)",
            f"{'MET ' if vs_peer >= want_peer else 'MISS'} aggregate >= {want_peer}x "
            f"llama-server q8_0: "
            f"{vs_peer:.2f}x ({peer['aggregate_tok_s']:.1f} tok/s)",
            f"{'MET ' if ttft else 'MISS'} p99 TTFT no worse than llama-server's: "
            f"{ms(ours['ttft_p99_s'])} vs {ms(peer['ttft_p99_s'])} ms"]


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib: skipping the chart (pip install 'llm-onnx[bench]')")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for system in dict.fromkeys(r["system"] for r in results["runs"]):
        for precision in {r["precision"] for r in results["runs"] if r["system"] == system}:
            rows = [r for r in results["runs"] if r["system"] == system and
                    r["precision"] == precision]
            xs = [r["clients"] for r in rows]
            style = "--s" if system == LLAMA else "-o"
            a.plot(xs, [r["aggregate_tok_s"] for r in rows], style, label=f"{system} {precision}")
            b.plot(xs, [1e3 * (r["ttft_p99_s"] or 0) for r in rows], style,
                   label=f"{system} {precision}")
    for ax, label in ((a, "generated tokens/s, all clients"), (b, "time to first token p99 (ms)")):
        ax.set_xscale("log", base=2)
        clients = sorted({r["clients"] for r in results["runs"]})
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SmolLM2-135M-Instruct: llm-onnx serve vs llama-server (2 threads each)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.partial")
    fig.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, path)
    plt.close(fig)


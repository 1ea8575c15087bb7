"""The peer comparison's chart: decode and prefill tok/s per system (the worker's ``plot``
step, run where matplotlib is)."""

from __future__ import annotations

import json
from pathlib import Path


def plot(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgba

    rows = [r for r in json.loads(Path(args.src).read_text())["rows"]
            if r.get("decode_tok_s") or r.get("prefill_tok_s")]
    labels = [f"{r['system']} {r['precision']}" + (f" ({r['variant']})" if r.get("variant")
                                                     else "") for r in rows]
    colors = {"llm-onnx": "#1f77b4", "onnxruntime-genai": "#ff7f0e", "llama.cpp": "#2ca02c",
              "transformers": "#7f7f7f"}
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.8), sharey=True)
    for ax, key, title in ((axes[0], "decode_tok_s", "decode tok/s (median; bars: min-max)"),
                           (axes[1], "prefill_tok_s", "prefill tok/s (median; bars: min-max)")):
        med = [(r.get(key) or {}).get("median", 0) for r in rows]
        err = [[m - (r.get(key) or {}).get("min", m) for m, r in zip(med, rows)],
               [(r.get(key) or {}).get("max", m) - m for m, r in zip(med, rows)]]
        y = range(len(rows))
        ax.barh(y, med, xerr=err, capsize=2,
                color=[to_rgba(colors.get(r["system"], "#9467bd"),
                               0.45 if r.get("variant") == "as built" else 1.0) for r in rows])
        for i, m in enumerate(med):
            if m:
                ax.text(m, i, f" {m:.0f}", va="center", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(list(range(len(rows))), labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(args.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)

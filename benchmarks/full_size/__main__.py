"""A model at full size on this machine: export, load and decode, llama.cpp on a GGUF of the
same shape, and `llm-onnx serve` at 1 and 4 clients; one command, one JSON, one table. The
presets benchmarks/full_size/random_gguf.py writes GGUFs of: the mixtures of experts
Qwen3-30B-A3B (qwen3_30b_a3b, the default), Qwen3.6-35B-A3B (qwen3_6_35b_a3b: Gated DeltaNet and
gated full attention, 256 experts and a shared expert; llama.cpp's qwen35moe), gpt-oss-20b
(gpt_oss_20b) and Gemma 4 26B-A4B (gemma4_26b_a4b: 128 GeGLU experts beside a dense MLP;
llama.cpp's gemma4), and the dense SmolLM3-3B (smollm3_3b: every fourth layer NoPE, tied
embeddings; llama.cpp's smollm3).

    python -m benchmarks.full_size              # the whole model: hours; the machine alone
    python -m benchmarks.full_size --layers 2   # the same pipeline on 2 of the 48 layers
    python -m benchmarks.full_size --config qwen3_6_35b_a3b             # 40 layers
    python -m benchmarks.full_size --config qwen3_6_35b_a3b --layers 4  # 3 linear + 1 full
    python -m benchmarks.full_size --config smollm3_3b --run int4 int8  # both fit

Stages, one process each, one after the other (peak RSS from wait4 or the kernel's VmHWM):
  export   random weights of the preset (cut to --layers, keeping its pattern of layer kinds
           and of NoPE layers) with a word-level tokenizer of its vocabulary (t0 ... t{V-1}, so
           the server streams text), each --export precision: time, peak RSS and its timeline by
           stage, weights.data, the parity gate's figures.
  ours     each --run precision: Model.load (RSS, PSS, anonymous and file-backed memory after
           loading, and after a --prompt-len prompt and --new-tokens tokens), then `llm-onnx
           bench` (llm_onnx.bench.run_bench: TTFT, prefill, batch-1 decode, and the
           active-parameter ceiling: the bytes a step reads (of experts, the top-k's share; a
           dense model reads all) over the read bandwidth measured beside each run).
  llama    a GGUF of the same shape, random Q4_0 (against int4) or Q8_0 (int8) blocks written
           with gguf-py (random_gguf.py), llama-server at --threads: load, RSS/PSS, one request of
           the same prompt ids and --new-tokens tokens per --repeat (its own prompt and decode
           timings).
  serve    `llm-onnx serve` and llama-server with each --clients count of concurrent streaming
           clients (the load test's client): aggregate tok/s, TTFT, inter-token latency.

Each system is measured alone. Before every stage (export, ours per precision and variant,
llama, each serve run) settle() ends any process an earlier stage left (none should be: each
worker is waited for, each server stopped and reaped), syncs and waits (up to 5 minutes) until
the kernel's dirty and writeback pages are under 64 MiB (an export writes its 19 GB weights.data,
the llama stage its GGUF, just before), waits (up to 2 minutes) for a quiet CPU: under 10% busy
in a second and a 1-minute load average under half the cores, then drops the page cache (as root;
--no-drop-caches keeps it, for comparison; where it cannot be written the record says so), so no
stage starts with another's files cached or its own warm. Its record (/proc/meminfo in MiB: free,
available, page cache, dirty, writeback, anonymous, mapped, swap; the seconds waited, the load,
this process's RSS, other processes resident at 256 MiB or more) goes into the stage's results
as "settle" and a line of the table. Loads are thus from a cold cache, for both systems.

Folders are written under --work and deleted after their stage (--keep keeps them), never two at
once. At full size qwen3_30b_a3b's int4 is 19 GB, int8 34 GB, Q4_0 17 GB, Q8_0 32 GB;
qwen3_6_35b_a3b's int4 about 23 GB, int8 about 39 GB, Q4_0 19.6 GB, Q8_0 37 GB. int8 and Q8_0 do
not fit in 24 GiB of memory: by default they are only exported (--run int4). smollm3_3b's Q4_0 is
1.7 GB, Q8_0 3.3 GB: pass --run int4 int8 to time both.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.core import record
from benchmarks.full_size.report import table
from benchmarks.full_size.stages import MATCH, measure
from benchmarks.full_size.workers import model_config


def check_config(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """--config names a preset random_gguf.py writes a GGUF of (cut to --layers, in a form
    llama.cpp's architecture can express); the expert options need experts."""
    from benchmarks.full_size.random_gguf import ARCHS, gguf_arch
    from llm_onnx.families import get_config

    try:
        full = get_config(a.config)
    except Exception as e:  # an unknown preset: the registry's own message
        p.error(str(e))
    if a.layers is not None and not 1 <= a.layers <= full.num_hidden_layers:
        p.error(f"--layers {a.layers}: {a.config} has {full.num_hidden_layers} layers")
    cfg = model_config(a.config, a.layers)
    if cfg.architecture not in ARCHS:
        p.error(f"--config {a.config}: {cfg.architecture}, not an architecture random_gguf.py "
                f"writes a GGUF of ({', '.join(ARCHS)})")
    if a.llama:
        try:
            gguf_arch(cfg)
        except ValueError as e:
            p.error(f"--config {a.config}: {e}")
    if cfg.moe is None:
        for flag, given in (("--qmoe-int8-activations", a.qmoe_int8_activations),
                            ("--experts-accuracy-level 4", a.experts_accuracy_level == 4),
                            ("--experts-block-size", getattr(a, "experts_block_size", None)),
                            ("--experts-scheme", getattr(a, "experts_scheme", None))):
            if given:
                p.error(f"{flag}: {a.config} is dense (no experts, no QMoE nodes); leave it out")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3_30b_a3b",
                   help="a preset random_gguf.py writes GGUFs of: the mixtures of experts "
                        "qwen3_30b_a3b, qwen3_6_35b_a3b, gpt_oss_20b, gemma4_26b_a4b, the dense "
                        "smollm3_3b (or their tiny presets)")
    p.add_argument("--layers", type=int, help="cut the preset to this many layers (default: all)")
    p.add_argument("--export", nargs="+", choices=list(MATCH), default=["int4", "int8"],
                   help="precisions exported (time, peak RSS, size)")
    p.add_argument("--run", nargs="*", choices=list(MATCH), default=["int4"],
                   help="precisions also loaded, decoded, served and compared with llama.cpp")
    p.add_argument("--block-size", type=int, default=32,
                   help="the export's quantization block (experts: the largest power of two up "
                        "to it that divides their widths)")
    p.add_argument("--experts-accuracy-level", type=int, choices=(0, 4),
                   help="the export's QMoE accuracy level (llm-onnx export "
                        "--experts-accuracy-level): 4 = int8 activations, also when serving "
                        "(default: the export's, 4 on CPU)")
    p.add_argument("--experts-block-size", type=int,
                   help="the experts' block (llm-onnx export --experts-block-size; default: "
                        "the export's, 64 for 4-bit zero-point experts)")
    p.add_argument("--experts-scheme", choices=("zero_point", "symmetric"),
                   help="llm-onnx export --experts-scheme (default: the export's)")
    p.add_argument("--export-mmap-threshold", type=int, default=0, metavar="BYTES",
                   help="glibc's MALLOC_MMAP_THRESHOLD_ for the export worker: blocks this large "
                        "or larger are mapped and given back when freed (default 0: glibc's own "
                        "dynamic threshold, what `llm-onnx export` runs under)")
    p.add_argument("--no-export-huge-pages", dest="export_huge_pages", action="store_false",
                   help="run the export worker without the GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
                        "that `llm-onnx export` adds by itself where glibc and the kernel take "
                        "it (transparent huge pages for glibc's mappings: far fewer page faults "
                        "on big models)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3, help="timed runs of ours and of llama.cpp")
    p.add_argument("--clients", nargs="+", type=int, default=[1, 4])
    p.add_argument("--serve-requests", type=int, default=2, help="requests per client")
    p.add_argument("--serve-prompt-len", type=int, default=128)
    p.add_argument("--serve-new-tokens", type=int, default=64)
    p.add_argument("--no-llama", dest="llama", action="store_false")
    p.add_argument("--no-serve", dest="serve", action="store_false")
    p.add_argument("--llama-load-mode", choices=("auto", "none"), default="auto",
                   help="llama-server --load-mode: auto maps the GGUF (llama.cpp's default; it "
                        "repacks the matrices into its own memory and the mapped pages stay "
                        "resident while memory allows), none reads it into memory (one copy)")
    p.add_argument("--no-drop-caches", dest="drop_caches", action="store_false",
                   help="before each stage, sync and wait for the writeback and a quiet CPU but "
                        "keep the page cache (by default it is dropped, as root; for comparison)")
    p.add_argument("--qmoe-int8-activations", action="store_true",
                   help="also load and decode the int4 folder with its QMoE nodes at "
                        "accuracy_level 4 (int8 activations; ~50%% more memory for the experts)")
    p.add_argument("--work", type=Path,
                   default=Path.home() / ".cache" / "llm-onnx-bench" / "moe-full")
    p.add_argument("--bench-work", type=Path, default=Path.home() / ".cache" / "llm-onnx-bench",
                   help="where the load test builds llama-server (shared with it)")
    p.add_argument("--llama-amx", choices=["auto", "on", "off"], default="auto",
                   help="llama.cpp's AMX kernels: on (a native build), off (the CPU's other "
                        "extensions), auto: native unless the load test or the peer comparison "
                        "recorded a crash of the native build on this CPU (BENCH_WORK/llama-amx.json)")
    p.add_argument("--keep", action="store_true", help="keep the model folders and GGUFs")
    p.add_argument("--reuse", action="store_true",
                   help="take a folder an earlier --keep run exported (and its export figures) "
                        "instead of exporting again: export while the machine is shared, then "
                        "time the rest alone")
    p.add_argument("--out", type=Path, help="the JSON (default: WORK/results/moe-full-TIME.json)")
    a = p.parse_args()
    check_config(p, a)
    a.work.mkdir(parents=True, exist_ok=True)
    results = measure(a)
    out = a.out or a.work / "results" / f"moe-full-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record.write(out, "full_size", results)
    print(table(results))
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()

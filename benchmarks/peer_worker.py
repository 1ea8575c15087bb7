"""One step of benchmarks/compare_peers.py, run as a child process in the environment that has the
right packages (the project's venv, the onnxruntime-genai venv, the llama-cpp-python venv).

    python benchmarks/peer_worker.py STEP --result OUT.json [options]

Steps that build something write files; steps that measure write their numbers to --result.
Only the standard library is imported at module level: each step imports what it needs, so the
same file runs in every venv. Not meant to be used directly (compare_peers.py drives it).

Timing, the same for every system (batch 1, fixed prompt token ids, greedy):
    t0 ─ prefill (the prompt in one call) ─ t_prefill ─ first token chosen ─ t_first ─
         N-1 decode steps, each a forward pass of one token and a greedy pick ─ t_end
    ttft_s = t_first - t0;  prefill_tok_s = P / (t_prefill - t0);
    decode_tok_s = (N - 1) / (t_end - t_first)
Each measurement: one warm-up generation, then --passes passes; median, min and max of each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# ----------------------------------------------------------------------------- common harness


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(run: Callable[[list[int], int], dict], ids: list[int], new_tokens: int,
            passes: int) -> dict:
    """``run(ids, n)`` -> {"t_prefill", "t_first", "t_end" (seconds since its own start),
    "tokens"}; one warm-up, then ``passes`` timed passes."""
    run(ids, new_tokens)  # warm-up
    ttft, prefill, decode, counts = [], [], [], []
    for _ in range(passes):
        r = run(ids, new_tokens)
        ttft.append(r["t_first"])
        prefill.append(len(ids) / r["t_prefill"])
        n = len(r["tokens"])
        counts.append(n)
        if n > 1:
            decode.append((n - 1) / (r["t_end"] - r["t_first"]))
    return {"ttft_s": stats(ttft), "prefill_tok_s": stats(prefill),
            "decode_tok_s": stats(decode) if decode else None,
            "generated_tokens": min(counts), "prompt_tokens": len(ids), "passes": passes}


def load_prompts(path: str) -> dict:
    return json.loads(Path(path).read_text())


def write_result(path: str, data: dict) -> None:
    data.setdefault("peak_rss_mib", round(peak_rss_mib(), 1))
    Path(path).write_text(json.dumps(data, indent=1))


def speed_and_agreement(args, load: Callable[[], object], timed, greedy) -> dict:
    """The common body of the run-* steps: load, greedy agreement, speed."""
    prompts = load_prompts(args.prompts)
    start = time.perf_counter()
    handle = load()
    out = {"load_s": time.perf_counter() - start}
    if args.agree_tokens:
        out["greedy"] = [greedy(handle, p["ids"], args.agree_tokens) for p in prompts["agreement"]]
    if args.passes:
        out.update(measure(lambda ids, n: timed(handle, ids, n), prompts["speed"]["ids"],
                           args.new_tokens, args.passes))
    return out


# ----------------------------------------------------------------------------- project venv steps


def add_field(writer, name: str, field, value) -> None:
    """A GGUF metadata field written as ``value``, with the type (and array item type) it was
    read with."""
    import gguf

    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(name, value, vtype, sub_type=sub)


def hf_convert(args) -> None:
    """The GGUF file -> a Hugging Face folder (fp32 safetensors + tokenizer files)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(args.gguf)
    out = Path(args.out)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # transformers 5 refuses to save a model loaded from GGUF while its quantizer bookkeeping
    # is attached; the weights are already dequantized to fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    write_result(args.result, {"hf_folder": str(out)})


# Full-size shapes with random weights (--shape): a Qwen3 config each, the released model's
# numbers. Qwen3-1.7B: hidden 2048, 28 layers, 16 query / 8 KV heads of 128, FFN 6144, vocab
# 151,936, tied embeddings, bf16 as released.
SHAPES = {
    "qwen3-1.7b": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=6144,
                       vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, max_position_embeddings=40960),
}


def random_hf(args) -> None:
    """A Hugging Face folder of a Qwen3 of ``--shape`` with transformers' own random
    initialization (normal, std 0.02; norms 1), seeded, saved in bf16, with the tokenizer files
    of ``--src`` (SmolLM2's: its ids are all below the shape's vocabulary, so the same prompt ids
    serve every system)."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    src, out = Path(args.src), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = json.loads((src / "generation_config.json").read_text()) \
        if (src / "generation_config.json").is_file() else {}
    cfg = Qwen3Config(**SHAPES[args.shape], bos_token_id=gen.get("bos_token_id"),
                      eos_token_id=gen.get("eos_token_id"))
    torch.manual_seed(int(args.seed))
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    model.save_pretrained(out)
    for f in src.iterdir():  # the tokenizer's files and its chat template, not the model's
        if f.is_file() and not f.name.startswith(".") and f.suffix != ".safetensors" \
                and f.name not in ("config.json", "generation_config.json",
                                   "model.safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    params = sum(t.numel() for t in model.parameters())
    write_result(args.result, {"hf_folder": str(out), "parameters": params})


def hf_gguf(args) -> None:
    """A Qwen3 Hugging Face folder -> an F32 GGUF for llama.cpp (its ``qwen3`` architecture), the
    tensors renamed by gguf-py's own name map, no permutation (llama.cpp's Qwen3 is NeoX RoPE, as
    its converter writes it), tied embeddings as token_embd only; the vocabulary is
    ``--vocab-gguf``'s (SmolLM2's tokenizer) padded with unused tokens to the config's size, as
    llama.cpp's converter pads a tokenizer smaller than the embedding. Written streaming."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    src, out = Path(args.src), Path(args.out)
    cfg = json.loads((src / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    arch = gguf.MODEL_ARCH.QWEN3
    names = gguf.get_tensor_name_map(arch, n)
    tmp = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(f"random {args.shape or 'qwen3'}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(n)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    # (transformers 5 writes the base under rope_parameters)
    writer.add_rope_freq_base(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    vocab = cfg["vocab_size"]
    reader = gguf.GGUFReader(args.vocab_gguf)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            if len(value) > vocab:
                raise SystemExit(f"{args.vocab_gguf}: {len(value)} tokens, more than the "
                                 f"{vocab} rows of {src / 'config.json'}'s vocab_size")
            value = value + [f"[PAD{i}]" for i in range(len(value), vocab)]
        elif key == "tokenizer.ggml.token_type":
            value = value + [int(gguf.TokenType.UNUSED)] * (vocab - len(value))
        elif key == "tokenizer.ggml.scores":
            value = value + [0.0] * (vocab - len(value))
        add_field(writer, key, field, value)
    index = src / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) \
        if index.is_file() else ["model.safetensors"]
    handles = [safe_open(str(src / name), framework="pt") for name in files]
    tensors = []
    for h in handles:
        for key in h.keys():
            if key == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                continue
            name = names.get_name(key, try_suffixes=(".weight", ".bias"))
            if name is None:
                raise SystemExit(f"{src}: no GGUF name for tensor {key}")
            shape = tuple(h.get_slice(key).get_shape())
            tensors.append((h, key))
            writer.add_tensor_info(name, shape, np.dtype(np.float32),
                                   int(np.prod(shape, dtype=np.int64)) * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for h, key in tensors:
        writer.write_tensor_data(h.get_tensor(key).float().numpy())
    writer.close()
    tmp.rename(out)
    write_result(args.result, {"gguf": str(out), "tensors": len(tensors)})


# The projections of a Llama-style checkpoint that a Q4_1 GGUF stores in 4 bits.
OFF_GRID_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj")


def off_grid(args) -> None:
    """A Hugging Face folder whose 4-bit projections are moved off their Q4_1 grid, like a float
    checkpoint: each weight gets Gaussian noise of ``--noise`` times its block's Q4_1 step
    (block max - min over 15, blocks of 32 along the input dimension), seeded. Other tensors
    (norms, the Q8_0 embedding) are copied unchanged."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src, out = Path(args.src), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and not f.name.startswith("."):
            shutil.copy2(f, out / f.name)
    g = torch.Generator().manual_seed(int(args.seed))
    moved = 0
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(f)
        for name in sorted(tensors):
            w = tensors[name]
            if name.split(".")[-2] not in OFF_GRID_PROJECTIONS or w.shape[-1] % 32:
                continue
            blocks = w.float().reshape(w.shape[0], -1, 32)
            step = (blocks.amax(-1) - blocks.amin(-1)) / 15
            noise = torch.randn(blocks.shape, generator=g) * float(args.noise) * step[..., None]
            tensors[name] = (blocks + noise).reshape(w.shape).to(w.dtype).contiguous()
            moved += 1
        save_file(tensors, out / f.name, metadata={"format": "pt"})
    write_result(args.result, {"hf_folder": str(out), "moved_tensors": moved,
                               "noise": float(args.noise), "seed": int(args.seed)})


AGREEMENT_PROMPTS = [
    # (name, text, use the chat template)
    ("factual", "What is the capital of France, and what is the city famous for?", True),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False),
    ("story", "Once upon a time, in a small village at the edge of a great forest,", False),
]

# Teacher-forced fidelity (besides the three agreement prompts): plain text openings of varied kinds.
# Every system is fed transformers fp32's own greedy continuation of each, and at every position
# its next-token distribution is compared with transformers' (KL divergence, top-1 match): a
# measure of quantization error that a single near-tie cannot flip, unlike free-running agreement.
FIDELITY_TEXTS = [
    "The history of the Roman Empire begins",
    "Photosynthesis is the process by which",
    "To install Python on Linux, first",
    "My favourite recipe for pancakes needs",
    "In mathematics, a prime number",
    "The stock market fell sharply today because",
    "Dear hiring manager, I am writing to",
    "import numpy as np\n\ndef softmax(x):",
    "The three laws of motion state that",
    "Climate change affects coastal cities by",
    "Once the spaceship landed on Mars,",
    "A good night's sleep helps the brain",
]

SPEED_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press into a system that could "
    "produce books far faster than any scribe. Within a few decades, printing shops had spread "
    "across Europe, from Venice to London, and the price of books fell sharply. Scholars could now "
    "compare identical copies of a text, which changed how knowledge was checked and shared. "
    "Pamphlets carried news and arguments to readers who had never owned a book before, and "
    "literacy rose in the cities first, then in the countryside. Printers standardised spelling "
    "and grammar, often without meaning to, simply by choosing one form and repeating it in "
    "thousands of copies. Maps, scientific tables and musical scores could be reproduced without "
    "the errors that hand copying introduced, so astronomers and navigators worked from the same "
    "numbers. Governments and churches soon tried to control what was printed, licensing presses "
    "and banning books, but the sheer number of presses made censorship difficult. By the end of "
    "the sixteenth century, millions of volumes were in circulation, and the way people learned, "
    "argued and remembered had changed for good."
)


def make_prompts(args) -> None:
    """Token ids of the agreement prompts and of the speed prompt, with the model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.hf)
    agreement = []
    for name, text, chat in AGREEMENT_PROMPTS:
        if chat:
            ids = tok.apply_chat_template([{"role": "user", "content": text}],
                                          add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = tok.encode(text, add_special_tokens=False)
        agreement.append({"name": name, "text": text, "chat_template": chat,
                          "ids": [int(i) for i in ids]})
    speed = tok.encode(SPEED_TEXT, add_special_tokens=False)
    while len(speed) < args.prompt_len:
        speed = speed + speed
    speed = [int(i) for i in speed[:args.prompt_len]]
    fidelity = [{"name": f"text{i + 1}", "text": t, "ids": tok.encode(t, add_special_tokens=False)}
                for i, t in enumerate(FIDELITY_TEXTS)]
    data = {"agreement": agreement, "fidelity": fidelity,
            "speed": {"text": tok.decode(speed), "ids": speed}}
    Path(args.result).write_text(json.dumps(data, indent=1))


def f32_gguf(args) -> None:
    """A GGUF with the source's metadata and every tensor dequantized to F32."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(args.src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(args.out, arch)
    skip = {"general.architecture", "general.file_type", "general.quantization_version"}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in skip:
            continue
        add_field(writer, name, field, field.contents())
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape.tolist())]  # GGML order -> numpy order
        writer.add_tensor(t.name, data.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    write_result(args.result, {"gguf": args.out, "tensors": len(reader.tensors)})


def hf_eager_fp32(model: str, threads: int):
    """transformers eager fp32 with ``threads`` torch threads: the reference model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def run_transformers(args) -> None:
    """transformers eager fp32 from the HF folder: the reference of greedy agreement."""
    import torch

    def load():
        return hf_eager_fp32(args.model, args.threads)

    @torch.inference_mode()
    def timed(model, ids, n):
        t0 = time.perf_counter()
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        t_prefill = time.perf_counter() - t0
        tokens = [int(out.logits[0, -1].argmax())]
        t_first = time.perf_counter() - t0
        past = out.past_key_values
        for _ in range(n - 1):
            out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
        return {"t_prefill": t_prefill, "t_first": t_first, "t_end": time.perf_counter() - t0,
                "tokens": tokens}

    def greedy(model, ids, n):
        return timed(model, ids, n)["tokens"]

    out = speed_and_agreement(args, load, timed, greedy)
    out.update(threads=args.threads, torch=torch.__version__)
    write_result(args.result, out)


def run_ours(args) -> None:
    """Our runtime through its public Python API: greedy tokens (end-of-sequence ignored), then
    one generation of the speed prompt, so this process's peak RSS is that of loading the model
    and generating (`llm-onnx bench` also allocates a buffer to measure memory bandwidth)."""
    from llm_onnx.runtime import Model

    prompts = load_prompts(args.prompts)
    model = Model.load(args.model)
    greedy = [list(model.generate(p["ids"], max_new_tokens=args.agree_tokens, temperature=0,
                                  ignore_eos=True).token_ids)
              for p in prompts["agreement"]] if args.agree_tokens else []
    model.generate(prompts["speed"]["ids"], max_new_tokens=args.new_tokens, temperature=0,
                   ignore_eos=True)
    write_result(args.result, {"greedy": greedy})


def run_ours_speed(args) -> None:
    """Stand-in for `llm-onnx bench` while that command does not exist: Model.generate's own
    timings, same prompt ids, one warm-up, --passes passes. Same JSON keys where it can."""
    from llm_onnx.runtime import Model

    prompts = load_prompts(args.prompts)
    ids = prompts["speed"]["ids"]
    start = time.perf_counter()
    model = Model.load(args.model)
    load_s = time.perf_counter() - start

    def gen():
        return model.generate(ids, max_new_tokens=args.new_tokens, temperature=0, ignore_eos=True)

    gen()
    runs = [gen().timings for _ in range(args.passes)]
    from llm_onnx.model_folder import read_manifest

    manifest = read_manifest(Path(args.model))
    threads = getattr(getattr(model.engine, "runtime", None), "threads", None)
    write_result(args.result, {
        "source": "fallback: Model.generate timings (llm-onnx bench not available)",
        "ttft_s": stats([t.ttft_s for t in runs]),
        "prefill_tok_s": stats([t.prefill_tok_s for t in runs]),
        "decode_tok_s": stats([t.decode_tok_s for t in runs]),
        "load_s": load_s, "weight_bytes": manifest.weights.bytes,
        "decode_ceiling_tok_s": None, "threads": threads,
    })


# ------------------------------------------------------------------------ onnxruntime-genai venv


def linked_genai_folder(src: Path, dst: Path, **session_options) -> Path:
    """``dst``: the files of onnxruntime-genai's folder ``src`` as symlinks, and a copy of its
    genai_config.json with ``session_options`` set (threads, profiling). Standard library only:
    compare_peers imports it too."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ("genai_config.json", ".bench-stamp.json"):
            (dst / f.name).symlink_to(f.resolve())
    cfg = json.loads((src / "genai_config.json").read_text())
    cfg["model"]["decoder"].setdefault("session_options", {}).update(session_options)
    (dst / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    return dst


def genai_generator(model, ids: list[int], n: int, min_length: int = 0):
    """An og.Generator for greedy search over ``ids`` plus ``n`` tokens, batch 1."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n, min_length=min_length, do_sample=False,
                              batch_size=1)
    return og.Generator(model, params)


def run_genai(args) -> None:
    """onnxruntime-genai: og.Model, og.Generator; append_tokens runs the prefill, each
    generate_next_token picks a token (and, from the second on, first runs the model on the last
    one)."""
    import numpy as np
    import onnxruntime_genai as og

    prompts = load_prompts(args.prompts)
    longest = max([len(prompts["speed"]["ids"]) + args.new_tokens]
                  + [len(p["ids"]) + args.agree_tokens for p in prompts["agreement"]])

    def timed(model, ids, n):
        # min_length keeps end-of-sequence from stopping the run early (like ignore_eos)
        g = genai_generator(model, ids, n, min_length=len(ids) + n)
        t0 = time.perf_counter()
        g.append_tokens(np.asarray(ids, dtype=np.int32))
        t_prefill = time.perf_counter() - t0
        g.generate_next_token()
        tokens = [int(g.get_next_tokens()[0])]
        t_first = time.perf_counter() - t0
        while len(tokens) < n and not g.is_done():
            g.generate_next_token()
            tokens.append(int(g.get_next_tokens()[0]))
        return {"t_prefill": t_prefill, "t_first": t_first, "t_end": time.perf_counter() - t0,
                "tokens": tokens}

    def greedy(model, ids, n):
        # argmax of the logits, fed back with append_tokens: end-of-sequence is just a token
        g = genai_generator(model, ids, n)
        g.append_tokens(np.asarray(ids, dtype=np.int32))
        tokens = []
        for i in range(n):
            tokens.append(int(np.argmax(g.get_logits()[0, -1])))
            if i < n - 1:
                g.append_tokens(np.asarray([tokens[-1]], dtype=np.int32))
        return tokens

    out = speed_and_agreement(args, lambda: og.Model(args.model), timed, greedy)
    cfg = json.loads((Path(args.model) / "genai_config.json").read_text())
    out.update(threads=cfg["model"]["decoder"].get("session_options", {}).get(
        "intra_op_num_threads", "default"), onnxruntime_genai=og.__version__, max_length=longest,
        weight_bytes=sum(f.stat().st_size for f in Path(args.model).iterdir()
                         if f.name.endswith((".onnx", ".onnx.data"))))  # (stat follows links)
    write_result(args.result, out)


def profile_genai(args) -> None:
    """ONNX Runtime's profiler on onnxruntime-genai's session (its genai_config.json
    ``session_options.enable_profiling``, set in a folder of links to the model): one warm-up
    generation of 2 tokens, then one of ``--new-tokens`` (a prefill and the decode steps), the
    same runs as `llm-onnx bench --profile`. The trace is written when the model is released;
    compare_peers summarises it."""
    import glob
    import tempfile

    import numpy as np
    import onnxruntime_genai as og

    ids = load_prompts(args.prompts)["speed"]["ids"]
    work = Path(tempfile.mkdtemp(prefix="genai-profile-"))
    prefix = work / "trace"
    linked = linked_genai_folder(Path(args.model), work / "model", enable_profiling=str(prefix))
    model = og.Model(str(linked))
    for n in (2, args.new_tokens):
        g = genai_generator(model, ids, n, min_length=len(ids) + n)
        g.append_tokens(np.asarray(ids, dtype=np.int32))
        for _ in range(n):
            if g.is_done():
                break
            g.generate_next_token()
        del g
    del model
    traces = sorted(glob.glob(f"{prefix}*.json"))
    if not traces:
        raise SystemExit(f"onnxruntime-genai wrote no profile under {work}")
    write_result(args.result, {"trace": traces[-1], "runs": args.new_tokens})


# ----------------------------------------------------------------------------- fidelity


def fidelity_prompts(prompts: dict) -> list[list[int]]:
    """The agreement prompts, then the fidelity texts (their token ids)."""
    return [p["ids"] for p in prompts["agreement"]] + [p["ids"] for p in prompts.get("fidelity", [])]


def log_softmax(x):
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def reference(args) -> None:
    """transformers eager fp32: the greedy continuation of every fidelity prompt (end-of-sequence
    ignored) and the log-probabilities at each of its positions, saved to --out (.npz)."""
    import numpy as np
    import torch

    model = hf_eager_fp32(args.model, args.threads)
    paths, logprobs = [], []
    with torch.inference_mode():
        for ids in fidelity_prompts(load_prompts(args.prompts)):
            out = model(input_ids=torch.tensor([ids]), use_cache=True)
            rows, path = [], []
            for i in range(args.agree_tokens):
                logits = out.logits[0, -1].float().numpy()
                rows.append(log_softmax(logits).astype(np.float32))
                path.append(int(logits.argmax()))
                if i < args.agree_tokens - 1:
                    out = model(input_ids=torch.tensor([[path[-1]]]),
                                past_key_values=out.past_key_values, use_cache=True)
            paths.append(path)
            logprobs.append(np.stack(rows))
    np.savez(args.out, paths=np.array(paths, dtype=np.int64), logprobs=np.stack(logprobs))
    write_result(args.result, {"prompts": len(paths), "tokens": args.agree_tokens})


def forced_fidelity(args, next_logits) -> None:
    """Feed each prompt, then transformers' path token by token; ``next_logits(prompt_ids, path)``
    yields the logits before each path token. Writes KL(transformers || system) averaged over the
    positions and how many positions pick transformers' token (top-1)."""
    import numpy as np

    ref = np.load(args.reference)
    prompts = fidelity_prompts(load_prompts(args.prompts))
    kl, top1, n, per_prompt = 0.0, 0, 0, []
    for ids, path, ref_lp in zip(prompts, ref["paths"], ref["logprobs"]):
        path = [int(t) for t in path]
        matches = 0
        for i, logits in enumerate(next_logits(ids, path)):
            lp = log_softmax(logits)
            p = np.exp(ref_lp[i].astype(np.float64))
            kl += float((p * (ref_lp[i] - lp)).sum())
            hit = int(np.argmax(logits)) == path[i]
            top1 += hit
            matches += hit
            n += 1
        per_prompt.append(matches)
    write_result(args.result, {"fidelity": {"kl_mean": kl / n, "top1": top1, "positions": n,
                                            "top1_per_prompt": per_prompt}})


def fidelity_ours(args) -> None:
    import numpy as np
    from llm_onnx.runtime import Model

    engine = Model.load(args.model).engine

    def next_logits(ids, path):
        cache = engine.new_cache(1, len(ids) + len(path))
        logits = engine.prefill(cache, 0, ids)
        for i, tok in enumerate(path):
            yield logits
            if i < len(path) - 1:
                logits = engine.decode(cache, np.array([tok]))[0]

    forced_fidelity(args, next_logits)


def fidelity_genai(args) -> None:
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(args.model)

    def next_logits(ids, path):
        g = genai_generator(model, ids, len(path))
        g.append_tokens(np.asarray(ids, dtype=np.int32))
        for i, tok in enumerate(path):
            yield np.array(g.get_logits()[0, -1], dtype=np.float32)
            if i < len(path) - 1:
                g.append_tokens(np.asarray([tok], dtype=np.int32))

    forced_fidelity(args, next_logits)


def fidelity_llama(args) -> None:
    import llama_cpp
    import numpy as np

    prompts = fidelity_prompts(load_prompts(args.prompts))
    # logits_all: llama-cpp-python only copies logits out (to Llama.scores) with it
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=max(len(p) for p in prompts) + 64,
                          n_threads=args.threads, n_threads_batch=args.threads, logits_all=True,
                          verbose=False)

    def next_logits(ids, path):
        llm.reset()
        llm.eval(ids)
        for i, tok in enumerate(path):
            yield np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            if i < len(path) - 1:
                llm.eval([tok])

    forced_fidelity(args, next_logits)


# ------------------------------------------------------------------------- llama-cpp-python venv


def llama_quantize(args) -> None:
    """llama.cpp's own quantizer: f32 GGUF -> q8_0 (or another llama_ftype)."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.ftype.upper()}")
    params.nthread = args.threads
    rc = llama_cpp.llama_model_quantize(args.src.encode(), args.out.encode(),
                                        ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize returned {rc}")
    write_result(args.result, {"gguf": args.out, "ftype": args.ftype})


def run_llama(args) -> None:
    """llama.cpp through llama-cpp-python: Llama.reset, Llama.eval (prefill / one token),
    Llama.sample(temp=0) (greedy). Token ids go straight in, so no BOS is added."""
    import llama_cpp

    prompts = load_prompts(args.prompts)
    n_ctx = max([len(prompts["speed"]["ids"]) + args.new_tokens]
                + [len(p["ids"]) + args.agree_tokens for p in prompts["agreement"]])

    def load():
        return llama_cpp.Llama(model_path=args.model, n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                               n_threads=args.threads, n_threads_batch=args.threads,
                               verbose=False)

    def timed(llm, ids, n):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t_prefill = time.perf_counter() - t0
        tokens = [int(llm.sample(temp=0.0, repeat_penalty=1.0))]
        t_first = time.perf_counter() - t0
        for _ in range(n - 1):
            llm.eval([tokens[-1]])
            tokens.append(int(llm.sample(temp=0.0, repeat_penalty=1.0)))
        return {"t_prefill": t_prefill, "t_first": t_first, "t_end": time.perf_counter() - t0,
                "tokens": tokens}

    def greedy(llm, ids, n):
        return timed(llm, ids, n)["tokens"]

    out = speed_and_agreement(args, load, timed, greedy)
    out.update(threads=args.threads, llama_cpp_python=llama_cpp.__version__, n_ctx=n_ctx,
               weight_bytes=os.path.getsize(args.model))
    write_result(args.result, out)


# ----------------------------------------------------------------------------- report


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


# ----------------------------------------------------------------------------- entry point


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="step", required=True)

    def step(name, func, *opts):
        sp = sub.add_parser(name)
        sp.set_defaults(func=func)
        sp.add_argument("--result", required=name not in ("plot",))
        for opt in opts:
            kind = int if opt in ("--prompt-len", "--threads", "--passes", "--new-tokens",
                                  "--agree-tokens") else str
            sp.add_argument(opt, type=kind, required=opt not in ("--threads", "--title"))
        return sp

    run_opts = ("--model", "--prompts", "--passes", "--new-tokens", "--agree-tokens", "--threads")
    step("hf-convert", hf_convert, "--gguf", "--out")
    step("off-grid", off_grid, "--src", "--out", "--noise", "--seed")
    step("prompts", make_prompts, "--hf", "--prompt-len")
    step("f32-gguf", f32_gguf, "--src", "--out")
    step("random-hf", random_hf, "--src", "--out", "--shape", "--seed")
    step("hf-gguf", hf_gguf, "--src", "--vocab-gguf", "--out", "--shape")
    step("run-transformers", run_transformers, *run_opts)
    step("run-ours", run_ours, "--model", "--prompts", "--agree-tokens", "--new-tokens")
    step("run-ours-speed", run_ours_speed, "--model", "--prompts", "--passes", "--new-tokens")
    step("run-genai", run_genai, "--model", "--prompts", "--passes", "--new-tokens",
         "--agree-tokens")
    step("llama-quantize", llama_quantize, "--src", "--out", "--ftype", "--threads")
    step("run-llama", run_llama, *run_opts)
    step("reference", reference, "--model", "--prompts", "--agree-tokens", "--out", "--threads")
    fid_opts = ("--model", "--prompts", "--reference", "--threads")
    step("fidelity-ours", fidelity_ours, *fid_opts)
    step("fidelity-genai", fidelity_genai, *fid_opts)
    step("fidelity-llama", fidelity_llama, *fid_opts)
    step("profile-genai", profile_genai, "--model", "--prompts", "--new-tokens")
    step("plot", plot, "--src", "--out", "--title")
    args = p.parse_args()
    if getattr(args, "threads", None) is None:
        args.threads = 2
    args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""The worker's timed steps, one per system, each in the venv that has its packages:
transformers and llm-onnx (the project's venv), onnxruntime-genai (its venv: run, profile) and
llama.cpp (llama-cpp-python's venv: run, quantize). Every step drives its system through the same
timing loop (benchmarks.core.timing) on the same prompt ids."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchmarks.core.env import linked_genai_folder
from benchmarks.core.timing import stats
from benchmarks.peers.harness import load_prompts, speed_and_agreement, write_result


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
    the peer comparison summarises it."""
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

"""Teacher-forced fidelity: transformers fp32 writes its greedy continuation of every fidelity
prompt with its log-probabilities; each system is fed the same tokens and reports
KL(transformers || system) and top-1 matches per position."""

from __future__ import annotations

from benchmarks.peers.harness import load_prompts, write_result
from benchmarks.peers.runs import genai_generator, hf_eager_fp32


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

"""The systems of `python -m benchmarks.fidelity.answers`, each answering the same prompt ids:
a greedy answer per prompt (stopped at an end-of-sequence id or the token limit) and, teacher
forced along the reference's answers, the log-probabilities of every position. transformers
and llm-onnx run in the project's venv (in the caller's process); llama.cpp runs here as a
child in llama-cpp-python's venv:

    python -m benchmarks.fidelity.answer_runs llama --model F.gguf --job JOB.json --out OUT.npz

JOB.json holds the prompts' ids, the forced paths, the end-of-sequence ids and the token limit.
Only the standard library is imported at module level (each system imports what it needs), so
the module runs in every venv.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class Stepper(Protocol):
    """One system, token by token: ``start`` runs a prompt (the cache sized for ``capacity``
    tokens in all) and returns the logits after it; ``step`` feeds one token and returns the
    logits after it."""

    def start(self, ids: list[int], capacity: int): ...

    def step(self, token: int): ...


def log_softmax(x):
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def greedy_answer(system: Stepper, ids: list[int], eos: Sequence[int], limit: int) -> list[int]:
    """Greedy decoding: the argmax (ties to the lowest id) until an end-of-sequence id (kept)
    or ``limit`` tokens."""
    import numpy as np

    logits = system.start(ids, len(ids) + limit)
    out: list[int] = []
    while True:
        out.append(int(np.argmax(logits)))
        if out[-1] in eos or len(out) >= limit:
            return out
        logits = system.step(out[-1])


def forced_logprobs(system: Stepper, ids: list[int], path: list[int]):
    """Log-probabilities (len(path), V) before each token of ``path``, fed after ``ids``."""
    import numpy as np

    logits = system.start(ids, len(ids) + len(path))
    rows = []
    for i, token in enumerate(path):
        rows.append(log_softmax(logits).astype(np.float32))
        if i < len(path) - 1:
            logits = system.step(token)
    return np.stack(rows)


def answer_all(system: Stepper, job: dict, answers: bool = True, forced: bool = True) -> dict:
    """Every prompt's greedy answer (``answers``) and the log-probabilities along its forced
    path (``forced``: the prompts' "path"), concatenated in prompt order."""
    import numpy as np

    out: dict = {}
    if answers:
        out["answers"] = [greedy_answer(system, p["ids"], job["eos"], job["max_new_tokens"])
                          for p in job["prompts"]]
    if forced:
        out["logprobs"] = np.concatenate([forced_logprobs(system, p["ids"], p["path"])
                                          for p in job["prompts"]])
    return out


# ----------------------------------------------------------------------------- systems


class Transformers:
    """transformers eager fp32 over its KV cache (the reference)."""

    def __init__(self, hf_folder: Path, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            hf_folder, dtype=torch.float32, attn_implementation="eager").eval()

    def _run(self, ids: list[list[int]], past=None):
        with self.torch.inference_mode():
            out = self.model(input_ids=self.torch.tensor(ids), past_key_values=past,
                             use_cache=True)
        self.past = out.past_key_values
        return out.logits[0, -1].float().numpy()

    def start(self, ids, capacity):
        return self._run([ids])

    def step(self, token):
        return self._run([[token]], self.past)


class Ours:
    """llm-onnx's engine: a prefill, then one decode step per token, as Model.generate runs
    (greedy answers themselves come from Model.generate: see answers.py)."""

    def __init__(self, folder: Path, threads: int) -> None:
        from llm_onnx.runtime import Model

        self.engine = Model.load(folder, provider="cpu", threads=threads).engine

    def start(self, ids, capacity):
        self.cache = self.engine.new_cache(1, capacity)
        return self.engine.prefill(self.cache, 0, ids)

    def step(self, token):
        import numpy as np

        return self.engine.decode(self.cache, np.array([token]))[0]


class Llama:
    """llama.cpp through llama-cpp-python: ids go in as they are (no BOS added); greedy is the
    argmax of its logits, as its greedy sampler picks."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int) -> None:
        import llama_cpp

        # logits_all: llama-cpp-python copies logits out (Llama.scores) only with it
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, logits_all=True, verbose=False)

    def _logits(self):
        import numpy as np

        return np.array(self.llm.scores[self.llm.n_tokens - 1], dtype=np.float32)

    def start(self, ids, capacity):
        self.llm.reset()
        self.llm.eval(ids)
        return self._logits()

    def step(self, token):
        self.llm.eval([token])
        return self._logits()


def save(out: Path, result: dict) -> None:
    """One system's answers and forced log-probabilities (.npz; answers as JSON text)."""
    import numpy as np

    arrays = {"answers": np.array(json.dumps(result.get("answers", [])))}
    if "logprobs" in result:
        arrays["logprobs"] = result["logprobs"]
    np.savez(out, **arrays)


def load(path: Path) -> dict:
    import numpy as np

    with np.load(path) as data:
        out = {"answers": json.loads(str(data["answers"]))}
        if "logprobs" in data:
            out["logprobs"] = data["logprobs"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system", choices=["llama"])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--job", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    job = json.loads(args.job.read_text())
    longest = max(len(p["ids"]) + max(job["max_new_tokens"], len(p["path"]))
                  for p in job["prompts"])
    save(args.out, answer_all(Llama(args.model, args.threads, longest + 16), job))


if __name__ == "__main__":
    main()

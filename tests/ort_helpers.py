"""Run an exported model folder's graphs directly with ONNX Runtime (independent of our runtime
package), and transformers references per row."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch


class Graphs:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.manifest = json.loads((self.folder / "manifest.json").read_text())
        kv = self.manifest["kv_cache"]
        self.layers, self.kv_heads, self.head_dim = kv["num_layers"], kv["num_key_value_heads"], kv["head_dim"]
        self.kv_dtype = {"float16": np.float16, "int8": np.int8}.get(kv["dtype"], np.float32)
        # linear-attention layers (Qwen3.5): a conv and a recurrent state instead of keys and values
        self.state = self.manifest.get("recurrent_state")
        self.linear = set(self.state["layers"]) if self.state else set()
        # Gemma 4: KV-shared layers own no buffer; full layers' buffers have their own shape
        shared = {int(i) for i in (kv.get("sources") or {})}
        self.owners = [i for i in range(self.layers) if i not in shared]
        kv_layers = kv.get("layers") or [i for i in self.owners if i not in self.linear]
        self.shapes = {i: tuple(s) for i, s in zip(kv_layers, kv.get("shapes") or [])}
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if os.environ.get("PYTEST_XDIST_WORKER"):
            so.intra_op_num_threads = 1  # two workers on two cores (tests/conftest.py)
        self.sessions = {g: ort.InferenceSession(str(self.folder / f"{g}.onnx"), so,
                                                 providers=["CPUExecutionProvider"])
                         for g in ("prefill", "decode")}

    def new_cache(self, batch: int, length: int) -> list[np.ndarray]:
        out = []
        for i in self.owners:
            if i in self.linear:
                out += [np.zeros((batch, *self.state[k]), np.float32)
                        for k in ("conv_shape", "recurrent_shape")]
            else:
                heads, head_dim = self.shapes.get(i, (self.kv_heads, self.head_dim))
                out += [np.zeros((batch, heads, length, head_dim), self.kv_dtype)
                        for _ in range(2)]
        return out

    def run(self, graph: str, ids: np.ndarray, seqlens: list[int], total: int, cache: list[np.ndarray],
            valid: list[int] | None = None):
        """``valid``: how many new tokens of each row advance the linear-attention states (default:
        a right-padded first prompt's lengths, else every new token)."""
        feed = {"input_ids": ids.astype(np.int64), "seqlens_k": np.array(seqlens, np.int32),
                "total_sequence_length": np.array(total, np.int32)}
        for j, i in enumerate(self.owners):
            names = ("past_state.{}.conv", "past_state.{}.recurrent") if i in self.linear else \
                ("past_key_values.{}.key", "past_key_values.{}.value")
            feed[names[0].format(i)] = cache[2 * j]
            feed[names[1].format(i)] = cache[2 * j + 1]
        if self.linear:
            t = ids.shape[1]
            if valid is None:
                valid = [n + 1 for n in seqlens] if total == t else [t] * len(seqlens)
            feed["valid_tokens"] = np.array(valid, np.int32)
        out = self.sessions[graph].run(None, feed)
        # (Gemma 4: its shared layers' presents are their source's buffer again; not a past)
        return out[0], [o for i, o in enumerate(out[1:]) if i // 2 in self.owners]

    def greedy(self, prompt: list[int], steps: int) -> list[int]:
        cache = self.new_cache(1, len(prompt) + steps + 1)
        logits, cache = self.run("prefill", np.array([prompt]), [len(prompt) - 1], len(prompt), cache)
        out = [int(logits[0, -1].argmax())]
        for i in range(steps - 1):
            n = len(prompt) + i + 1
            logits, cache = self.run("decode", np.array([[out[-1]]]), [n - 1], n, cache)
            out.append(int(logits[0, -1].argmax()))
        return out


def batch_logits(graphs: Graphs, rows: list[list[int]], prompt_lens: list[int], steps: int):
    """Prefill each row's prompt as one right-padded batch, then feed each row's own next tokens
    (teacher forcing) through decode.onnx; returns per-step logits (B, V) as float32."""
    b, t = len(rows), max(prompt_lens)
    ids = np.zeros((b, t), np.int64)
    for i, n in enumerate(prompt_lens):
        ids[i, :n] = rows[i][:n]
    cache = graphs.new_cache(b, t + steps + 1)
    logits, cache = graphs.run("prefill", ids, [n - 1 for n in prompt_lens], t, cache)
    out = [logits[:, -1].astype(np.float32)]
    seqlens = list(prompt_lens)
    for step in range(steps):
        nxt = np.array([[rows[i][seqlens[i]]] for i in range(b)])
        total = max(seqlens) + 1
        logits, cache = graphs.run("decode", nxt, seqlens, total, cache)
        out.append(logits[:, -1].astype(np.float32))
        seqlens = [n + 1 for n in seqlens]
    return out


def hf_logits(hf_model, rows: list[list[int]], prompt_lens: list[int], steps: int):
    """transformers' logits at the same positions, each row run alone (no padding involved)."""
    vocab = hf_model.config.get_text_config().vocab_size  # (a multimodal config: its text one)
    out = [np.zeros((len(rows), vocab), np.float32) for _ in range(steps + 1)]
    with torch.no_grad():
        for i, row in enumerate(rows):
            full = hf_model(torch.tensor([row[: prompt_lens[i] + steps]])).logits[0].float().numpy()
            for s in range(steps + 1):
                out[s][i] = full[prompt_lens[i] - 1 + s]
    return out


def fidelity(want: list[np.ndarray], got: list[np.ndarray], margin: float) -> dict[str, float]:
    """How close ``got`` logits are to the reference ``want`` (lists of (B, V) per step): the mean
    KL(p_want || p_got), and top-1 agreement counted only where the reference's top-2 margin
    exceeds ``margin`` (a near-tie may flip under any rounding; a clear choice must not)."""
    kls, clear, agree = [], 0, 0
    for w, g in zip(want, got):
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        lw = w64 - np.logaddexp.reduce(w64, axis=-1, keepdims=True)
        lg = g64 - np.logaddexp.reduce(g64, axis=-1, keepdims=True)
        kls.extend((np.exp(lw) * (lw - lg)).sum(-1).tolist())
        top2 = np.sort(w64, axis=-1)[:, -2:]
        sure = top2[:, 1] - top2[:, 0] > margin
        clear += int(sure.sum())
        agree += int((sure & (w64.argmax(-1) == g64.argmax(-1))).sum())
    return {"kl": float(np.mean(kls)), "clear": clear, "agree": agree,
            "top1_clear": agree / clear if clear else 1.0}

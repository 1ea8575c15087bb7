"""The parity gate: run the exported graphs in ONNX Runtime (CPU) against the torch decoder.

The torch side is the export form of the decoder (same modules, reference ops) holding the
tensors read back from weights.data, so the comparison isolates the graphs and their kernels.
Prompts of several lengths go through prefill.onnx as one right-padded batch, then a few greedy
steps through decode.onnx. Models too large to run twice in memory are checked on their first
layers and the first rows of the vocabulary, exported the same way into a scratch folder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from llm_onnx.build_model.decoder import Decoder
from llm_onnx.errors import ParityError
from llm_onnx.export.weights import StoredTensor
from llm_onnx.runtime import names

PROMPT_LENGTHS = (11, 7, 4)
DECODE_STEPS = 4


@dataclass(frozen=True)
class Thresholds:
    relative_logits: float  # max|diff| / max(1, max|logits|)
    kl: float  # mean KL(torch || ORT) over compared positions


FP32 = Thresholds(relative_logits=1e-4, kl=1e-6)
FP16 = Thresholds(relative_logits=2e-2, kl=2e-3)
# Quantized weights with fp32 activations: the same dequantized math, summed in another order.
QUANT_EXACT = Thresholds(relative_logits=1e-3, kl=1e-5)
# int8 activations (accuracy_level 4, and QMoE's 8-bit path always) add rounding noise of their
# own; a layout or packing bug still shows as a KL of whole nats.
QUANT_INT8_ACTIVATIONS = Thresholds(relative_logits=0.15, kl=0.05)


def thresholds(precision: str, accuracy_level: int, int8_activations_anyway: bool) -> Thresholds:
    if precision == "fp32":
        return FP32
    if precision == "fp16":
        return FP16
    if accuracy_level == 4 or int8_activations_anyway:
        return QUANT_INT8_ACTIVATIONS
    return QUANT_EXACT


def load_stored(model: Decoder, data_file: Path, tensors: dict[str, StoredTensor]) -> Decoder:
    """Fill a meta-device export-form decoder with the tensors stored in ``data_file``."""
    raw = np.memmap(data_file, dtype=np.uint8, mode="r")
    for name, st in tensors.items():
        arr = np.array(raw[st.offset:st.offset + st.length]).view(st.dtype).reshape(st.shape)
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        t = torch.from_numpy(arr)
        if attr in module._buffers:
            module._buffers[attr] = t
        else:
            setattr(module, attr, torch.nn.Parameter(t, requires_grad=False))
    if model.config.tie_word_embeddings and hasattr(model.lm_head, "weight") and \
            isinstance(model.lm_head.weight, torch.nn.Parameter) and \
            model.lm_head.weight.is_meta:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p = torch.log_softmax(torch.from_numpy(p_logits).double(), -1)
    q = torch.log_softmax(torch.from_numpy(q_logits).double(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def prompts(vocab_size: int, seed: int = 1234) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, n).tolist() for n in PROMPT_LENGTHS]


def compare(folder: Path, reference: Decoder, limits: Thresholds, vocab_limit: int | None = None,
            ) -> dict:
    """Run prefill + greedy decode steps in ORT and torch; return the parity report."""
    import onnxruntime as ort

    cfg = reference.config
    vocab = min(cfg.vocab_size, vocab_limit or cfg.vocab_size)
    batch = prompts(vocab)
    lens = [len(p) for p in batch]
    b, t = len(batch), max(lens)
    max_len = t + DECODE_STEPS + 1
    ids = np.zeros((b, t), dtype=np.int64)
    for i, p in enumerate(batch):
        ids[i, :len(p)] = p
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sessions = {g: ort.InferenceSession(str(folder / f"{g}.onnx"), so,
                                        providers=["CPUExecutionProvider"])
                for g in ("prefill", "decode")}
    cache_t = reference.new_cache(b, max_len)
    cache_o = [c.numpy().copy() for c in cache_t]

    def run(graph: str, tokens: np.ndarray, seqlens: list[int], total: int):
        feed = {names.INPUT_IDS: tokens, names.SEQLENS_K: np.array(seqlens, dtype=np.int32),
                names.TOTAL_SEQUENCE_LENGTH: np.array(total, dtype=np.int32)}
        for i in range(cfg.num_hidden_layers):
            feed[names.PAST_KEY.format(i)] = cache_o[2 * i]
            feed[names.PAST_VALUE.format(i)] = cache_o[2 * i + 1]
        return sessions[graph].run(None, feed)

    report = {"prompts": len(batch), "prompt_lengths": lens, "decode_steps": DECODE_STEPS}
    max_diff = max_logit = kv_diff = 0.0
    kls: list[float] = []
    agree = total_tokens = 0
    with torch.no_grad():
        out_t = reference(torch.from_numpy(ids), torch.tensor([n - 1 for n in lens], dtype=torch.int32),
                          torch.tensor(t, dtype=torch.int32), *cache_t, last_only=True)
    out_o = run("prefill", ids, [n - 1 for n in lens], t)
    seqlens = list(lens)
    for step in range(DECODE_STEPS + 1):
        lt = out_t[0][:, -1, :vocab].float().numpy()
        lo = out_o[0][:, -1, :vocab].astype(np.float32)
        if not np.all(np.isfinite(lo)):
            raise ParityError(f"ONNX Runtime produced inf/NaN logits at step {step}.")
        max_diff = max(max_diff, float(np.abs(lt - lo).max()))
        max_logit = max(max_logit, float(np.abs(lt).max()))
        kls.append(_kl(lt, lo))
        for row in range(b):
            n = seqlens[row]
            d = np.abs(out_t[1].float().numpy()[row, :, :n] - out_o[1].astype(np.float32)[row, :, :n]).max()
            kv_diff = max(kv_diff, float(d))
        top_t, top_o = lt.argmax(-1), lo.argmax(-1)
        agree += int((top_t == top_o).sum())
        total_tokens += b
        if step == DECODE_STEPS:
            break
        nxt = top_t[:, None].astype(np.int64)  # both sides continue with torch's greedy token
        cache_t = list(out_t[1:])
        cache_o = list(out_o[1:])
        total = max(seqlens) + 1
        with torch.no_grad():
            out_t = reference(torch.from_numpy(nxt), torch.tensor(seqlens, dtype=torch.int32),
                              torch.tensor(total, dtype=torch.int32), *cache_t)
        out_o = run("decode", nxt, seqlens, total)
        seqlens = [n + 1 for n in seqlens]
    report.update(
        logits_max_abs_diff=max_diff,
        logits_max_abs=max_logit,
        relative_logits_diff=max_diff / max(1.0, max_logit),
        kl_divergence=float(np.mean(kls)),
        greedy_agreement=agree / total_tokens,
        present_kv_max_abs_diff=kv_diff,
    )
    report["thresholds"] = {"relative_logits": limits.relative_logits, "kl": limits.kl}
    if report["relative_logits_diff"] > limits.relative_logits or report["kl_divergence"] > limits.kl \
            or not math.isfinite(report["kl_divergence"]):
        raise ParityError(
            f"ONNX vs torch: logits max|diff| {max_diff:.3g} "
            f"(relative {report['relative_logits_diff']:.3g} > {limits.relative_logits:g}?), "
            f"KL {report['kl_divergence']:.3g} (limit {limits.kl:g}), present KV max|diff| {kv_diff:.3g}.")
    return report

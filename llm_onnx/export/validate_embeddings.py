"""The parity gate of an embedding model's folder: embed.onnx on the gate's prompts as one
right-padded batch against the torch EmbeddingDecoder run on each prompt alone (so padding is
checked too), held to the text gate's relative limit (validate.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from llm_onnx import model_folder as names
from llm_onnx.errors import ParityError
from llm_onnx.export.validate import PROMPT_LENGTHS, Thresholds, _batch, prompts
from llm_onnx.modeling.decoder import Decoder


def run_reference_embeddings(reference: Decoder, vocab: int) -> np.ndarray:
    """Torch (an EmbeddingDecoder): each prompt alone, unpadded; (B, E) float32."""
    rows = []
    with torch.no_grad():
        for prompt in prompts(vocab):
            ids = torch.tensor([prompt], dtype=torch.int64)
            rows.append(reference(ids, torch.tensor([len(prompt)], dtype=torch.int32))[0])
    return torch.stack(rows).float().numpy()


def run_onnx_embeddings(folder: Path, vocab: int) -> np.ndarray:
    """ORT: embed.onnx on the prompts as one right-padded batch; (B, E) float32."""
    import onnxruntime as ort

    ids, lens = _batch(vocab)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(str(folder / names.EMBED), so,
                                   providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {names.INPUT_IDS: ids,
                                names.SEQUENCE_LENGTHS: np.array(lens, dtype=np.int32)})
    if not np.all(np.isfinite(out)):
        raise ParityError("ONNX Runtime produced inf/NaN embeddings.")
    return out.astype(np.float32)


def compare_embeddings(reference: np.ndarray, onnx: np.ndarray, limits: Thresholds) -> dict:
    """The parity report of embed.onnx: the largest difference relative to the embeddings'
    range (held to the logits' relative limit) and the lowest cosine similarity of a row (held
    to 1 minus that limit); ParityError beyond them."""
    diff = float(np.abs(reference - onnx).max())
    relative = diff / max(1.0, float(np.abs(reference).max()))
    norms = np.linalg.norm(reference, axis=-1) * np.linalg.norm(onnx, axis=-1)
    cosine = float(((reference * onnx).sum(-1) / np.maximum(norms, 1e-12)).min())
    if not relative <= limits.relative_logits or not cosine >= 1 - limits.relative_logits:
        raise ParityError(f"ONNX vs torch: embeddings max|diff| {diff:.3g} (relative "
                          f"{relative:.3g}, limit {limits.relative_logits:g}), lowest cosine "
                          f"{cosine:.6f} (limit {1 - limits.relative_logits:g}).")
    return {"prompts": len(PROMPT_LENGTHS), "prompt_lengths": list(PROMPT_LENGTHS),
            "decode_steps": 0, "embeddings_max_abs_diff": diff, "embeddings_min_cosine": cosine,
            "thresholds": {"relative_embeddings": limits.relative_logits,
                           "cosine": 1 - limits.relative_logits}}

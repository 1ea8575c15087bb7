"""The parity gate's image half (a folder that takes images): vision.onnx against the torch
tower on test images of two shapes, then a prompt with an image through prefill.onnx and a few
decode.onnx steps, the image's embeddings from each side's own tower, against the torch
decoder. The figures are held to the text gate's limits (validate.py); the pixels are seeded
noise, the prompt random text around the image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from llm_onnx import model_folder as names
from llm_onnx.errors import ParityError
from llm_onnx.export import quant
from llm_onnx.export.validate import (
    DECODE_STEPS,
    Thresholds,
    _Steps,
    compare_logits,
    new_states,
    text_only_inputs,
)
from llm_onnx.modeling.decoder import Decoder, owned_states
from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig
from llm_onnx.modeling.vision_tower import patch_inputs

# the test images, by the tower's kind: Qwen (t, h, w) patch grids (tokens of 2 x 2 patches),
# a wide one, then a tall one; Gemma 3 how many images one run takes (each image_size square);
# Gemma 4 (rows, columns) of patches (tokens of k x k patches)
GRIDS = {"qwen_vl": ((1, 4, 6), (1, 6, 2)), "gemma3": ((1,), (2,)),
         "gemma4": ((2, 3), (3, 1))}
TEXT_BEFORE, TEXT_AFTER = 5, 4  # random text tokens around the prompt's image


def _test_image(vision: AnyVisionConfig, grid: tuple[int, ...], seed: int) -> dict:
    """vision.onnx's inputs for a seeded image of ``grid`` (GRIDS; pixels in [-1, 1], as
    normalised pixels are, or [0, 1] for Gemma 4)."""
    rng = np.random.default_rng(seed)
    if vision.kind == "gemma3":
        s = vision.image_size
        pixels = rng.uniform(-1, 1, (grid[0], vision.num_channels, s, s))
        return {names.PIXEL_VALUES: pixels.astype(np.float32)}
    if vision.kind == "gemma4":
        k = vision.pooling_kernel_size
        rows, cols = grid[0] * k, grid[1] * k
        y, x = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        return {names.PIXEL_VALUES: rng.uniform(0, 1, (rows * cols, vision.patch_width)).astype(
                    np.float32),
                names.PIXEL_POSITION_IDS: np.stack([x.ravel(), y.ravel()], -1).astype(np.int64)}
    n = grid[0] * grid[1] * grid[2]
    pixels = rng.uniform(-1, 1, (n, vision.patch_width))
    index, weight, cos, sin = patch_inputs(vision, grid)
    return {names.PIXEL_VALUES: pixels.astype(np.float32), names.POSITION_INDEX: index.numpy(),
            names.POSITION_WEIGHT: weight.numpy(), names.ROTARY_COS: cos.numpy(),
            names.ROTARY_SIN: sin.numpy()}


def _session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def compare_images(decoder: Decoder, tower: nn.Module, folder: Path, kv_dtype: np.dtype,
                   limits: Thresholds, strict: bool = True) -> dict:
    """The image half of the parity report (see the module docstring)."""
    vision = tower.config
    session = _session(folder / names.VISION)
    worst, ours, theirs = 0.0, [], []
    with torch.no_grad(), quant.dequantized_once():
        for k, grid in enumerate(GRIDS[vision.kind]):
            feed = _test_image(vision, grid, 7 + k)
            got = session.run(None, feed)
            out = tower(*(torch.from_numpy(v) for v in feed.values()))
            want = [t.float().numpy() for t in (out if isinstance(out, tuple) else (out,))]
            for a, b in zip(want, got):
                if not np.all(np.isfinite(b)):
                    raise ParityError("ONNX Runtime produced inf/NaN image embeddings.")
                worst = max(worst, float(np.abs(a - b).max()) / max(1.0, float(np.abs(a).max())))
            ours.append(want)
            theirs.append(got)
    del session
    if not worst <= limits.relative_logits and strict:
        raise ParityError(f"vision.onnx vs torch: image embeddings max|diff| relative {worst:.3g} "
                          f"(limit {limits.relative_logits:g}). The export is refused as broken; "
                          "--allow-parity-failure keeps it anyway, --no-validate skips the check.")
    steps = _prompt_steps(decoder, folder, kv_dtype, ours[0], theirs[0],
                          GRIDS[vision.kind][0])
    report = compare_logits(*steps, limits, "a prompt with an image through ONNX", strict)
    failures = [f"vision.onnx: relative {worst:.3g}"] if worst > limits.relative_logits else []
    return {"vision_relative_diff": worst,
            "image_prompt_kl_divergence": report["kl_divergence"],
            "image_prompt_greedy_agreement": report["greedy_agreement"],
            "failures": failures + [f"image prompt: {f}" for f in report["failures"]]}


def _prompt(vision: AnyVisionConfig, vocab: int, grid: tuple[int, ...], tokens: int):
    """(ids, image span, (3, S) positions or None, next position) of random text around one
    image of ``tokens`` soft tokens."""
    from llm_onnx.runtime.media import mrope_positions  # numpy: the runtime's own rows

    rng = np.random.default_rng(99)
    text = [t for t in rng.integers(0, vocab, TEXT_BEFORE + TEXT_AFTER).tolist()
            if t != vision.image_token_id][:TEXT_BEFORE + TEXT_AFTER - 1]
    ids = text[:TEXT_BEFORE] + [vision.image_token_id] * tokens + text[TEXT_BEFORE:]
    span = (TEXT_BEFORE, TEXT_BEFORE + tokens)
    if not vision.mrope_section:  # Gemma: one position per token
        return np.array([ids], dtype=np.int64), span, None, len(ids)
    m = vision.spatial_merge_size
    positions, nxt = mrope_positions(len(ids), [span], [(grid[0], grid[1] // m, grid[2] // m)])
    return np.array([ids], dtype=np.int64), span, positions, nxt


def _prompt_steps(decoder: Decoder, folder: Path, kv_dtype: np.dtype, torch_image: list,
                  onnx_image: list, grid: tuple[int, ...]) -> tuple[_Steps, _Steps]:
    """The prompt's prefill and DECODE_STEPS greedy steps (torch's picks fed to both)."""
    cfg, vision = decoder.config, decoder.vision
    assert vision is not None
    per_image = torch_image[0].shape[0] // (grid[0] if vision.kind == "gemma3" else 1)
    torch_image = [a[:per_image] for a in torch_image]  # (Gemma 3: the first of the run)
    onnx_image = [a[:per_image] for a in onnx_image]
    ids, (start, stop), positions, nxt = _prompt(vision, cfg.vocab_size, grid, per_image)
    s = ids.shape[1]
    length = s + DECODE_STEPS + 1
    index = np.arange(start, stop, dtype=np.int64)
    attend = bool(decoder.bidirectional)
    until = np.zeros((1, s), np.int64)  # Gemma: the image's tokens see it whole
    until[0, start:stop] = stop - 1

    def image_feed(image: list) -> dict:
        out = {names.IMAGE_EMBEDS: image[0], names.IMAGE_TOKEN_INDEX: index}
        if positions is not None:
            out[names.POSITION_IDS] = positions[:, None, :]
        if vision.deepstack_layers:
            out[names.DEEPSTACK_EMBEDS] = image[1]
        if attend:
            out[names.ATTEND_UNTIL] = until
        return out

    torch_steps, onnx_steps = _Steps([], [], cfg=cfg), _Steps([], [], cfg=cfg)
    fed: list[int] = []
    with torch.no_grad(), quant.dequantized_once():
        cache = decoder.new_cache(1, length)
        feed = {k: torch.from_numpy(np.ascontiguousarray(v))
                for k, v in image_feed(torch_image).items()}
        for step in range(DECODE_STEPS + 1):
            tokens = ids if step == 0 else np.array([[fed[-1]]], dtype=np.int64)
            total = s + step
            out = decoder(torch.from_numpy(tokens), torch.tensor([total - 1], dtype=torch.int32),
                          torch.tensor(total, dtype=torch.int32), *cache, last_only=True,
                          **feed)
            logits = out[0][:, -1].float().numpy()
            torch_steps.logits.append(logits)
            fed.append(int(logits.argmax()))
            cache = decoder.next_cache(out[1:])
            feed = {k: torch.from_numpy(v) for k, v in text_only_inputs(
                vision, cfg.hidden_size, np.array([[nxt + step]]), attend).items()}
    states = new_states(cfg, 1, length, kv_dtype)
    pasts = [p for p, _ in names.state_names(cfg.num_hidden_layers, cfg.linear_layers, [
        i for i in range(cfg.num_hidden_layers) if cfg.is_kv_shared(i)])]
    session = _session(folder / names.PREFILL)
    for step in range(DECODE_STEPS + 1):
        if step == 1:
            session = _session(folder / names.DECODE)
        tokens = ids if step == 0 else np.array([[fed[step - 1]]], dtype=np.int64)
        total = s + step
        feed = {names.INPUT_IDS: tokens, names.SEQLENS_K: np.array([total - 1], np.int32),
                names.TOTAL_SEQUENCE_LENGTH: np.array(total, np.int32),
                **dict(zip(pasts, states)),
                **(image_feed(onnx_image) if step == 0 else text_only_inputs(
                    vision, cfg.hidden_size, np.array([[nxt + step - 1]]), attend))}
        if cfg.linear_layers:
            feed[names.VALID_TOKENS] = np.array([tokens.shape[1]], np.int32)
        out = session.run(None, feed)
        logits = out[0][:, -1].astype(np.float32)
        if not np.all(np.isfinite(logits)):
            raise ParityError("ONNX Runtime produced inf/NaN logits for a prompt with an image.")
        onnx_steps.logits.append(logits)
        states = owned_states(cfg, out[1:])
    return torch_steps, onnx_steps


__all__ = ["compare_images"]

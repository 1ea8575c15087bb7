"""Tiny random Gemma 3 and Gemma 4 multimodal checkpoints (``Gemma3ForConditionalGeneration``,
``Gemma4ForConditionalGeneration``) saved by transformers, the independent reference of the
Gemma image tests, and the inputs both sides take for a prompt with images.

The text models are the presets gemma3_tiny and gemma4_tiny (made dense, as Gemma 4 E2B and E4B
are: its experts are the text tests', and tracing them would only slow each image export), their
weights drawn as tests/hf_models.py draws them; the towers are the smallest that still exercise
every part:

    Gemma 3  SigLIP over 48 x 48 pixels in 8 x 8 patches (a 6 x 6 grid), pooled 2 x 2 to 9
             soft tokens: longer than the text's window of 4, so a sliding layer's window cuts
             into an image's block
    Gemma 4  4 query heads over 2 KV heads, clipped projections, standardized features;
             images of 6 x 9 and 3 x 6 patches (6 and 2 soft tokens), padded to 54 patches
             for transformers (our tower takes each image's own patches)

Token ids (the text vocabulary has 256): 0 pad, 3 begin-of-image, 4 end-of-image, 5 the image's
soft token.

``save_checkpoint(kind, folder)`` writes what a model folder that takes images needs besides:
a word tokenizer with the family's image and turn tokens (names below; 1 eos, 2 bos, 6 and 7
a turn's start and end, 7 also ending an answer), a chat template in the shape of the family's
(tests/fixtures/chat_templates/gemma3_vl.jinja, gemma4_vl.jinja, written for these tests) and
the image processor's config (Gemma 3: 48 x 48 pixels, 9 soft tokens; Gemma 4: 16-pixel
patches pooled 3 x 3, at most 70 soft tokens, so the tower's position table is 224 long).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from llm_onnx.families import get_config
from llm_onnx.families.gemma_vision import gemma3_vision_hf_config, gemma4_vision_hf_config
from llm_onnx.modeling.gemma_vision_config import Gemma3VisionConfig, Gemma4VisionConfig
from tests.hf_models import hf_config_dict, make_hf_model

PAD, BOI, EOI, IMAGE, EOT = 0, 3, 4, 5, 7
TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
SPECIAL = {"gemma3": ["<pad>", "<eos>", "<bos>", "<start_of_image>", "<end_of_image>",
                      "<image_soft_token>", "<start_of_turn>", "<end_of_turn>"],
           "gemma4": ["<pad>", "<eos>", "<bos>", "<|image>", "<image|>", "<|image|>", "<|turn>",
                      "<turn|>"]}
PROCESSORS = {
    "gemma3": {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 48, "width": 48},
               "image_seq_length": 9, "image_mean": [0.5] * 3, "image_std": [0.5] * 3},
    "gemma4": {"image_processor_type": "Gemma4ImageProcessor", "patch_size": 16,
               "max_soft_tokens": 70, "pooling_kernel_size": 3},
}
GEMMA3_VISION = Gemma3VisionConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    image_size=48, patch_size=8, mm_tokens_per_image=9, out_hidden_size=48,
    image_token_id=IMAGE, boi_token_id=BOI, eoi_token_id=EOI, pad_token_id=PAD)
GEMMA4_VISION = Gemma4VisionConfig(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, position_embedding_size=224, use_clipped_linears=True,
    standardize=True, out_hidden_size=48, image_token_id=IMAGE, boi_token_id=BOI,
    eoi_token_id=EOI, pad_token_id=PAD)
GEMMA4_GRIDS = ((6, 9), (3, 6))  # (rows, columns) of patches of the two test images


def _spread_tower(model, prefixes: tuple[str, ...], seed: int) -> None:
    """The vision side's weights, drawn wide enough to expose bugs: norms around 1 (Gemma 3's
    projector norm, 1 + w, around 0), Gemma 4's q/k norms at its unscaled attention's
    temperature, clipping bounds that clip, standardization that shifts and scales."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if not name.startswith(prefixes) or not p.is_floating_point() \
                    or "inv_freq" in name:  # (SigLIP's position_ids, RoPE's frequencies)
                continue
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(p.shape[0] ** -0.25 * (1.0 + 0.2 * noise))
            elif name.endswith("mm_soft_emb_norm.weight"):
                p.copy_(0.2 * noise)
            elif "norm" in name and name.endswith(".weight") or name.endswith("std_scale"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith(("_min", "_max")):  # clip at +-1 (inputs) and +-0.5 (outputs)
                bound = 1.0 if "input" in name else 0.5
                p.fill_(-bound if name.endswith("_min") else bound)
            else:
                p.copy_(0.08 * noise)


def make_gemma3(seed: int = 0):
    """transformers' tiny Gemma3ForConditionalGeneration (text: gemma3_tiny)."""
    import transformers

    cfg = get_config("gemma3_tiny")
    text = make_hf_model(cfg, seed)
    fields = hf_config_dict(cfg)
    fields.pop("architectures")
    fields.update(pad_token_id=PAD, eos_token_id=EOT, bos_token_id=2)
    v = GEMMA3_VISION
    config = transformers.Gemma3Config(
        text_config=fields, vision_config=gemma3_vision_hf_config(v),
        mm_tokens_per_image=v.mm_tokens_per_image, image_token_index=IMAGE,
        boi_token_index=BOI, eoi_token_index=EOI, tie_word_embeddings=cfg.tie_word_embeddings)
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    _spread_tower(model, ("model.vision_tower.", "model.multi_modal_projector."), seed + 7)
    return model


def make_gemma4(seed: int = 0, bidirectional: str | None = "vision"):
    """transformers' tiny Gemma4ForConditionalGeneration (text: gemma4_tiny made dense; its text
    config's use_bidirectional_attention ``bidirectional``), without the audio tower."""
    import transformers

    cfg = get_config("gemma4_tiny").replace(moe=None, enable_moe_block=False)
    text = make_hf_model(cfg, seed)
    fields = hf_config_dict(cfg)
    fields.pop("architectures")
    fields.update(pad_token_id=PAD, eos_token_id=EOT, bos_token_id=2,
                  use_bidirectional_attention=bidirectional)
    config = transformers.Gemma4Config(
        text_config=transformers.Gemma4TextConfig(**fields),
        vision_config=gemma4_vision_hf_config(GEMMA4_VISION), audio_config=None,
        image_token_id=IMAGE, boi_token_id=BOI, eoi_token_id=EOI,
        tie_word_embeddings=cfg.tie_word_embeddings)
    config.architectures = ["Gemma4ForConditionalGeneration"]
    torch.manual_seed(seed)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    missing, unexpected = model.model.language_model.load_state_dict(text.model.state_dict(),
                                                                     strict=False)
    assert not unexpected and not [m for m in missing if not m.endswith("inv_freq")]
    _spread_tower(model, ("model.vision_tower.", "model.embed_vision."), seed + 7)
    return model


def save(model, folder: Path):
    model.generation_config.eos_token_id = EOT
    model.generation_config.pad_token_id = PAD
    model.generation_config.bos_token_id = 2
    model.save_pretrained(folder)  # safetensors
    return model


def save_checkpoint(kind: str, folder: Path, seed: int = 0):
    """A checkpoint of ``kind`` ("gemma3", "gemma4") with its tokenizer, template and image
    processor (see the module docstring); returns the transformers model."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    folder = Path(folder)
    model = save(make_gemma3(seed) if kind == "gemma3" else make_gemma4(seed), folder)
    names = SPECIAL[kind] + ["user", "model", "<unk>"]
    vocab = {**{n: i for i, n in enumerate(names)}, **{f"t{i}": i for i in range(len(names), 256)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in SPECIAL[kind]])
    tok.save(str(folder / "tokenizer.json"))
    template = (TEMPLATES / f"{kind}_vl.jinja").read_text(encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": template, "bos_token": "<bos>", "eos_token": SPECIAL[kind][EOT],
        "pad_token": "<pad>"}), encoding="utf-8")
    (folder / "preprocessor_config.json").write_text(json.dumps(PROCESSORS[kind]),
                                                     encoding="utf-8")
    return model


def hf_pixels(model, processed: list) -> dict:
    """transformers' image inputs of our processed images (equal to its processor's)."""
    if not processed:
        return {}
    pixels = torch.from_numpy(np.stack([p.pixel_values for p in processed]))
    if model.config.model_type == "gemma3":
        return {"pixel_values": pixels}
    return {"pixel_values": pixels, "image_position_ids": torch.from_numpy(
        np.stack([p.patch_positions for p in processed]))}


def hf_image_embeds(model, processed) -> np.ndarray:
    """transformers' soft tokens of one processed image, (N, D)."""
    with torch.no_grad():
        out = model.model.get_image_features(**hf_pixels(model, [processed])).pooler_output
    return torch.as_tensor(out[0] if isinstance(out, (list, tuple)) else out).reshape(
        -1, model.config.get_text_config().hidden_size).numpy()


def hf_greedy(model, ids: list[int], processed: list, max_new_tokens: int) -> list[int]:
    """transformers' greedy answer to ``ids`` with the images ``processed`` (generate(), the
    image tokens marked as the processor marks them: their block attends both ways; it stops
    after EOT)."""
    types = "token_type_ids" if model.config.model_type == "gemma3" else "mm_token_type_ids"
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x),
                             **hf_pixels(model, processed), **{types: (x == IMAGE).long()},
                             max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(ids):].tolist()


def prompt(images: list[int], seed: int = 0) -> list[int]:
    """Token ids: a few words, then per image (its soft-token count) BOI, the soft tokens, EOI
    and a few words."""
    gen = torch.Generator().manual_seed(seed)

    def words(n: int) -> list[int]:
        return torch.randint(6, 256, (n,), generator=gen).tolist()

    ids = [2, *words(3)]
    for count in images:
        ids += [BOI, *[IMAGE] * count, EOI, *words(3)]
    return ids


def gemma3_pixels(count: int, seed: int = 0) -> torch.Tensor:
    """(count, 3, S, S) pixels as the processor leaves them (normalised to [-1, 1])."""
    s = GEMMA3_VISION.image_size
    return torch.rand(count, 3, s, s, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def gemma4_patches(grids=GEMMA4_GRIDS, seed: int = 0):
    """Per image: (patches (N, P*P*3) in [0, 1], positions (N, 2) (x, y)), row-major patches;
    and transformers' batch of them padded to the largest (positions -1)."""
    gen = torch.Generator().manual_seed(seed)
    width = GEMMA4_VISION.patch_width
    own = []
    for rows, cols in grids:
        y, x = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        own.append((torch.rand(rows * cols, width, generator=gen),
                    torch.stack([x.reshape(-1), y.reshape(-1)], -1)))
    most = max(p.shape[0] for p, _ in own)
    pixels = torch.zeros(len(own), most, width)
    positions = torch.full((len(own), most, 2), -1, dtype=torch.int64)
    for i, (p, pos) in enumerate(own):
        pixels[i, :len(p)], positions[i, :len(p)] = p, pos
    return own, pixels, positions

"""Tiny random Qwen3-VL and Qwen3.5 checkpoints with their vision towers, saved by transformers
(the independent reference of the image tests), with what a model folder needs to take images:
a word tokenizer carrying Qwen's image tokens, a ChatML template that writes
``<|vision_start|><|image_pad|><|vision_end|>`` for an image part (tests/fixtures/
chat_templates/qwen_vl.jinja, written for these tests in the shape of Qwen's), and a
preprocessor_config.json whose pixel bounds keep images a few tokens long.

Vocabulary (256 ids):

    0 <|endoftext|>  1 <|im_start|>  2 <|im_end|> (eos)  3 <|vision_start|>  4 <|vision_end|>
    5 <|image_pad|>  6 <|video_pad|>                      special
    7 system  8 user  9 assistant  10 <unk>  11..255 t11 ... t255   words, split on whitespace

    KINDS["qwen3_vl"]     Qwen3VLForConditionalGeneration: DeepStack from both vision blocks
    KINDS["qwen3_5"]      Qwen3_5ForConditionalGeneration: hybrid text layers, no DeepStack
    KINDS["qwen3_5_moe"]  Qwen3_5MoeForConditionalGeneration
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>"]
WORDS = ["system", "user", "assistant", "<unk>"]
EOS, VISION_START, VISION_END, IMAGE_PAD = 2, 3, 4, 5
TEMPLATE = Path(__file__).parent / "fixtures" / "chat_templates" / "qwen_vl.jinja"
# patches of 16, merged 2 x 2: a side of 32 pixels per token row; 2 to 64 tokens
PROCESSOR = {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16,
             "temporal_patch_size": 2, "merge_size": 2,
             "size": {"shortest_edge": 64 * 64, "longest_edge": 256 * 256},
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
              temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
              hidden_act="gelu_pytorch_tanh")
KINDS = {"qwen3_vl": "qwen3_vl_tiny", "qwen3_5": "qwen3_5_tiny",
         "qwen3_5_moe": "qwen3_5_moe_tiny"}


def vocabulary(size: int = 256) -> dict[str, int]:
    names = SPECIAL + WORDS
    return {**{name: i for i, name in enumerate(names)},
            **{f"t{i}": i for i in range(len(names), size)}}


def save_tokenizer(folder: Path, size: int = 256) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocabulary(size), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": TEMPLATE.read_text(encoding="utf-8"), "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}), encoding="utf-8")


def hf_config(kind: str):
    """transformers' config of the tiny multimodal model ``kind``."""
    import transformers

    from llm_onnx.families import family, get_config

    cfg = get_config(KINDS[kind])
    text = family(cfg.architecture).hf_config(cfg)
    if kind == "qwen3_vl":  # the family's config is the multimodal one already
        text = text["text_config"]
    text.pop("architectures", None)
    text.update(eos_token_id=EOS, pad_token_id=0, bos_token_id=None)
    vision = dict(VISION, out_hidden_size=cfg.hidden_size)
    if kind == "qwen3_vl":
        vision["deepstack_visual_indexes"] = [0, 1]
    config_class = {"qwen3_vl": "Qwen3VLConfig", "qwen3_5": "Qwen3_5Config",
                    "qwen3_5_moe": "Qwen3_5MoeConfig"}[kind]
    config = getattr(transformers, config_class)(
        text_config=text, vision_config=vision, image_token_id=IMAGE_PAD,
        video_token_id=6, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        tie_word_embeddings=cfg.tie_word_embeddings)
    config.architectures = [config_class.replace("Config", "ForConditionalGeneration")]
    return config


def make_vision_model(kind: str, seed: int = 0):
    """A transformers model of ``kind`` with random weights spread as tests/hf_models.py
    spreads them (norms around 1, or around 0 where they scale by 1 + w)."""
    import transformers

    from llm_onnx.families import family, get_config

    config = hf_config(kind)
    torch.manual_seed(seed)
    model = getattr(transformers, config.architectures[0])(config).eval()
    offset = family(get_config(KINDS[kind]).architecture).norm_weight_offset
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            text_norm = "norm" in name and name.endswith(".weight") and ".visual." not in name
            vision_norm = ".visual." in name and "norm" in name and name.endswith(".weight")
            if text_norm:
                p.copy_(1.0 - offset + 0.2 * torch.randn(p.shape, generator=gen))
            elif vision_norm:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = 0
    model.generation_config.bos_token_id = None
    return model


def save_vision_checkpoint(kind: str, folder: Path, seed: int = 0):
    """Write the checkpoint (weights, config, tokenizer, template, preprocessor config) into
    ``folder``; returns the transformers model."""
    folder = Path(folder)
    model = make_vision_model(kind, seed)
    model.save_pretrained(folder)
    save_tokenizer(folder, model.config.get_text_config().vocab_size)
    (folder / "preprocessor_config.json").write_text(json.dumps(PROCESSOR), encoding="utf-8")
    return model


def image(height: int, width: int, seed: int) -> np.ndarray:
    """A (height, width, 3) uint8 test picture: noise over a gradient."""
    rng = np.random.default_rng(seed)
    ramp = np.add.outer(np.arange(height), np.arange(width)) * 255 // (height + width)
    noise = rng.integers(0, 256, (height, width, 3))
    return ((ramp[:, :, None] + noise) // 2).astype(np.uint8)


def hf_inputs(ids: list[int], processed: list) -> dict:
    """transformers' generate() inputs for prompt ``ids`` (image tokens expanded) and the
    processed images (our processor's output equals transformers' to the pixel)."""
    out = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids),
                                                                          dtype=torch.long)}
    if processed:
        out["pixel_values"] = torch.from_numpy(np.concatenate([p.pixel_values for p in processed]))
        out["image_grid_thw"] = torch.tensor([p.grid_thw for p in processed])
        out["mm_token_type_ids"] = (out["input_ids"] == IMAGE_PAD).int()
    return out


def hf_greedy(model, ids: list[int], processed: list, max_new_tokens: int) -> list[int]:
    """transformers' greedy answer to ``ids`` with the images ``processed`` (a Gemma model's:
    tests/gemma_vision_models.py)."""
    if model.config.model_type in ("gemma3", "gemma4"):
        from tests import gemma_vision_models

        return gemma_vision_models.hf_greedy(model, ids, processed, max_new_tokens)
    with torch.no_grad():
        out = model.generate(**hf_inputs(ids, processed), max_new_tokens=max_new_tokens,
                             do_sample=False)
    return out[0, len(ids):].tolist()

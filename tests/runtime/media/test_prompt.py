"""The prompt side of images against transformers: a prompt with one and with two images of
different sizes becomes the ids transformers' processor (Qwen3VLProcessor, Gemma4Processor,
Gemma3Processor) makes of the same text and images, the spans are where its token type ids say
the image tokens are, and Qwen's three position rows are what ``get_rope_index`` of a tiny
random Qwen3.5 and Qwen3-VL computes.

The tokenizers are byte-level with each family's image tokens as special tokens (Gemma 3's with
merges that make "\\n\\n" and "\\n\\n\\n" single tokens, as Gemma's vocabulary has them, so the
newlines around its image block can merge with the prompt's). transformers' processors are
built without their video processor (it needs torchvision; the text expansion never uses it)."""

from __future__ import annotations

import numpy as np
import PIL.Image
import pytest

from llm_onnx.errors import ConfigError, MediaError
from llm_onnx.runtime.media import (
    ProcessedImage,
    expand_image_text,
    expand_image_tokens,
    find_image_spans,
    image_processor_from_dict,
    load_image,
    mrope_positions,
)
from tests.runtime.media.reference import (
    CONFIGS,
    byte_tokenizer,
    hf_image_processor,
    hf_tokenizer,
    random_pixels,
)

QWEN_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
               "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
GEMMA4_TOKENS = ["<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|image>", "<image|>",
                 "<|image|>", "<|audio>", "<audio|>", "<|audio|>"]
GEMMA3_TOKENS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                 "<start_of_image>", "<end_of_image>", "<image_soft_token>"]
NEWLINES = (("Ċ", "Ċ"), ("ĊĊ", "Ċ"))  # "\n\n" and "\n\n\n" are tokens
PROMPTS = {
    "qwen3_vl": ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What differs "
                 "here?<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
                 "<|im_start|>assistant\n"),
    "gemma4": "<bos><|turn>user\n<|image|>What differs here?<|image|><turn|>\n<|turn>model\n",
    "gemma3": ("<bos><start_of_turn>user\n<start_of_image>What differs here? "
               "<start_of_image><end_of_turn>\n<start_of_turn>model\n"),
}
IMAGES = [random_pixels(300, 260, 1), random_pixels(70, 500, 2)]  # different sizes and shapes


@pytest.fixture
def hf_processors(monkeypatch):
    """transformers' processor of each family, over our tokenizer (tokenizers.Tokenizer)."""
    import transformers
    from transformers.processing_utils import ProcessorMixin

    # no video processor (torchvision) nor audio feature extractor: skip the type checks
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class",
                        lambda self, name, arg: None)
    qwen = byte_tokenizer(QWEN_TOKENS)
    gemma4 = byte_tokenizer(GEMMA4_TOKENS)
    gemma3 = byte_tokenizer(GEMMA3_TOKENS, merges=NEWLINES)
    return {
        "qwen3_vl": (qwen, transformers.Qwen3VLProcessor(
            image_processor=hf_image_processor(CONFIGS["qwen3_vl"]),
            tokenizer=hf_tokenizer(qwen), video_processor=None)),
        "gemma4": (gemma4, transformers.Gemma4Processor(
            feature_extractor=None, image_processor=hf_image_processor(CONFIGS["gemma4"]),
            tokenizer=hf_tokenizer(gemma4, pad_token="<pad>", boi_token="<|image>",
                                   eoi_token="<image|>", image_token="<|image|>",
                                   boa_token="<|audio>", eoa_token="<audio|>",
                                   audio_token="<|audio|>"),
            video_processor=None)),
        "gemma3": (gemma3, transformers.Gemma3Processor(
            image_processor=hf_image_processor(CONFIGS["gemma3"]),
            tokenizer=hf_tokenizer(gemma3, boi_token="<start_of_image>",
                                   eoi_token="<end_of_image>", image_token="<image_soft_token>"),
            image_seq_length=CONFIGS["gemma3"]["image_seq_length"])),
    }


def ours(family: str, tok, count: int):
    processor = image_processor_from_dict(CONFIGS[family])
    images = [processor(load_image(pixels)) for pixels in IMAGES[:count]]
    layout = processor.token_layout(lambda text: tok.encode(text, add_special_tokens=False).ids)
    return images, layout


def one_image(prompt: str, placeholder: str) -> str:
    first = prompt.index(placeholder) + len(placeholder)
    return prompt[:first] + prompt[first:].replace(placeholder, "", 1).replace(
        "<|vision_start|><|vision_end|>", "")


def hf_ids(processor, text: str, count: int) -> dict:
    images = [PIL.Image.fromarray(p) for p in IMAGES[:count]]
    out = processor(text=[text], images=[images])
    types = out.get("mm_token_type_ids", out.get("token_type_ids"))
    return {"input_ids": np.asarray(out["input_ids"][0]), "types": np.asarray(types[0]),
            "grid": out.get("image_grid_thw")}


def spans_of(types: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], (types > 0).astype(int), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("family", ["qwen3_vl", "gemma4", "gemma3"])
def test_the_text_route_gives_transformers_ids_and_spans(hf_processors, family, count):
    tok, processor = hf_processors[family]
    placeholder = {"qwen3_vl": "<|image_pad|>", "gemma4": "<|image|>",
                   "gemma3": "<start_of_image>"}[family]
    text = PROMPTS[family] if count == 2 else one_image(PROMPTS[family], placeholder)
    want = hf_ids(processor, text, count)
    images, layout = ours(family, tok, count)
    prompt = find_image_spans(tok.encode(expand_image_text(text, images, layout),
                                         add_special_tokens=False).ids, images, layout)
    assert prompt.ids.tolist() == want["input_ids"].tolist()
    assert list(prompt.spans) == spans_of(want["types"])
    assert [stop - start for start, stop in prompt.spans] == [i.num_tokens for i in images]
    if want["grid"] is not None:
        assert [i.grid_thw for i in images] == [tuple(g) for g in want["grid"].tolist()]


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("family", ["qwen3_vl", "gemma4"])
def test_the_token_route_gives_transformers_ids(hf_processors, family, count):
    """Qwen's and Gemma 4's image blocks are special tokens only: expanding the tokenized
    prompt gives the same ids as expanding the text."""
    tok, processor = hf_processors[family]
    placeholder = "<|image_pad|>" if family == "qwen3_vl" else "<|image|>"
    text = PROMPTS[family] if count == 2 else one_image(PROMPTS[family], placeholder)
    want = hf_ids(processor, text, count)
    images, layout = ours(family, tok, count)
    prompt = expand_image_tokens(tok.encode(text, add_special_tokens=False).ids, images, layout)
    assert prompt.ids.tolist() == want["input_ids"].tolist()
    assert list(prompt.spans) == spans_of(want["types"])
    by_text = find_image_spans(prompt.ids, images, layout)
    assert by_text.spans == prompt.spans and np.array_equal(by_text.positions, prompt.positions)


def test_gemma3s_newlines_tokenize_with_the_prompt_only_by_the_text_route(hf_processors):
    """Gemma 3's block brings "\n\n" before and after it: tokenized with the prompt's text,
    as transformers does, "user\n" + "\n\n" is one "\n\n\n" token; expanding ids instead
    keeps "\n" and "\n\n" apart. Same text, same image tokens, other ids: for Gemma 3 the
    text route is the one that matches."""
    tok, processor = hf_processors["gemma3"]
    text = PROMPTS["gemma3"]
    want = hf_ids(processor, text, 2)["input_ids"].tolist()
    images, layout = ours("gemma3", tok, 2)
    by_ids = expand_image_tokens(tok.encode(text, add_special_tokens=False).ids, images, layout)
    three = tok.token_to_id("ĊĊĊ")
    assert three in want and three not in by_ids.ids.tolist()
    assert by_ids.ids.tolist() != want
    assert tok.decode(by_ids.ids.tolist(), skip_special_tokens=False) == tok.decode(
        want, skip_special_tokens=False)
    assert [b - a for a, b in by_ids.spans] == [256, 256]


@pytest.fixture(scope="module")
def rope_models():
    """Tiny random Qwen3.5 and Qwen3-VL (spatial merge 2) whose get_rope_index is the
    reference of the position rows."""
    import transformers

    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
              "out_hidden_size": 32, "patch_size": 16, "spatial_merge_size": 2}
    text = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 16}
    qwen3_5 = transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(
        vision_config=vision, text_config=dict(
            text, layer_types=["full_attention"], linear_num_value_heads=2,
            linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8)))
    qwen3_vl = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(
        vision_config=dict(vision, deepstack_visual_indexes=[0]), text_config=text))
    return {"qwen3_5": qwen3_5.model, "qwen3_vl": qwen3_vl.model}


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("model", ["qwen3_5", "qwen3_vl"])
def test_qwen_position_rows_are_get_rope_index(hf_processors, rope_models, model, count):
    import torch

    tok, processor = hf_processors["qwen3_vl"]
    text = PROMPTS["qwen3_vl"] if count == 2 else one_image(PROMPTS["qwen3_vl"], "<|image_pad|>")
    want = hf_ids(processor, text, count)
    images, layout = ours("qwen3_vl", tok, count)
    prompt = expand_image_tokens(tok.encode(text, add_special_tokens=False).ids, images, layout)
    positions, deltas = rope_models[model].get_rope_index(
        torch.tensor(want["input_ids"])[None], torch.tensor(want["types"])[None],
        image_grid_thw=torch.tensor(want["grid"]))
    assert prompt.positions.shape == (3, len(prompt.ids))
    assert np.array_equal(prompt.positions, positions[:, 0].numpy())
    assert prompt.next_position == len(prompt.ids) + int(deltas[0, 0])
    start, stop = prompt.spans[0]  # text rows equal; the image's rows are its grid
    assert (prompt.positions[:, :start] == np.arange(start)).all()
    _, h, w = images[0].token_grid
    assert prompt.positions[1, start:stop].reshape(h, w)[:, 0].tolist() == list(
        range(start, start + h))
    assert (prompt.positions[:, stop] == start + max(h, w)).all()  # <|vision_end|>


def test_positions_of_text_alone_and_of_other_families():
    assert np.array_equal(mrope_positions(5, [], [])[0], np.tile(np.arange(5), (3, 1)))
    assert mrope_positions(0, [], [])[1] == 0
    image = ProcessedImage(pixel_values=np.zeros(1, np.float32), num_tokens=6, size=(1, 1),
                           image=None, token_grid=(1, 2, 3))
    rows, nxt = mrope_positions(9, [(1, 7)], [image.token_grid])
    assert rows.tolist() == [[0, 1, 1, 1, 1, 1, 1, 4, 5],
                             [0, 1, 1, 1, 2, 2, 2, 4, 5],
                             [0, 1, 2, 3, 1, 2, 3, 4, 5]]
    assert nxt == 6
    tok = byte_tokenizer(GEMMA4_TOKENS)
    processor = image_processor_from_dict(CONFIGS["gemma4"])
    layout = processor.token_layout(lambda t: tok.encode(t, add_special_tokens=False).ids)
    prompt = expand_image_tokens([2, 7, 100], [processor(load_image(IMAGES[1]))], layout)
    assert prompt.positions.tolist() == [list(range(len(prompt.ids)))]
    assert prompt.next_position == len(prompt.ids)
    assert prompt.ids[:2].tolist() == [2, 5] and prompt.ids[-2:].tolist() == [6, 100]


def test_placeholders_and_images_must_agree():
    tok = byte_tokenizer(QWEN_TOKENS)
    processor = image_processor_from_dict(CONFIGS["qwen3_vl"])
    layout = processor.token_layout(lambda t: tok.encode(t, add_special_tokens=False).ids)
    image = processor(load_image(IMAGES[0]))
    with pytest.raises(MediaError, match=r"2 image placeholder\(s\) \(<\|image_pad\|>\) for "
                                         r"1 image\(s\)"):
        expand_image_tokens([5, 9, 5], [image], layout)
    with pytest.raises(MediaError, match="0 image placeholder"):
        expand_image_text("no image here", [image], layout)
    with pytest.raises(MediaError, match="holds 3 <|image_pad|> tokens"):
        find_image_spans([5, 5, 5], [image], layout)
    apart = [5] * (image.num_tokens - 1) + [9, 5]
    with pytest.raises(MediaError, match="not together"):
        find_image_spans(apart, [image], layout)
    no_grid = ProcessedImage(pixel_values=image.pixel_values, num_tokens=4, size=(1, 1),
                             image=None)
    with pytest.raises(MediaError, match="needs its .t, h, w. token grid"):
        expand_image_tokens([5], [no_grid], layout)


def test_a_tokenizer_without_the_image_tokens_is_a_config_error():
    tok = byte_tokenizer(["<pad>"])
    with pytest.raises(ConfigError, match="no single token for '<|image_pad|>'"):
        image_processor_from_dict(CONFIGS["qwen3_vl"]).token_layout(
            lambda t: tok.encode(t, add_special_tokens=False).ids)
    renamed = byte_tokenizer(["<pad>", "<img>"])
    layout = image_processor_from_dict(CONFIGS["qwen3_vl"]).token_layout(
        lambda t: renamed.encode(t, add_special_tokens=False).ids, {"image_token": "<img>"})
    assert (layout.placeholder_id, layout.image_token_id, layout.mrope) == (1, 1, True)

"""Gemma 3 and Gemma 4 take images: tiny random ``...ForConditionalGeneration`` checkpoints saved
by transformers (tests/gemma_vision_models.py) read with their vision side, our towers' soft
tokens equal to transformers' get_image_features, and the decoder's logits for a prompt with
one and with two images (Gemma 4: of different sizes) equal to transformers' forward, whose
mask lets an image's tokens attend to each other both ways (Gemma 3: every layer; Gemma 4 with
use_bidirectional_attention "vision": the sliding layers).

The image prefill writes the same KV cache a text decoder reads: a decode step of the text-only
decoder (GroupQueryAttention, as today's decode graph) after it gives transformers' logits."""

from __future__ import annotations

import pytest
import torch

from llm_onnx.checkpoints import build_model, open_checkpoint
from llm_onnx.checkpoints.vision import build_vision
from llm_onnx.errors import ConfigError
from llm_onnx.families import get_config, load_vision_config, vision_from_hf_config
from llm_onnx.modeling.gemma_vision_config import (
    Gemma3VisionConfig,
    Gemma4VisionConfig,
    vision_config_from_dict,
)
from llm_onnx.modeling.multimodal import image_attend_until
from tests import gemma_vision_models as gv
from tests.tolerances import TORCH_VS_HF_FP32, VISION_TOWER_FP32


@pytest.fixture(scope="module")
def gemma3(vision_checkpoint):
    hf, folder = vision_checkpoint("gemma3")  # (the checkpoint the image exports share)
    return hf, open_checkpoint(folder)


@pytest.fixture(scope="module", params=["vision", None], ids=["bidirectional", "causal"])
def gemma4(request, vision_checkpoint, tmp_path_factory):
    if request.param == "vision":  # the released configs' (and the shared checkpoint's)
        hf, folder = vision_checkpoint("gemma4")
    else:
        folder = tmp_path_factory.mktemp("gemma4_vision")
        hf = gv.save(gv.make_gemma4(seed=2, bidirectional=request.param), folder)
    return hf, open_checkpoint(folder)


def run(model, ids: list[int], embeds: torch.Tensor | None, past: int = 0, cache=None):
    """Our decoder on one row of new tokens ``ids`` after ``past`` cached ones: (logits,
    the next step's cache)."""
    x = torch.tensor([ids])
    t = x.shape[1]
    cache = cache if cache is not None else model.new_cache(1, 64)
    seqlens = torch.tensor([past + t - 1], dtype=torch.int32)
    kwargs = {}
    if embeds is not None:
        kwargs = dict(image_embeds=embeds,
                      image_token_index=(x.flatten() == gv.IMAGE).nonzero().flatten())
    out = model(x, seqlens, torch.tensor(past + t, dtype=torch.int32), *cache, **kwargs)
    return out[0], model.next_cache(out[1:])


def check_decode_after(text_decoder, hf_logits, ids, cache) -> None:
    """One more token through the text-only decoder over the image prefill's cache."""
    logits, _ = run(text_decoder, ids[-1:], None, past=len(ids) - 1, cache=cache)
    assert (logits[0, -1] - hf_logits[0, -1]).abs().max().item() <= TORCH_VS_HF_FP32


# ----------------------------------------------------------------------------- Gemma 3


def test_gemma3_reads_its_vision_side(gemma3):
    hf, ckpt = gemma3
    assert ckpt.vision == gv.GEMMA3_VISION
    # (the multimodal class never soft-caps its logits)
    assert ckpt.config == get_config("gemma3_tiny").replace(final_logit_softcapping=None)


def test_gemma3_soft_tokens_match_transformers(gemma3):
    hf, ckpt = gemma3
    tower = build_vision(ckpt.vision, ckpt.vision_source)
    pixels = gv.gemma3_pixels(2)
    with torch.no_grad():
        want = hf.get_image_features(pixels).pooler_output  # (2, 9, 48)
        got = tower(pixels).reshape(2, 9, 48)  # (images x tokens, D)
    assert want.shape == (2, 9, 48)
    assert (got - want).abs().max().item() <= VISION_TOWER_FP32
    assert want.std().item() > 0.3


@pytest.mark.parametrize("images", [1, 2])
def test_gemma3_logits_with_images_match_transformers(gemma3, images):
    hf, ckpt = gemma3
    cfg = ckpt.config
    ours = build_model(cfg, ckpt.source, vision=ckpt.vision)
    tower = build_vision(ckpt.vision, ckpt.vision_source)
    ids = gv.prompt([ckpt.vision.mm_tokens_per_image] * images, seed=images)
    pixels = gv.gemma3_pixels(images, seed=images)
    x = torch.tensor([ids])
    with torch.no_grad():
        want = hf(input_ids=x, pixel_values=pixels,
                  token_type_ids=(x == gv.IMAGE).long()).logits
        causal = hf(input_ids=x, pixel_values=pixels).logits  # no bidirectional block
        got, cache = run(ours, ids[:-1], tower(pixels).reshape(-1, cfg.hidden_size))
        full, _ = run(ours, ids, tower(pixels).reshape(-1, cfg.hidden_size))
        check_decode_after(build_model(cfg, ckpt.source), want, ids, cache)
    assert (full - want).abs().max().item() <= TORCH_VS_HF_FP32
    assert (got - want[:, :-1]).abs().max().item() <= TORCH_VS_HF_FP32
    assert (want - causal).abs().max().item() > 1e-2  # the mask matters here


# ----------------------------------------------------------------------------- Gemma 4


def test_gemma4_soft_tokens_match_transformers(gemma4):
    hf, ckpt = gemma4
    assert ckpt.vision.replace(bidirectional=None) == gv.GEMMA4_VISION
    tower = build_vision(ckpt.vision, ckpt.vision_source)
    own, pixels, positions = gv.gemma4_patches()
    with torch.no_grad():
        want = hf.model.get_image_features(pixels, positions).pooler_output  # per image
        for (p, pos), w, (rows, cols) in zip(own, want, gv.GEMMA4_GRIDS):
            got = tower(p, pos)
            assert got.shape == w.shape == (rows * cols // 9, 48)
            assert (got - w).abs().max().item() <= VISION_TOWER_FP32
            assert w.std().item() > 0.3


@pytest.mark.parametrize("images", [1, 2])
def test_gemma4_logits_with_images_match_transformers(gemma4, images):
    hf, ckpt = gemma4
    cfg = ckpt.config
    ours = build_model(cfg, ckpt.source, vision=ckpt.vision)
    tower = build_vision(ckpt.vision, ckpt.vision_source)
    grids = gv.GEMMA4_GRIDS[:images]
    own, pixels, positions = gv.gemma4_patches(grids, seed=images)
    ids = gv.prompt([r * c // 9 for r, c in grids], seed=images)
    x = torch.tensor([ids])
    with torch.no_grad():
        want = hf(input_ids=x, pixel_values=pixels, image_position_ids=positions,
                  mm_token_type_ids=(x == gv.IMAGE).long()).logits
        causal = hf(input_ids=x, pixel_values=pixels, image_position_ids=positions).logits
        embeds = torch.cat([tower(p, pos) for p, pos in own])
        full, _ = run(ours, ids, embeds)
        got, cache = run(ours, ids[:-1], embeds)
        check_decode_after(build_model(cfg, ckpt.source), want, ids, cache)
    assert (full - want).abs().max().item() <= TORCH_VS_HF_FP32
    assert (got - want[:, :-1]).abs().max().item() <= TORCH_VS_HF_FP32
    assert want.std().item() > 0.1
    mask_matters = (want - causal).abs().max().item() > 1e-2
    assert mask_matters == (ckpt.vision.bidirectional == "vision")


# ----------------------------------------------------------------------------- graphs


def test_towers_and_the_image_prefill_trace_with_dynamic_shapes():
    """No shape depends on a value: torch.export traces the towers (float, and with their
    projections quantized, --quantize-vision) over any image count (Gemma 3) or patch count
    (Gemma 4: from 2 tokens up, export's 0/1 rule), and the prefill over any prompt and
    image-token count, with attend_until as an input."""
    from torch.export import Dim, export

    from llm_onnx.export import ExportOptions
    from llm_onnx.export.modules import vision_export_form

    int4 = ExportOptions(precision="int4", quantize_vision=True)  # (projections: no .weight)
    with torch.device("meta"):
        for quantized in (False, True):
            towers = [build_vision(v) for v in (gv.GEMMA3_VISION, gv.GEMMA4_VISION)]
            if quantized:
                towers = [vision_export_form(t, int4) for t in towers]
            export(towers[0], (torch.zeros(2, 3, 48, 48),), dynamic_shapes=({0: Dim("images")},))
            n = Dim("patches", min=18)
            export(towers[1], (torch.zeros(54, 48 * 16), torch.zeros(54, 2, dtype=torch.int64)),
                   dynamic_shapes=({0: n}, {0: n}))
    for name, vision in (("gemma3_tiny", gv.GEMMA3_VISION),
                         ("gemma4_tiny", gv.GEMMA4_VISION.replace(bidirectional="vision"))):
        model = build_model(get_config(name), vision=vision, max_positions=64)

        class Prefill(torch.nn.Module):
            def forward(self, ids, seqlens, total, embeds, index, until, *past):
                return model(ids, seqlens, total, *past, image_embeds=embeds,
                             image_token_index=index, attend_until=until)

        with torch.device("meta"):
            past = model.new_cache(1, 64)
            args = (torch.zeros(1, 20, dtype=torch.int64), torch.zeros(1, dtype=torch.int32),
                    torch.tensor(20, dtype=torch.int32), torch.zeros(9, 48),
                    torch.zeros(9, dtype=torch.int64), torch.zeros(1, 20, dtype=torch.int64),
                    *past)
        t, m = Dim("T", min=2, max=64), Dim("M", min=2, max=64)
        export(Prefill(), args, strict=False, dynamic_shapes=(
            {1: t}, None, None, {0: m}, {0: m}, {1: t}, tuple(None for _ in past)))


# ----------------------------------------------------------------------------- inputs, configs


def test_attend_until_reaches_the_end_of_each_image():
    is_image = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0, 0, 0]]).bool()
    positions = torch.arange(8).expand(2, 8) + torch.tensor([[10], [0]])
    got = image_attend_until(is_image, positions)
    assert got.tolist() == [[10, 13, 13, 13, 14, 15, 17, 17], [1, 1, 2, 3, 4, 5, 6, 7]]


# google/gemma-3-4b-it's config.json (text and vision fields left to transformers' defaults)
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                    "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}}


def test_gemma3_released_config_reads_with_transformers_defaults():
    from llm_onnx.families import from_hf_config

    cfg = from_hf_config(GEMMA3_4B)
    assert (cfg.vocab_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == \
        (262_208, 8, 4, 256)
    assert cfg.layer_window(5) is None and cfg.layer_window(0) == 1024
    v = vision_from_hf_config(GEMMA3_4B)
    assert isinstance(v, Gemma3VisionConfig)
    assert (v.patches_per_side, v.tokens_per_side, v.pool_kernel) == (64, 16, 4)
    assert (v.out_hidden_size, v.image_token_id, v.boi_token_id) == (2560, 262_144, 255_999)
    assert v.bidirectional_layers(cfg.layer_types) == tuple(range(34))


def test_gemma4_vision_defaults_and_the_mask_choice(tmp_path):
    data = {"architectures": ["Gemma4ForConditionalGeneration"],
            "text_config": {"hidden_size": 2816, "use_bidirectional_attention": "vision"},
            "vision_config": {"model_type": "gemma4_vision"}}
    v = vision_from_hf_config(data)
    assert isinstance(v, Gemma4VisionConfig)
    assert (v.num_hidden_layers, v.hidden_size, v.patch_size, v.pooling_kernel_size,
            v.out_hidden_size) == (16, 768, 16, 3, 2816)
    assert v.bidirectional_layers(("sliding_attention", "full_attention")) == (0,)
    causal = v.replace(bidirectional=None)
    assert causal.bidirectional_layers(("sliding_attention", "full_attention")) == ()
    data["text_config"]["use_bidirectional_attention"] = "all"
    with pytest.raises(ConfigError, match="use_bidirectional_attention"):
        vision_from_hf_config(data)
    (tmp_path / "config.json").write_text('{"architectures": ["Gemma4ForCausalLM"]}')
    assert load_vision_config(tmp_path) is None  # the text-only class has none


def test_tower_configs_round_trip_through_their_dicts():
    for v in (gv.GEMMA3_VISION, gv.GEMMA4_VISION):
        assert vision_config_from_dict(v.to_dict()) == v
    with pytest.raises(ConfigError, match="Unknown vision kind"):
        vision_config_from_dict({"kind": "llava"})

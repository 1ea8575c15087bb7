"""Gemma 4's released checkpoints are the multimodal class (``Gemma4ForConditionalGeneration``):
text fields under ``text_config``, text weights under ``model.language_model.``, vision and
audio towers beside them (E2B and E4B have both; 26B-A4B and 31B no audio). A tiny one made and
saved (safetensors) with transformers reads as the text model: the config from text_config, the
text weights under their canonical names, the towers skipped by name, and our decoder's logits
equal to transformers' multimodal model's on text ids."""

from __future__ import annotations

import torch
from safetensors import safe_open

from llm_onnx.checkpoints import build_model, open_checkpoint
from llm_onnx.families import get_config
from tests.hf_models import hf_config_dict, make_hf_model
from tests.model.test_parity_hf import run_full
from tests.tolerances import TORCH_VS_HF_FP32

TOWERS = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")


def test_the_multimodal_checkpoint_reads_as_its_text_model(tmp_path):
    import transformers

    cfg = get_config("gemma4_tiny")
    text = make_hf_model(cfg, seed=2)  # the text model, its weights drawn as the tests draw them
    fields = hf_config_dict(cfg)
    fields.pop("architectures")
    fields["pad_token_id"] = 0  # the multimodal forward writes it over media placeholders
    vision = transformers.Gemma4VisionConfig(hidden_size=32, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2,
                                             num_key_value_heads=2, head_dim=16)
    audio = transformers.Gemma4AudioConfig(hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=2,
                                           subsampling_conv_channels=(8, 4), output_proj_dims=32)
    mm_cfg = transformers.Gemma4Config(text_config=transformers.Gemma4TextConfig(**fields),
                                       vision_config=vision, audio_config=audio,
                                       tie_word_embeddings=cfg.tie_word_embeddings)
    mm_cfg.architectures = ["Gemma4ForConditionalGeneration"]
    torch.manual_seed(0)
    mm = transformers.Gemma4ForConditionalGeneration(mm_cfg).eval()
    missing, unexpected = mm.model.language_model.load_state_dict(text.model.state_dict(),
                                                                  strict=False)
    assert not unexpected and not [m for m in missing if not m.endswith("inv_freq")]
    mm.save_pretrained(tmp_path)

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        saved = list(f.keys())
    assert all(n.startswith(("model.language_model.", *TOWERS)) for n in saved), saved
    assert all(any(n.startswith(t) for n in saved) for t in TOWERS)  # every tower is there

    ckpt = open_checkpoint(tmp_path)
    assert ckpt.config == cfg  # from text_config (transformers writes per_layer_config)
    names = set(ckpt.source.names())
    assert not any(n.startswith(TOWERS) for n in names)
    assert names == {n.replace("model.language_model.", "model.", 1) for n in saved
                     if n.startswith("model.language_model.")}
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens_per_layer.weight",
                 "model.layers.1.router.proj.weight"):
        assert torch.equal(ckpt.source.get(name), text.get_parameter(name))

    ours = build_model(ckpt.config, ckpt.source)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = mm(input_ids=ids).logits  # text only through the multimodal class
        assert (want - text(ids).logits).abs().max().item() <= TORCH_VS_HF_FP32
        got = run_full(ours, ids)
    assert (got - want).abs().max().item() <= TORCH_VS_HF_FP32
    assert want.std().item() > 0.1  # the comparison can fail: the logits are far from trivial

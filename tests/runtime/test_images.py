"""Images through the runtime, against transformers: tiny random Qwen3-VL (DeepStack), Qwen3.5
(hybrid layers), Gemma 3 (an image's tokens attend both ways in every layer) and Gemma 4
(variable resolution; both ways in its sliding layers) checkpoints saved by transformers,
exported at fp32 with their vision towers, answer prompts with one image and with two of
different sizes with transformers' greedy tokens (Model.chat, Model.generate, a ChatSession,
the scheduler beside a text-only row); vision.onnx gives transformers' image embeddings; a follow-up turn about the same
picture encodes nothing; two pictures behind the same ids never share a cached prefix."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from llm_onnx.errors import GenerationError, MediaError
from llm_onnx.runtime import Model
from llm_onnx.runtime.chat.image_parts import split_images
from llm_onnx.runtime.generation.scheduler import Scheduler
from llm_onnx.runtime.media import load_image
from tests import gemma_vision_models as gv
from tests.vision_models import VISION_START, hf_greedy, image

KINDS = ["qwen3_vl", "qwen3_5", "gemma3", "gemma4"]
NEW = 8
IMAGES = [image(70, 120, 1), image(150, 60, 2)]  # 2 x 4 and 5 x 2 tokens


@pytest.fixture(scope="module", params=KINDS)
def loaded(request, vision_checkpoint, vision_export):
    hf, _ = vision_checkpoint(request.param)
    return hf, Model.load(vision_export(request.param), speculative="off")


def _message(n: int, text: str = "t20 t30 t40") -> list[dict]:
    parts = [{"type": "image", "image": im} for im in IMAGES[:n]]
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def _expected(hf, model: Model, messages: list[dict]) -> list[int]:
    shown, sources = split_images(messages, model.engine.manifest)
    row = model.image_row(model.encode_chat(model.render_chat(shown)), sources)
    return hf_greedy(hf, row.ids, row.processed, NEW)


@pytest.mark.parametrize("n", [1, 2])
def test_chat_gives_transformers_tokens(loaded, n):
    hf, model = loaded
    # (Gemma 3's chats expand the rendered text, as its processor does; others their ids)
    assert model.image_inputs.by_text == (hf.config.model_type == "gemma3")
    messages = _message(n)
    result = model.chat(messages, max_new_tokens=NEW, temperature=0)
    assert result.token_ids == _expected(hf, model, messages)
    streamed = "".join(model.stream_chat(messages, max_new_tokens=NEW, temperature=0))
    assert streamed == result.text


def test_prefill_chunks_keep_each_image_whole(loaded):
    """Chunks of 8 tokens: Gemma's runs end between images (their tokens see each other both
    ways), Qwen's anywhere; transformers' tokens either way."""
    hf, model = loaded
    shown, sources = split_images(_message(2), model.engine.manifest)
    row = model.image_row(model.encode_chat(model.render_chat(shown)), sources)
    gen = model.generator(model.options(max_new_tokens=NEW, temperature=0), prefill_chunk=8)
    gen.append_tokens(row.ids, images=row)
    for _ in gen.events():
        pass
    assert gen.result().token_ids == hf_greedy(hf, row.ids, row.processed, NEW)


def test_image_url_parts_and_generate(loaded):
    """OpenAI's image_url part (a data: URL) is the same picture; generate() with images and a
    raw prompt puts each image's block before the text."""
    import base64

    import PIL.Image

    hf, model = loaded
    buf = io.BytesIO()
    PIL.Image.fromarray(IMAGES[0]).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "t20 t30 t40"}]}]
    assert model.chat(messages, max_new_tokens=NEW, temperature=0).token_ids == \
        _expected(hf, model, _message(1))
    raw = model.encode("t50 t60")
    got = model.generate(raw, images=[IMAGES[1]], max_new_tokens=NEW, temperature=0)
    row = model.image_row(raw, [(IMAGES[1], "images[0]")])
    assert row.ids[0] == (gv.BOI if hf.config.model_type.startswith("gemma") else VISION_START)
    assert got.token_ids == hf_greedy(hf, row.ids, row.processed, NEW)


def test_vision_onnx_gives_transformers_embeddings(loaded):
    hf, model = loaded
    inputs = model.image_inputs
    for picture in IMAGES:
        processed = inputs.processor(load_image(picture))
        ours = inputs.encoder.encode(processed)
        if hf.config.model_type.startswith("gemma"):
            np.testing.assert_allclose(ours.embeds, gv.hf_image_embeds(hf, processed),
                                       atol=2e-5, rtol=0)
            continue
        with torch.no_grad():
            out = hf.model.visual(torch.from_numpy(processed.pixel_values),
                                  grid_thw=torch.tensor([processed.grid_thw]))
        np.testing.assert_allclose(ours.embeds, out.pooler_output.numpy(), atol=2e-5, rtol=0)
        deep = getattr(out, "deepstack_features", None)
        assert (ours.deepstack is None) == (not deep)
        if deep:
            np.testing.assert_allclose(ours.deepstack, torch.stack(list(deep)).numpy(),
                                       atol=2e-5, rtol=0)


def test_follow_up_turn_encodes_nothing(loaded):
    """A ChatSession's second turn about the same picture reuses the cached prefix (its image
    among it) and runs the tower for nothing."""
    hf, model = loaded
    session = model.chat_session()
    first = session.send([{"type": "image", "image": IMAGES[0]},
                          {"type": "text", "text": "t20 t30"}], max_new_tokens=4, temperature=0)
    encoded = model.engine.vision.encoded
    second = session.send("t40 t41", max_new_tokens=4, temperature=0)
    assert model.engine.vision.encoded == encoded
    messages = session.messages[:-1]
    assert second.token_ids == _expected(hf, model, messages)[:4]
    assert second.timings.prefill_tokens < len(first.token_ids) + 20


def test_scheduler_batches_image_and_text_rows(loaded):
    """Two requests with different pictures behind the same ids, and a text-only one, decode
    together in one scheduler and each gets its tokens alone (no shared prefix)."""
    hf, model = loaded
    rows = []
    for picture in (IMAGES[0], IMAGES[0][::-1].copy()):
        shown, _ = split_images(_message(1), model.engine.manifest)
        ids = model.encode_chat(model.render_chat(shown))
        rows.append(model.image_row(ids, [(picture, "image")]))
    assert rows[0].ids == rows[1].ids
    text = model.encode_chat(model.render_chat([{"role": "user", "content": "t20 t30 t40"}]))
    opts = model.options(max_new_tokens=NEW, temperature=0)
    with Scheduler(model, max_batch=3) as scheduler:
        requests = [scheduler.submit(r.ids, opts, images=r) for r in rows]
        requests.append(scheduler.submit(text, opts))
        got = [r.result(timeout=120).token_ids for r in requests]
        again = scheduler.submit(rows[1].ids, opts, images=rows[1]).result(timeout=120)
    for row, tokens in zip(rows, got):
        assert tokens == hf_greedy(hf, row.ids, row.processed, NEW)
    assert again.token_ids == got[1]
    assert got[2] == hf_greedy(hf, text, [], NEW)


def test_bad_images_are_refused_naming_the_part(loaded):
    hf, model = loaded
    bad = [{"role": "user", "content": [{"type": "text", "text": "t20"},
                                        {"type": "image", "image": b"\x89PNG\r\n\x1a\nbroken"}]}]
    with pytest.raises(MediaError, match=r"messages\[0\]\.content\[1\]"):
        model.chat(bad, max_new_tokens=2)
    remote = [{"role": "user", "content": [{"type": "image_url",
                                            "image_url": {"url": "https://example.com/a.png"}}]}]
    with pytest.raises(MediaError, match=r"messages\[0\]\.content\[0\]"):
        model.chat(remote, max_new_tokens=2)
    if hf.config.model_type == "gemma3":  # 9 tokens an image, whatever its size
        return
    large = np.zeros((256, 256, 3), dtype=np.uint8)  # 64 (Gemma 4: 64) tokens each; of 256
    with pytest.raises(MediaError, match="context"):
        model.chat([{"role": "user", "content": [{"type": "image", "image": large}] * 5}],
                   max_new_tokens=2)


def test_text_only_folder_refuses_images(tiny_export):
    model = Model.load(tiny_export("qwen3_tiny"))
    with pytest.raises(GenerationError, match="takes text only"):
        model.chat(_message(1), max_new_tokens=2)

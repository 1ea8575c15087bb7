"""Images through the CLI (tiny random Qwen3-VL, Gemma 3 and Gemma 4 exported at fp32, the
exports tests/runtime/test_images.py uses, against transformers):
``llm-onnx generate --image`` (repeatable), ``/image PATH`` in ``llm-onnx chat``, and the
text-only folder's refusal."""

from __future__ import annotations

import json

import PIL.Image
import pytest
from click.testing import CliRunner

from llm_onnx.cli import main
from llm_onnx.runtime import Model
from llm_onnx.runtime.chat.image_parts import split_images
from tests.vision_models import hf_greedy, image

PROMPT = "t20 t30 t40"


def run(*args, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = []
    for k, (h, w) in enumerate([(70, 120), (150, 60)]):
        path = tmp_path_factory.mktemp("images") / f"picture{k}.png"
        PIL.Image.fromarray(image(h, w, k + 1)).save(path)
        out.append(path)
    return out


@pytest.fixture(scope="module", params=["qwen3_vl", "gemma3", "gemma4"])
def setup(request, vision_checkpoint, vision_export, files):
    hf, _ = vision_checkpoint(request.param)
    folder = vision_export(request.param)
    return hf, folder, Model.load(folder, speculative="off"), files


def _expected(hf, model, messages, new):
    shown, sources = split_images(messages, model.engine.manifest)
    row = model.image_row(model.encode_chat(model.render_chat(shown)), sources)
    return hf_greedy(hf, row.ids, row.processed, new)


def test_generate_with_images(setup):
    hf, folder, model, files = setup
    result = run("generate", "--model", str(folder), "-q", "--json", "--temperature", "0",
                 "--max-new-tokens", "8", "--image", str(files[0]), "--image", str(files[1]),
                 PROMPT)
    assert result.exit_code == 0, result.output
    content = [{"type": "image", "image": str(f)} for f in files] + [
        {"type": "text", "text": PROMPT}]
    want = _expected(hf, model, [{"role": "user", "content": content}], 8)
    assert json.loads(result.stdout)["token_ids"] == want


def test_chat_image_command(setup):
    hf, folder, model, files = setup
    result = run("chat", "--model", str(folder), "-q", "--temperature", "0",
                 "--max-new-tokens", "6", input=f"/image {files[0]}\n{PROMPT}\nt41\n/exit\n")
    assert result.exit_code == 0, result.output
    session = model.chat_session()  # what the CLI streamed, turn by turn
    first = session.send(PROMPT, images=[str(files[0])], max_new_tokens=6, temperature=0)
    second = session.send("t41", max_new_tokens=6, temperature=0)
    assert result.stdout == f"{first.text}\n{second.text}\n"
    messages = [{"role": "user", "content": [{"type": "image", "image": str(files[0])},
                                             {"type": "text", "text": PROMPT}]}]
    assert first.token_ids == _expected(hf, model, messages, 6)
    messages += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "t41"}]
    assert second.token_ids == _expected(hf, model, messages, 6)
    assert "attached" in result.stderr


def test_text_only_folder_refuses_images(files, tiny_export):
    folder = tiny_export("qwen3_tiny")
    result = run("generate", "--model", str(folder), "-q", "--prompt-ids", "1,2",
                 "--image", str(files[0]))
    assert result.exit_code == 1 and "takes text only" in result.output

"""Images through the server's three APIs, with the official clients: tiny random Qwen3-VL,
Gemma 3 and Gemma 4 exported at fp32 (the exports tests/runtime/test_images.py uses) answer
Chat Completions (image_url data: URLs, detail accepted), the Responses API (input_image) and
Anthropic Messages (base64 image blocks) with transformers' greedy tokens; remote URLs are
refused unless their domain is allowed (then fetched from a server on 127.0.0.1); bad images
get each API's 400 naming the part, and the server keeps serving."""

from __future__ import annotations

import base64
import http.server
import io
import threading

import anthropic
import httpx
import openai
import PIL.Image
import pytest

from llm_onnx.runtime import Model
from llm_onnx.runtime.chat.image_parts import split_images
from tests.serve.conftest import ServerProcess
from tests.vision_models import hf_greedy, image

NEW = 6
PICTURES = [image(70, 120, 1), image(150, 60, 2)]


def png(pixels) -> bytes:
    buf = io.BytesIO()
    PIL.Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def data_url(pixels) -> str:
    return "data:image/png;base64," + base64.b64encode(png(pixels)).decode()


@pytest.fixture(scope="module")
def picture_host():
    """A server on 127.0.0.1 that serves the first picture at /a.png (and redirects /r)."""
    body = png(PICTURES[0])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/r":
                self.send_response(302)
                self.send_header("Location", "/a.png")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


KINDS = ["qwen3_vl", "gemma3", "gemma4"]


@pytest.fixture(scope="module")
def servers(vision_checkpoint, vision_export):
    """``servers(kind)`` -> (transformers model, Model, server) of the kind's export, each
    server started once (Qwen3-VL's allows 127.0.0.1's URLs)."""
    started: dict[str, tuple] = {}

    def get(kind: str):
        if kind not in started:
            hf, _ = vision_checkpoint(kind)
            folder = vision_export(kind)
            proc = ServerProcess(folder, "--max-batch", "3", "--allowed-media-domains",
                                 "127.0.0.1", "--model-name", "m")
            started[kind] = (hf, Model.load(folder, speculative="off"), proc)
        return started[kind]

    yield get
    for _, _, proc in started.values():
        proc.stop()


@pytest.fixture(params=KINDS)
def setup(request, servers):
    return servers(request.param)


@pytest.fixture
def qwen(servers):
    return servers("qwen3_vl")


def expected(hf, model, pictures, text="t20 t30 t40"):
    parts = [{"type": "image", "image": p} for p in pictures] + [{"type": "text", "text": text}]
    shown, sources = split_images([{"role": "user", "content": parts}], model.engine.manifest)
    row = model.image_row(model.encode_chat(model.render_chat(shown)), sources)
    # (the server's text is the streamed detokenization: the word decoder's leading space)
    return " " + model.decode(hf_greedy(hf, row.ids, row.processed, NEW))


def oai(proc):
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_chat_completions_with_images(setup):
    hf, model, proc = setup
    content = [{"type": "image_url", "image_url": {"url": data_url(p), "detail": "low"}}
               for p in PICTURES] + [{"type": "text", "text": "t20 t30 t40"}]
    reply = oai(proc).chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=NEW,
        temperature=0)
    assert reply.choices[0].message.content == expected(hf, model, PICTURES)
    assert reply.usage.prompt_tokens > 2 * 8  # the images' tokens are counted


def test_responses_with_input_image(setup):
    hf, model, proc = setup
    response = oai(proc).responses.create(model="m", input=[{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(PICTURES[1])},
        {"type": "input_text", "text": "t20 t30 t40"}]}], max_output_tokens=NEW, temperature=0)
    assert response.output_text == expected(hf, model, PICTURES[1:])


def test_anthropic_messages_with_image_blocks(setup):
    hf, model, proc = setup
    client = anthropic.Anthropic(base_url=proc.url, api_key="x", max_retries=0, timeout=120)
    blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": data_url(p).split(",", 1)[1]}}
              for p in PICTURES]
    message = client.messages.create(model="m", max_tokens=NEW, extra_body={"temperature": 0},
                                     messages=[
        {"role": "user", "content": blocks + [{"type": "text", "text": "t20 t30 t40"}]}])
    assert "".join(b.text for b in message.content if b.type == "text") == \
        expected(hf, model, PICTURES)


def test_remote_urls_only_from_allowed_domains(qwen, picture_host):
    hf, model, proc = qwen
    client = oai(proc)

    def ask(url):
        return client.chat.completions.create(model="m", max_tokens=NEW, temperature=0,
                                              messages=[{"role": "user", "content": [
                                                  {"type": "image_url", "image_url": {"url": url}},
                                                  {"type": "text", "text": "t20 t30 t40"}]}])

    allowed = ask(picture_host + "/a.png")  # 127.0.0.1 is allowed in this server
    assert allowed.choices[0].message.content == expected(hf, model, PICTURES[:1])
    for url, words in (("https://example.com/a.png", "does not fetch image URLs from"),
                       (picture_host + "/r", "does not follow redirects"),
                       ("file:///etc/passwd", "data:image"),
                       ("/etc/passwd", "data:image")):
        with pytest.raises(openai.BadRequestError) as e:
            ask(url)
        assert words in str(e.value) and "messages[0].content[0]" in str(e.value)


def test_bad_images_are_400s_naming_the_part(qwen):
    _, _, proc = qwen
    broken = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nxx").decode()
    r = httpx.post(proc.url + "/v1/chat/completions", timeout=60, json={
        "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "t20"}, {"type": "image_url", "image_url": {"url": broken}}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1]"
    r = httpx.post(proc.url + "/v1/messages", timeout=60, json={
        "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif",
                                         "data": "bm90IGFuIGltYWdl"}}]}]})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "messages.0.content.0" in r.json()["error"]["message"]
    many = [{"type": "image_url", "image_url": {"url": data_url(PICTURES[0])}}] * 17
    r = httpx.post(proc.url + "/v1/chat/completions", timeout=60, json={
        "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": many}]})
    assert r.status_code == 400 and "at most 16" in r.json()["error"]["message"]
    assert httpx.get(proc.url + "/health", timeout=10).status_code == 200

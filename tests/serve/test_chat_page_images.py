"""The chat page with a model that takes images (tiny random Gemma 3 exported at fp32, the
export tests/runtime/test_images.py uses), in headless Chromium: an image attached with the
file picker and one pasted into the prompt show as thumbnails, go out as image_url parts
holding data: URLs, show in the conversation (loaded under the page's policy), and the answer
is the API's greedy answer to the same message; a second turn sends them again; nothing is
fetched off the server and nothing errs."""

from __future__ import annotations

import base64
import io
import signal

import httpx
import PIL.Image
import pytest

from tests.serve.browser import ChatPage
from tests.serve.conftest import ServerProcess
from tests.vision_models import image

NEW = 6
PASTE = """(b64) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], "pasted.png", {type: "image/png"}));
  const prompt = document.getElementById("prompt");
  prompt.dispatchEvent(new ClipboardEvent("paste", {clipboardData: data, bubbles: true,
                                                    cancelable: true}));
}"""


def png(pixels) -> bytes:
    buf = io.BytesIO()
    PIL.Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def server(vision_export):
    proc = ServerProcess(vision_export("gemma3"), "--max-batch", "1", "--speculative", "off",
                         "--model-name", "m")
    yield proc
    assert proc.stop() in (0, -signal.SIGTERM), proc.output()


def greedy(server, messages: list[dict]) -> str:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": messages, "max_tokens": NEW, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_attach_or_paste_an_image_and_ask_about_it(browser, server, tmp_path):
    chat = ChatPage(browser, server).open()
    bodies: list[dict] = []
    chat.page.on("request", lambda r: r.url.endswith("/v1/chat/completions") and
                 bodies.append(r.post_data_json))
    assert chat.page.is_visible("#attach")  # the card says the model takes images
    chat.settings(temperature=0, max_tokens=NEW)
    picked, pasted = png(image(70, 120, 1)), png(image(150, 60, 2))
    (tmp_path / "picked.png").write_bytes(picked)
    chat.page.set_input_files("#image-file", str(tmp_path / "picked.png"))
    chat.page.evaluate(PASTE, base64.b64encode(pasted).decode())
    chat.page.locator("#attachments img.thumb").nth(1).wait_for()
    chat.page.locator("#attachments .remove").nth(1).wait_for()
    first = chat.ask("t20 t30 t40")
    assert chat.page.is_hidden("#attachments")  # the tray empties into the message

    urls = ["data:image/png;base64," + base64.b64encode(b).decode() for b in (picked, pasted)]
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [
        {"type": "text", "text": "t20 t30 t40"}]
    messages = [{"role": "user", "content": content}]
    assert bodies[0]["messages"] == messages
    assert first.get_attribute("data-state") == "done"
    assert chat.raw(first) == greedy(server, messages)
    shown = chat.page.locator(".msg.user img.thumb")
    assert shown.count() == 2
    assert all(shown.nth(i).evaluate("img => img.complete && img.naturalWidth > 0")
               for i in range(2))  # blob: images load under the policy

    second = chat.ask("t41")  # the images stay in the conversation
    messages += [{"role": "assistant", "content": chat.raw(first)},
                 {"role": "user", "content": "t41"}]
    assert bodies[1]["messages"] == messages
    assert chat.raw(second) == greedy(server, messages)
    assert chat.errors == [] and chat.off_server() == []
    chat.close()

"""The chat page at / of `llm-onnx serve`, in headless Chromium (tests/serve/browser.py), over
the tiny word-level chat model: it loads under its Content-Security-Policy with no console error
and no request off the server; answers stream from /v1/chat/completions and equal the API's
greedy answers, turn after turn; Stop ends the stream and the server frees the row (/metrics);
New conversation starts over; the page's files are the packaged ones and nothing else."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.serve.browser import ChatPage
from tests.serve.conftest import ServerProcess, wait_until

MODEL = "tiny-chat"
WEB = Path(__file__).resolve().parents[2] / "llm_onnx" / "serve" / "web"
SYSTEM = "t5 t6"


@pytest.fixture(scope="module")
def server(chat_model_folder):
    """The page's server: two rows, speculation off."""
    proc = ServerProcess(chat_model_folder, "--max-batch", "2", "--speculative", "off")
    yield proc
    assert proc.stop() in (0, -signal.SIGTERM), proc.output()


@pytest.fixture
def chat(browser, server):
    page = ChatPage(browser, server).open()
    yield page
    page.close()


def greedy(server, messages: list[dict], max_tokens: int) -> str:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def chat_requests(chat: ChatPage) -> list[dict]:
    """The bodies the page sends to /v1/chat/completions, from now on."""
    bodies: list[dict] = []
    chat.page.on("request", lambda r: r.url.endswith("/v1/chat/completions") and
                 bodies.append(r.post_data_json))
    return bodies


def test_the_page_loads_under_its_policy_with_nothing_from_elsewhere(chat):
    headers = chat.response.headers
    assert chat.response.status == 200 and headers["content-type"].startswith("text/html")
    policy = headers["content-security-policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "connect-src 'self'",
                      "require-trusted-types-for 'script'", "trusted-types 'none'",
                      "frame-ancestors 'none'"):
        assert directive in policy
    assert headers["x-content-type-options"] == "nosniff"
    assert chat.page.inner_text("#model-name") == MODEL
    assert chat.page.inner_text("#model-where") == "fp32 on CPU (1 thread) · llm-onnx serve"
    assert f"Chat page: {chat.origin}/" in chat.server.output()  # the address to open
    card = httpx.get(chat.origin + "/v1/models").json()["data"][0]  # what the header shows
    assert {k: card[k] for k in ("id", "precision", "runs_on", "served_by", "reasoning",
                                 "tool_call_format")} == {
        "id": MODEL, "precision": "fp32", "runs_on": "CPU (1 thread)",
        "served_by": "llm-onnx serve", "reasoning": False, "tool_call_format": None}
    chat.page.wait_for_load_state("networkidle")
    assert chat.errors == []
    assert chat.off_server() == []
    paths = {urlsplit(url).path for url in chat.requests}
    assert {"/", "/web/chat.js", "/web/render.js", "/web/images.js", "/web/chat.css",
            "/v1/models"} <= paths
    assert card["modalities"] == ["text"] and chat.page.is_hidden("#attach")  # text only
    # The policy holds in the page: no string becomes HTML or script (Trusted Types with no
    # policy), and nothing loads from another host.
    tries = ["document.body.innerHTML = '<b>x</b>'",
             "document.head.append(Object.assign(document.createElement('script'), "
             "{textContent: 'window.ran = 1'}))"]
    for js in tries:
        assert chat.page.evaluate(f"() => {{ try {{ {js}; return 'ran'; }} "
                                  "catch (e) { return e.name; } }") == "TypeError", js
    chat.page.evaluate("() => { const img = document.createElement('img'); "
                       "img.src = 'http://example.com/x.png'; document.body.append(img); }")
    wait_until(lambda: len(chat.errors) == 3, timeout=5)
    assert "TrustedHTML" in chat.errors[0] and "TrustedScript" in chat.errors[1]
    assert "img-src 'self'" in chat.errors[2]
    assert chat.off_server() == ["http://example.com/x.png"]  # tried, and refused in the page
    assert chat.failed["http://example.com/x.png"] == "csp"


def test_the_files_are_the_packaged_ones_and_nothing_else(server):
    for name, kind in [("chat.js", "text/javascript"), ("render.js", "text/javascript"),
                       ("images.js", "text/javascript"),
                       ("chat.css", "text/css"), ("favicon.svg", "image/svg+xml")]:
        r = httpx.get(f"{server.url}/web/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
        assert r.content == (WEB / name).read_bytes()
        assert "default-src 'none'" in r.headers["content-security-policy"]
    icon = httpx.get(server.url + "/favicon.ico")  # what browsers ask for unprompted
    assert icon.status_code == 200 and icon.content == (WEB / "favicon.svg").read_bytes()
    for path in ("/web/__init__.py", "/web/index.html", "/web/..%2Fapp.py", "/web/nothing.js"):
        r = httpx.get(server.url + path)
        assert r.status_code == 404 and "error" in r.json(), path


# The page's Markdown subset (render.js), run in the page: each text -> the nodes it becomes,
# as [tag, {data-lang or start}, children...] with text nodes as strings.
MARKDOWN = [
    ("Hello <b>world</b>\nsecond line", [["p", "Hello <b>world</b>\nsecond line"]]),
    ("```python\nprint('<b>')\n```\nafter",
     [["pre", {"lang": "python"}, ["code", "print('<b>')"]], ["p", "after"]]),
    ("para\n```js\nlet x = '<script>'",  # a block still streaming: no closing fence yet
     [["p", "para"], ["pre", {"lang": "js"}, ["code", "let x = '<script>'"]]]),
    ("- one\n- **two**\n  more\n* three",
     [["ul", ["li", "one"], ["li", ["strong", "two"], "\nmore"], ["li", "three"]]]),
    ("3. a\n4. b", [["ol", {"start": 3}, ["li", "a"], ["li", "b"]]]),
    ("# Title\ntext with `co*de*` and *em*",
     [["h3", "Title"], ["p", "text with ", ["code", "co*de*"], " and ", ["em", "em"]]]),
    ("> quoted\n> `q`", [["blockquote", ["p", "quoted\n", ["code", "q"]]]]),
    ("<img src=x onerror=alert(1)> **<i>b</i>** [a](javascript:x) ![i](http://x/i.png)",
     [["p", "<img src=x onerror=alert(1)> ", ["strong", "<i>b</i>"],
       " [a](javascript:x) ![i](http://x/i.png)"]]),
]
WALK = """async (texts) => {
  const {renderMarkdown} = await import('./web/render.js');
  const walk = (n) => n.nodeType === Node.TEXT_NODE ? n.data : [n.tagName.toLowerCase(),
    ...(n.dataset && n.dataset.lang ? [{lang: n.dataset.lang}] : []),
    ...(n.start > 1 ? [{start: n.start}] : []), ...Array.from(n.childNodes, walk)];
  return texts.map((text) => Array.from(renderMarkdown(text).childNodes, walk));
}"""


def test_the_markdown_subset_becomes_elements_and_text_only(chat):
    texts = [text for text, _ in MARKDOWN]
    assert chat.page.evaluate(WALK, texts) == [nodes for _, nodes in MARKDOWN]
    assert chat.errors == []


def test_an_answer_streams_the_apis_greedy_answer_and_a_second_turn_continues(chat, server):
    bodies = chat_requests(chat)
    chat.settings(temperature=0, max_tokens=12, system=SYSTEM)
    first = chat.ask("t30 t31 t32")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "t30 t31 t32"}]
    expected = greedy(server, messages, 12)
    assert expected and first.get_attribute("data-state") == "done"
    assert chat.raw(first) == expected
    assert first.locator(".content").text_content() == expected  # plain words: no markup
    assert bodies[0]["stream"] is True and bodies[0]["messages"] == messages
    assert bodies[0]["temperature"] == 0 and bodies[0]["max_tokens"] == 12
    numbers = first.locator(".numbers").inner_text()
    tokens = len(expected.split())
    assert numbers.startswith(f"{tokens} token") and "first token" in numbers, numbers

    second = chat.ask("t40 t41")
    messages += [{"role": "assistant", "content": expected},
                 {"role": "user", "content": "t40 t41"}]
    assert bodies[1]["messages"] == messages
    assert chat.raw(second) == greedy(server, messages, 12)
    assert chat.page.locator(".msg.user").all_inner_texts() == ["You\nt30 t31 t32",
                                                                "You\nt40 t41"]
    assert chat.errors == [] and chat.off_server() == []


def test_stop_ends_the_stream_and_the_server_frees_the_row(browser, chat_model_folder):
    """On a held server (ServerProcess(held=4)) the answer streams its first tokens and then
    cannot go on: it is still streaming when Stop is pressed, however fast the machine."""
    server = ServerProcess(chat_model_folder, "--max-batch", "2", "--speculative", "off",
                           held=4)
    chat = ChatPage(browser, server).open()
    try:
        chat.settings(temperature=0, max_tokens=4000)
        answer = chat.send("t10 t11 t12")
        chat.page.wait_for_function("a => a.querySelector('pre.raw').textContent.length > 0",
                                    arg=answer.element_handle())
        assert answer.get_attribute("data-state") == "streaming"
        assert chat.page.is_visible("#stop") and not chat.page.is_visible("#send")
        assert server.metric("llm_onnx_running_requests") == 1
        chat.page.click("#stop")
        assert chat.wait_done(answer, 10_000) == "stopped"
        # cancelled, and the row freed (the running gauge drops a moment before the count)
        wait_until(lambda: server.metric(
            'llm_onnx_request_finish_total{reason="cancelled"}') == 1
            and server.metric("llm_onnx_running_requests") == 0)
        text = chat.raw(answer)
        time.sleep(0.3)
        assert chat.raw(answer) == text  # nothing more arrives
        assert 0 < len(text.split()) < 4000
        assert "stopped" in answer.locator(".numbers").inner_text()
        assert chat.page.is_visible("#send") and not chat.page.is_visible("#stop")
        assert chat.errors == []
    finally:
        chat.close()
        server.stop()


def test_new_conversation_starts_over(chat):
    bodies = chat_requests(chat)
    chat.settings(temperature=0, max_tokens=4)
    chat.ask("t30 t31")
    chat.page.click("#new-chat")
    assert chat.answers().count() == 0 and chat.page.locator(".msg").count() == 0
    chat.ask("t50")
    assert bodies[-1]["messages"] == [{"role": "user", "content": "t50"}]
    # Shift+Enter is a new line, not a send
    chat.page.fill("#prompt", "t1")
    chat.page.press("#prompt", "Shift+Enter")
    assert chat.page.input_value("#prompt") == "t1\n" and len(bodies) == 2

"""The chat page treats model output as untrusted, and works with --api-key: a tiny model whose
words are HTML and script payloads (``<script>``, ``<img onerror>``, ``<svg onload>``,
``javascript:`` links, markdown around tags) answers through the real server; the page shows
every payload as text, creates no element from it and runs nothing. The page asks for the key,
refuses a wrong one, and keeps the right one for the tab only (sessionStorage)."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.serve.browser import ChatPage
from tests.serve.conftest import CHAT_TEMPLATE, ServerProcess

KEY = "sesame-page"
NAME = "tiny-payloads"
# Word i of the vocabulary, for i in 13..255, is every payload with i in it, starting at a
# different one for each i: whatever the random model says, it says all of them. Words 0..12
# stay t0..t12 (the template's turn markers, the eos t2 and the unknown word t0). Whitespace
# splits words, so no payload holds a space.
PAYLOADS = ["<script>window.__xss={i}</script>", "<img/src=x/onerror=window.__xss={i}>",
            "<svg/onload=window.__xss={i}>", "<iframe/src=javascript:window.__xss={i}>",
            "<a/href=javascript:window.__xss={i}>link{i}</a>", "**<b>{i}</b>**",
            "`<i>{i}</i>`", "&lt;script&gt;{i}", "<style>*{{display:none}}</style>{i}"]
MARKUP = "#messages :is(script, img, svg, iframe, a, b, i, style, object, embed, form, input)"


def payload_vocabulary(size: int) -> dict[str, int]:
    words = {f"t{i}": i for i in range(13)}
    for i in range(13, size):
        k = i % len(PAYLOADS)
        words["".join(p.format(i=i) for p in PAYLOADS[k:] + PAYLOADS[:k])] = i
    return words


@pytest.fixture(scope="module")
def payload_model(tmp_path_factory):
    """llama_tiny (seed 3, as the chat model) with the payload vocabulary, exported fp32."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.families import get_config
    from tests.hf_models import save_hf_checkpoint

    cfg = get_config("llama_tiny").replace(max_position_embeddings=256)
    ckpt = tmp_path_factory.mktemp("payload-ckpt") / NAME
    save_hf_checkpoint(cfg, ckpt, seed=3)
    tok = Tokenizer(models.WordLevel(payload_vocabulary(cfg.vocab_size), unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.save(str(ckpt / "tokenizer.json"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "eos_token": "t2", "bos_token": "t1"}))
    out = tmp_path_factory.mktemp("payload-model") / NAME
    export_model(open_checkpoint(ckpt), out, ExportOptions(precision="fp32", max_seq_len=256),
                 progress=False)
    return out


@pytest.fixture(scope="module")
def server(payload_model):
    proc = ServerProcess(payload_model, api_key=KEY)
    yield proc
    assert proc.stop() in (0, -signal.SIGTERM), proc.output()


def greedy(server, messages: list[dict], max_tokens: int) -> str:
    r = httpx.post(server.url + "/v1/chat/completions", headers=server.headers, timeout=60,
                   json={"model": NAME, "messages": messages, "max_tokens": max_tokens,
                         "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_model_output_is_shown_as_text_and_runs_nothing(browser, server):
    chat = ChatPage(browser, server, key=KEY).open()
    chat.settings(temperature=0, max_tokens=12)
    answer = chat.ask("t5 t6 t7")
    expected = greedy(server, [{"role": "user", "content": "t5 t6 t7"}], 12)
    assert "<script>" in expected and "<img/src=x/onerror" in expected, expected
    assert chat.raw(answer) == expected
    shown = answer.locator(".content").text_content()
    for tag in ["<script>window.__xss=", "<img/src=x/onerror=window.__xss=", "<svg/onload=",
                "<iframe/src=javascript:", "<a/href=javascript:", "<b>", "<i>", "&lt;script&gt;",
                "<style>*{display:none}</style>"]:
        assert tag in shown, tag  # every tag is its text on the screen
    # The markdown around the tags is rendered (the page's own elements), the tags are not.
    assert answer.locator(".content strong").count() and answer.locator(".content code").count()
    assert chat.page.locator(MARKUP).count() == 0
    # What the user types is text too.
    typed = "t5 <img/src=x/onerror=window.__xss=0> <script>window.__xss=0</script>"
    chat.ask(typed)
    assert chat.page.locator(".msg.user .text").last.text_content() == typed
    assert chat.page.locator(MARKUP).count() == 0
    chat.page.wait_for_timeout(300)  # an error or load handler would have run by now
    assert chat.page.evaluate("() => window.__xss") is None
    assert chat.errors == [] and chat.off_server() == []  # no attempt even reached the policy
    chat.close()


def test_the_page_asks_for_the_key_and_keeps_it_for_the_tab_only(browser, server):
    chat = ChatPage(browser, server).open(wait_for_model=False)
    dialog = chat.page.locator("#key-dialog")
    dialog.wait_for(state="visible")
    chat.page.fill("#key", "wrong")
    chat.page.press("#key", "Enter")
    chat.page.locator("#key-error").wait_for(state="visible")
    assert "refused" in chat.page.inner_text("#key-error")
    assert dialog.is_visible()
    chat.page.keyboard.press("Escape")  # the page cannot work without it: the dialog stays
    assert dialog.is_visible()
    chat.page.fill("#key", KEY)
    chat.page.click("#key-submit")
    assert chat.wait_for_model() == NAME and not dialog.is_visible()
    chat.settings(temperature=0, max_tokens=6)
    answer = chat.ask("t5 t6")
    assert chat.raw(answer) == greedy(server, [{"role": "user", "content": "t5 t6"}], 6)
    storage = chat.page.evaluate("() => [sessionStorage.getItem('llm-onnx-api-key'), "
                                 "localStorage.length, document.cookie]")
    assert storage == [KEY, 0, ""]
    chat.page.reload()  # the same tab keeps the key
    assert chat.wait_for_model() == NAME and not dialog.is_visible()
    # Every console error was a 401 of the two keyless or wrong-key model requests.
    assert len(chat.errors) == 2 and all("401" in e for e in chat.errors), chat.errors
    chat.close()
    other = ChatPage(browser, server).open(wait_for_model=False)  # another tab asks again
    other.page.locator("#key-dialog").wait_for(state="visible")
    other.close()

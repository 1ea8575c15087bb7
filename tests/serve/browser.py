"""Headless Chromium driven by Playwright, for the tests of the chat page at ``/``.

The browser is Debian's ``chromium`` (``apt-get install chromium``; .ci/run installs it where it
is missing), or the one ``LLM_ONNX_CHROMIUM`` names; Playwright's own browser download is never
used. A missing browser fails the tests that need it (never a skip), as other missing test
dependencies do. Tests take the ``browser`` fixture (tests/serve/conftest.py) and open the page
with ``ChatPage(browser, server)``.

``LLM_ONNX_SCREENSHOTS=docs`` makes the tests write their screenshots into ``docs/`` (how the
README's and docs/serving.md's pictures are made); otherwise they go to a temporary folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# A required test dependency (the `test` extra): missing, the modules that use it fail.
from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402

CHROMIUM = os.environ.get("LLM_ONNX_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]


def launch() -> Iterator[Browser]:
    """A module's browser (the ``browser`` fixture of tests/serve/conftest.py): Playwright
    closes, and takes its event loop with it, when the module ends."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"Chromium not found at {CHROMIUM}: install Debian's package (`apt-get install "
                    "chromium`; .ci/run does) or set LLM_ONNX_CHROMIUM to a Chromium binary.",
                    pytrace=False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


class ChatPage:
    """The chat page of ``server`` in a fresh browser context (its own sessionStorage), with
    every console error, uncaught exception and request (tried, or failed and why) recorded."""

    def __init__(self, browser: Browser, server, *, key: str | None = None) -> None:
        self.server = server
        self.origin = server.url
        self.context = browser.new_context(viewport={"width": 1280, "height": 760})
        if key is not None:  # as if the key had been entered earlier in this tab
            self.context.add_init_script(f"sessionStorage.setItem('llm-onnx-api-key', {key!r})")
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.failed: dict[str, str | None] = {}  # url -> why (Chromium says "csp" for a blocked one)
        self.context.on("request", lambda r: self.requests.append(r.url))
        self.context.on("requestfailed", lambda r: self.failed.__setitem__(r.url, r.failure))

    def open(self, wait_for_model: bool = True) -> ChatPage:
        self.response = self.page.goto(self.origin + "/")
        if wait_for_model:
            self.wait_for_model()
        return self

    def wait_for_model(self) -> str:
        self.page.wait_for_function("() => document.title.endsWith('· llm-onnx')")
        return self.page.inner_text("#model-name")

    def settings(self, *, temperature: float | None = None, max_tokens: int | None = None,
                 system: str | None = None, format: str | None = None,
                 schema: str | None = None, tools: str | None = None,
                 tool_choice: str | None = None, parallel: bool | None = None) -> None:
        if temperature is not None:
            self.page.fill("#temperature", str(temperature))
        if max_tokens is not None:
            self.page.fill("#max-tokens", str(max_tokens))
        if system is not None:
            self.page.fill("#system", system)
        if format is not None:
            self.page.select_option("#format", format)
        if schema is not None:
            self.page.fill("#schema", schema)
        if tools is not None or tool_choice is not None or parallel is not None:
            self.page.locator("#tools-box").evaluate("box => { box.open = true; }")
        if tools is not None:
            self.page.fill("#tools", tools)
        if tool_choice is not None:
            self.page.select_option("#tool-choice", tool_choice)
        if parallel is not None:
            self.page.set_checked("#parallel", parallel)

    def answers(self):
        return self.page.locator(".msg.assistant")

    def send(self, text: str):
        """Type ``text``, press Enter; returns the new answer's locator (still streaming)."""
        count = self.answers().count()
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")
        answer = self.answers().nth(count)
        answer.wait_for()
        return answer

    def ask(self, text: str, timeout_ms: float = 60_000):
        """Send ``text`` and wait until the answer is complete; returns its locator."""
        answer = self.send(text)
        self.wait_done(answer, timeout_ms)
        return answer

    def wait_done(self, answer, timeout_ms: float = 60_000) -> str:
        handle = answer.element_handle()
        self.page.wait_for_function("a => a.dataset.state !== 'streaming'", arg=handle,
                                    timeout=timeout_ms)
        return answer.get_attribute("data-state")

    def raw(self, answer) -> str:
        """The answer exactly as the model wrote it (the page's 'raw' view)."""
        return answer.locator("pre.raw").text_content()

    def screenshot(self, name: str, tmp_path: Path) -> Path:
        folder = os.environ.get("LLM_ONNX_SCREENSHOTS")
        path = (ROOT / folder if folder else tmp_path) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))
        return path

    def off_server(self) -> list[str]:
        """Requests that went anywhere but the server (data: URLs, and the page's own blob:
        URLs, stay in the page)."""
        mine = urlsplit(self.origin).netloc
        return [u for u in self.requests
                if not u.startswith(("data:", f"blob:{self.origin}/"))
                and urlsplit(u).netloc != mine]

    def close(self) -> None:
        self.context.close()



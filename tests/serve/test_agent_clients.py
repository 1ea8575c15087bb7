"""The coding agents people point at a local server, as released on npm, against a real
`llm-onnx serve`: Claude Code over the Messages API and Codex CLI over the Responses API each
complete a one-step task that needs a tool (read a file in a scratch folder, report its first
line), exit 0, and the server answers every request they send with a 200.

The model is the tiny random Llama with SmolLM2's tokenizer and a 32,768-token context
(tests/agent_model.py): the clients send 10-25k tokens of system prompt and tools. Its replies
are scripted (tests/serve/scripted_server.py): to the task it calls the client's tool (Claude
Code's Read, Codex's exec_command), to a prompt holding the file's first line (the tool's
result, which only the client's next request can carry) it answers with that line. So the
client's printed answer shows that the call was parsed, the tool ran, and its result came back.

The clients are installed once per version into a cache outside the repository
(``$LLM_ONNX_TEST_CACHE``, default ~/.cache/llm-onnx-tests/npm); the latest release unless
``LLM_ONNX_CLAUDE_CODE`` / ``LLM_ONNX_CODEX`` name a version. Skipped, with the reason, only
where npm cannot reach its registry and nothing is cached.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.serve.conftest import ServerProcess

NAME = "tiny-agent"
FIRST_LINE = "FIRSTLINE-7d3 is where it starts"
CLAUDE_TASK = "Read notes.txt and tell me its first line"
CODEX_TASK = "Run head on notes.txt and tell me its first line"
ANSWER = f"The first line is: {FIRST_LINE}"
CLIENT_TIMEOUT_S = 180
CACHE = Path(os.environ.get("LLM_ONNX_TEST_CACHE") or Path.home() / ".cache" / "llm-onnx-tests")
CLIENTS = {"claude": ("@anthropic-ai/claude-code", "claude", "LLM_ONNX_CLAUDE_CODE"),
           "codex": ("@openai/codex", "codex", "LLM_ONNX_CODEX")}


def npm_client(name: str) -> tuple[Path, str]:
    """(the client's executable, its version), installed into the cache if need be."""
    package, binary, variable = CLIENTS[name]
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not installed: cannot install {package} to test it")
    folders = CACHE / "npm"
    wanted = os.environ.get(variable) or "latest"
    try:
        version = subprocess.run([npm, "view", f"{package}@{wanted}", "version",
                                  "--fetch-retries=1", "--fetch-timeout=15000"],
                                 capture_output=True, text=True, timeout=45,
                                 check=True).stdout.strip().splitlines()[-1]
    except (subprocess.SubprocessError, IndexError) as e:
        cached = sorted(folders.glob(f"{package.replace('/', '+')}@*/node_modules/.bin/{binary}"))
        if not cached:
            why = (str(getattr(e, "stderr", "") or e).strip().splitlines() or [""])[0]
            pytest.skip(f"npm cannot reach its registry to install {package} ({why})")
        return cached[-1], cached[-1].parents[2].name.rsplit("@", 1)[1]
    folder = folders / f"{package.replace('/', '+')}@{version}"
    executable = folder / "node_modules" / ".bin" / binary
    folders.mkdir(parents=True, exist_ok=True)
    with open(folders / ".lock", "w") as lock:  # xdist workers install one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not executable.exists():
            subprocess.run([npm, "install", "--prefix", str(folder), f"{package}@{version}",
                            "--no-audit", "--no-fund", "--loglevel=error"],
                           check=True, timeout=600, capture_output=True)
    return executable, version


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("agents") / "work"
    work.mkdir()
    (work / "notes.txt").write_text(f"{FIRST_LINE}\nthe second line\n", encoding="utf-8")
    return work


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def server(agent_model_folder, scratch, tmp_path_factory):
    """One row (the scripted model follows a row's tokens; one row means no prefix is copied
    between rows behind its back), speculation off (the script drives decode steps), the log at
    INFO: every request the clients send is in it."""
    script = [
        # Claude Code's title of the session (when it asks), held to a JSON schema
        ["Write the title in the language the user wrote in", '{"title": "Notes"}<|im_end|>',
         "last"],
        [CLAUDE_TASK, call("Read", {"file_path": str(scratch / "notes.txt")}) + "<|im_end|>",
         "last"],
        [CODEX_TASK, call("exec_command", {"cmd": "head -n 1 notes.txt"}) + "<|im_end|>",
         "last"],
        [FIRST_LINE, f"{ANSWER}<|im_end|>", "last"],
    ]
    path = tmp_path_factory.mktemp("agent-script") / "script.json"
    path.write_text(json.dumps(script), encoding="utf-8")
    proc = ServerProcess(agent_model_folder, "--model-name", NAME, "--max-batch", "1",
                         "--speculative", "off", "--threads", "2", "--log-level", "info",
                         script=path)
    yield proc
    proc.stop()


def requests_seen(server) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request in the server's log."""
    server.output()  # (flushes the log)
    return [(m[1], m[2], int(m[3])) for m in re.finditer(
        r'"(GET|HEAD|POST|DELETE) (\S+) HTTP/[\d.]+" (\d{3})', server.log.read_text())]


def run_client(name: str, argv: list[str], env: dict[str, str], cwd: Path, server) -> str:
    tokens = server.metric("llm_onnx_prompt_tokens_total")
    before = len(requests_seen(server))
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    seen = requests_seen(server)[before:]
    tokens = server.metric("llm_onnx_prompt_tokens_total") - tokens
    print(f"{name}: exit {done.returncode} in {time.monotonic() - started:.1f} s; the server "
          f"saw {seen}, {tokens:.0f} prompt tokens in all", file=sys.stderr)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert seen and all(status < 400 for _, _, status in seen), seen
    return done.stdout


def test_claude_code_reads_the_file_with_its_tool(server, scratch, tmp_path):
    claude, version = npm_client("claude")
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "unused",
           "ANTHROPIC_MODEL": NAME, "ANTHROPIC_DEFAULT_HAIKU_MODEL": NAME,
           "ANTHROPIC_SMALL_FAST_MODEL": NAME, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1"}
    out = run_client(f"Claude Code {version}", [
        str(claude), "-p", CLAUDE_TASK, "--model", NAME, "--allowedTools", "Read",
        "--max-turns", "4"], env, scratch, server)
    assert ANSWER in out
    assert server.metric('llm_onnx_requests_total{endpoint="/v1/messages",status="200"}') >= 2
    assert server.metric('llm_onnx_ignored_fields_total{api="messages",'
                         'field="context_management"}') >= 1


def test_codex_runs_its_tool_on_the_file(server, scratch, tmp_path):
    codex, version = npm_client("codex")
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(
        f'model = "{NAME}"\nmodel_provider = "llm-onnx"\n\n[model_providers.llm-onnx]\n'
        f'name = "llm-onnx"\nbase_url = "{server.url}/v1"\nwire_api = "responses"\n'
        'env_key = "LLM_ONNX_API_KEY"\n', encoding="utf-8")  # (docs/agents.md's entry)
    env = {"HOME": str(home), "LLM_ONNX_API_KEY": "unused"}
    out = run_client(f"Codex CLI {version}", [
        str(codex), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
        CODEX_TASK], env, scratch, server)
    assert ANSWER in out
    assert server.metric('llm_onnx_requests_total{endpoint="/v1/responses",status="200"}') >= 2
    assert server.metric('llm_onnx_ignored_fields_total{api="responses",'
                         'field="client_metadata"}') >= 1

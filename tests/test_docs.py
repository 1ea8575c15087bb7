"""The docs stay true: README.md and docs/*.md name tests and source files that exist, their links
reach their targets, their Python examples compile (and the README's Python API example runs),
their `llm-onnx ...` command lines parse against the real command tree, and docs/ builds as a
site with `mkdocs build --strict` (a broken link or anchor, or a page left out of the navigation,
fails it). A renamed test, module, option or heading must take its references along."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = re.compile(r"\b((?:tests|llm_onnx|benchmarks|research)/[\w/]+\.py)(?:::(\w+))?")
MODULE = re.compile(r"python -m ((?:benchmarks|research)(?:\.[a-z_0-9]+)*)\b(?!\.[A-Z])")
# results/FILE beside docs/ (not WORK/results/, the benchmarks' cache; not a NAME-DATE pattern)
RESULT = re.compile(r"(?<![\w/])results/([a-z0-9_.-]+\.(?:json|txt))\b")
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def references(text: str):
    for m in REFERENCE.finditer(text):
        yield m.group(1), m.group(2)


def code_blocks(text: str, language: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(text) if m.group(1) == language]


def _ids(cases):
    return [f"{doc.name}#{i}" for doc, i, _ in cases]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_referenced_files_and_tests_exist(doc):
    missing = []
    for path, name in references(doc.read_text()):
        file = ROOT / path
        if not file.is_file():
            missing.append(path)
        elif name and not re.search(rf"^\s*(?:async\s+)?def {name}\b", file.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"{doc.name} names what does not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_benchmark_commands_and_results_exist(doc):
    """`python -m benchmarks.NAME` names a module of the package, `results/FILE` a kept result."""
    import importlib.util

    text = doc.read_text()
    missing = [m for m in MODULE.findall(text) if importlib.util.find_spec(m) is None]
    missing += [f"results/{f}" for f in RESULT.findall(text) if not (ROOT / "results" / f).is_file()]
    assert not missing, f"{doc.name} names what does not exist: {missing}"


def test_the_ledger_lists_every_result():
    """docs/results.md has a row for every file under results/ and names no other."""
    ledger = (ROOT / "docs" / "results.md").read_text()
    kept = {p.name for p in (ROOT / "results").iterdir() if p.name != "README.md"}
    listed = set(re.findall(r"`([\w.-]+\.(?:json|txt))`", ledger))
    assert kept - listed == set() and listed - kept == set(), (kept - listed, listed - kept)


def test_the_check_can_fail():
    text = "see `tests/model/test_presets.py::no_such_test` and tests/nowhere/test_x.py"
    found = list(references(text))
    assert found == [("tests/model/test_presets.py", "no_such_test"),
                     ("tests/nowhere/test_x.py", None)]
    assert not (ROOT / found[1][0]).exists()
    assert not re.search(r"^\s*def no_such_test\b", (ROOT / found[0][0]).read_text(), re.M)


# --- README's links (docs/ is checked by mkdocs below; the README is not part of the site) ------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(markdown_file: Path) -> set[str]:
    """The ids Python-Markdown's toc extension gives the headings (what mkdocs links to; GitHub's
    ids are the same for these headings)."""
    from markdown.extensions.toc import slugify

    text = FENCE.sub("", markdown_file.read_text())
    return {slugify(re.sub(r"[`*]", "", m.group(1)), "-")
            for m in re.finditer(r"^#+\s+(.+?)\s*$", text, re.M)}


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue                                 # https://..., mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(target)
    return broken


def test_readme_links_reach_their_files_and_headings():
    assert not broken_links(README)


def test_the_link_check_can_fail(tmp_path):
    (tmp_path / "page.md").write_text("# Page\n\n## A heading: `code`\n")
    doc = tmp_path / "README.md"
    doc.write_text("[ok](page.md#a-heading-code) [gone](nowhere.md) [bad](page.md#no-such)\n"
                   "![img](missing.png) [web](https://example.com/#x)\n")
    assert broken_links(doc) == ["nowhere.md", "page.md#no-such", "missing.png"]


# --- Python examples ---------------------------------------------------------------------------

PYTHON_BLOCKS = [(doc, i, src) for doc in DOCS
                 for i, src in enumerate(code_blocks(doc.read_text(), "python"))]


@pytest.mark.parametrize("doc, i, src", PYTHON_BLOCKS, ids=_ids(PYTHON_BLOCKS))
def test_python_examples_compile(doc, i, src):
    compile(src, f"{doc.name}, python block {i}", "exec")


def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_readme_python_api_example_runs(byte_model_folder, capsys):
    """The README's Python API example, run as written against a tiny model folder (a random
    Qwen3 whose byte-level tokenizer spells any text, with a ChatML template)."""
    (example,) = code_blocks(readme_section("The Python API"), "python")
    path = re.search(r'Model\.load\("([^"]+)"', example).group(1)
    namespace: dict = {}
    exec(compile(example.replace(path, str(byte_model_folder)), "README.md", "exec"), namespace)
    assert namespace["result"].finish_reason in ("stop", "length")
    assert len(namespace["batch"]) == 2
    session = namespace["session"]
    assert len(session.messages) == 5                  # system, two questions, two answers
    assert 0 < session.last.timings.prefill_tokens < session.last.prompt_tokens  # the new turn
    assert capsys.readouterr().out


# --- command lines -----------------------------------------------------------------------------

def command_lines(bash: str) -> list[list[str]]:
    """Every `llm-onnx ...` command of a bash block, as argument lists (line continuations
    joined, comments dropped, `&&`-chained commands split)."""
    commands = []
    for line in bash.replace("\\\n", " ").splitlines():
        if "llm-onnx" not in line:
            continue                                 # other tools (curl's quoted JSON spans lines)
        words = shlex.split(line, comments=True)
        segment: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", "||", ";", "|"):
                if segment and segment[0] == "llm-onnx":
                    commands.append(segment[1:])
                segment = []
            else:
                segment.append(word)
    return commands


COMMANDS = [(doc, i, args) for doc in DOCS
            for i, args in enumerate(args for block in code_blocks(doc.read_text(), "bash")
                                     for args in command_lines(block))]


def parse_command(args: list[str]) -> click.Context:
    """Parse a command line against `llm-onnx`'s click tree without running it: every option
    must exist and every value must convert (a path that must exist is made empty first, in the
    current folder)."""
    from llm_onnx.cli import main

    at = next(i for i, word in enumerate(args) if not word.startswith("-"))
    group = main.make_context("llm-onnx", args[:at + 1], resilient_parsing=False)
    command = main.get_command(group, args[at])
    assert command is not None, f"no command {args[at]!r}"
    rest = args[at + 1:]
    for param in command.params:
        if isinstance(param.type, click.Path) and param.type.exists:
            for i, word in enumerate(rest[:-1]):
                if word in param.opts:
                    Path(rest[i + 1]).parent.mkdir(parents=True, exist_ok=True)
                    Path(rest[i + 1]).touch()
    return command.make_context(args[at], rest, parent=group, resilient_parsing=False)


@pytest.mark.parametrize("doc, i, args", COMMANDS, ids=_ids(COMMANDS))
def test_command_lines_parse(doc, i, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LLM_ONNX_API_KEY", raising=False)
    parse_command(args)


def test_the_command_check_can_fail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert command_lines('x && llm-onnx generate --seed 1 "a b"  # note\nllm-onnx bench \\\n'
                         '  --repeat 2') == [["generate", "--seed", "1", "a b"],
                                             ["bench", "--repeat", "2"]]
    ctx = parse_command(["generate", "--grammar", "g/answer.gbnf", "--seed", "1", "Hi"])
    assert ctx.params["seed"] == 1 and (tmp_path / "g" / "answer.gbnf").is_file()
    for bad in (["generate", "--no-such-option", "Hi"], ["generate", "--seed", "one", "Hi"],
                ["export", "--precision", "int3"], ["no-such-command"]):
        with pytest.raises((click.UsageError, AssertionError)):
            parse_command(bad)


# --- the site ----------------------------------------------------------------------------------

def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")   # mkdocs-material's banner, not a warning
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(config), "--site-dir", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


def test_the_docs_build_as_a_site_in_strict_mode(tmp_path):
    built = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_docs_home_page_lists_every_page():
    index = (ROOT / "docs" / "index.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert not {page for page in pages if f"]({page})" not in index}


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The same configuration over a two-page site: it builds, then fails on a broken link, a
    broken anchor and a page left out of the navigation."""
    config = (ROOT / "mkdocs.yml").read_text()
    config = config[:config.index("\nnav:")] + "\nnav:\n  - index.md\n  - other.md\n"
    (tmp_path / "mkdocs.yml").write_text(config)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "other.md").write_text("# Other\n\n## A section\n")
    cases = {"good": ("[other](other.md#a-section)", None),
             "missing page": ("[gone](gone.md)", "gone.md"),
             "broken anchor": ("[other](other.md#no-such-section)", "no-such-section"),
             "outside docs": ("[readme](../README.md)", "../README.md")}
    for case, (link, named) in cases.items():
        (docs / "index.md").write_text(f"# Home\n\n{link}\n")
        built = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
        if named is None:
            assert built.returncode == 0, built.stderr
        else:
            assert built.returncode != 0 and named in built.stderr, (case, built.stderr)
    (docs / "index.md").write_text("# Home\n")
    (docs / "orphan.md").write_text("# Orphan\n")
    built = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0 and "orphan.md" in built.stderr

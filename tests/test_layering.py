"""The layers and the direction of imports between them:

    families, modeling.config, model_folder   pure Python (no torch, no onnxruntime)
    modeling (the decoder)                    torch; knows nothing of checkpoints or export
    checkpoints                               reads checkpoints into the model
    export                                    model + checkpoints -> a model folder; not the runtime
    runtime                                   onnxruntime + numpy + tokenizers; never torch
    serve                                     the runtime behind HTTP
    cli, bench                                on top

and no import cycles among llm_onnx's modules, lazy imports inside functions included (a lazy
import is how a layer reaches another on purpose, e.g. the CLI importing the exporter, never a
way around a circle). Inside the runtime, its subpackages import one way:

    core  <-  generation  <-  chat  <-  model, chat_session (the API)
    structured  (used by generation and chat; imports none of them)
    media       (images: numpy + Pillow; imports none of them, any of them may import it)

Inside chat, the dialects (chat/dialects/: one module per dialect, the registry in its
``__init__``) know nothing of the request that holds them, and no dialect imports the registry.
Inside serve, an API is a module with ``add_routes`` (and its own helpers, named after it:
``openai_responses_request``); the modules they share (errors, fields, plan, pipeline, ...)
import no API, and none imports the app that wires them.

and no file of llm_onnx is longer than 500 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import llm_onnx

PACKAGE = Path(llm_onnx.__file__).parent


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


# The decoder's pure-Python config (ModelConfig and its groups), which the runtime reads
PURE_CONFIG = ("llm_onnx.modeling.config", "llm_onnx.modeling.subconfigs",
               "llm_onnx.modeling.vision_config", "llm_onnx.modeling.gemma_vision_config")


def test_runtime_does_not_import_torch():
    mods = _modules_after("import llm_onnx.runtime")
    assert "torch" not in mods
    assert not any(m.startswith(("llm_onnx.export", "llm_onnx.checkpoints", "llm_onnx.modeling.",
                                 "transformers")) and m not in PURE_CONFIG for m in mods)


def test_pure_python_layers_import_neither_torch_nor_onnxruntime():
    for module in ("llm_onnx.families", *PURE_CONFIG, "llm_onnx.model_folder"):
        mods = _modules_after(f"import {module}")
        assert "torch" not in mods and "onnxruntime" not in mods, module


def test_media_needs_no_torch_and_the_text_runtime_no_pillow():
    """Images are numpy + Pillow only; a text-only app of the runtime never loads Pillow."""
    mods = _modules_after("import llm_onnx.runtime.media")
    assert "PIL" in mods
    assert not {"torch", "transformers", "torchvision"} & mods
    assert "PIL" not in _modules_after("import llm_onnx.runtime")


def test_the_kernels_module_imports_neither_torch_nor_onnxruntime():
    """The runtime asks it whether the library is there; onnxruntime only once it is used."""
    mods = _modules_after("import llm_onnx.kernels")
    assert "torch" not in mods and "onnxruntime" not in mods


def test_presets_and_cli_help_do_not_import_torch():
    assert "torch" not in _modules_after("import llm_onnx.families")
    assert "torch" not in _modules_after("import llm_onnx.cli")


def _module_level(tree: ast.Module) -> list[ast.stmt]:
    """Module-level statements, with those under ``if TYPE_CHECKING:``: a type-only import
    that closes a circle is still a circle (depend on a Protocol instead)."""
    out: list[ast.stmt] = []
    for node in tree.body:
        out.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out += node.body
    return out


def module_imports(package: Path = PACKAGE, lazy: bool = False) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of ``package`` it imports at module level (and,
    with ``lazy``, inside functions too)."""
    names = {}
    for path in package.rglob("*.py"):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        names[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        edges = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree) if lazy else _module_level(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import submodule` needs the submodule; `from mod import name`, mod
                submodules = [f"{node.module}.{a.name}" for a in node.names
                              if f"{node.module}.{a.name}" in names]
                targets = submodules if len(submodules) == len(node.names) else \
                    submodules + [node.module]
            else:
                continue
            edges.update(t for t in targets if t in names and t != name)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle found by a depth-first walk of ``graph``, as 'a -> b -> a'."""
    cycles = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


# The torch modules of the decoder (the stack and its parts).
DECODER = ("llm_onnx.modeling.decoder", "llm_onnx.modeling.layer", "llm_onnx.modeling.layers",
           "llm_onnx.modeling.attention", "llm_onnx.modeling.mlp", "llm_onnx.modeling.positions",
           "llm_onnx.modeling.linear_attention", "llm_onnx.modeling.embedding",
           "llm_onnx.modeling.vision_tower", "llm_onnx.modeling.vision_ops",
           "llm_onnx.modeling.multimodal", "llm_onnx.modeling.gemma3_vision",
           "llm_onnx.modeling.gemma4_vision")


def test_layers_import_downwards_only():
    forbidden = {
        "llm_onnx.modeling": ("llm_onnx.checkpoints", "llm_onnx.export", "llm_onnx.runtime",
                              "llm_onnx.serve", "llm_onnx.families"),
        "llm_onnx.families": ("llm_onnx.checkpoints", "llm_onnx.export", "llm_onnx.runtime",
                              "llm_onnx.serve", *DECODER),
        "llm_onnx.checkpoints": ("llm_onnx.export", "llm_onnx.runtime", "llm_onnx.serve"),
        "llm_onnx.export": ("llm_onnx.runtime", "llm_onnx.serve"),
        "llm_onnx.runtime": ("llm_onnx.export", "llm_onnx.checkpoints", "llm_onnx.serve",
                             *DECODER, "llm_onnx.families", "llm_onnx.bench"),
        "llm_onnx.model_folder": ("llm_onnx.export", "llm_onnx.runtime", "llm_onnx.checkpoints"),
    }
    bad = [f"{module} imports {target}"
           for module, targets in module_imports().items()
           for layer, banned in forbidden.items() if module.startswith(layer)
           for target in targets if target.startswith(banned)]
    assert bad == []


def test_the_decoder_modules_are_all_named():
    """A new torch module of the model is in DECODER, so the bans above cover it."""
    assert {m for m in module_imports() if m.startswith("llm_onnx.modeling.")} == {
        *DECODER, *PURE_CONFIG, "llm_onnx.modeling.ops", "llm_onnx.modeling.rope",
        "llm_onnx.modeling.shapes"}


def test_no_import_cycles():
    assert import_cycles(module_imports(lazy=True)) == []


def test_a_lazy_import_that_closes_a_circle_is_found(tmp_path):
    """The circle generator -> speculative -> model -> generator was closed by an import inside
    a function, which a module-level check does not see."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "generator.py").write_text("from pkg.speculative import draft\n")
    (pkg / "speculative.py").write_text("def draft():\n    from pkg.model import Model\n")
    (pkg / "model.py").write_text("from pkg.generator import draft\n")
    assert import_cycles(module_imports(pkg)) == []
    assert import_cycles(module_imports(pkg, lazy=True)) == [
        "pkg.generator -> pkg.speculative -> pkg.model -> pkg.generator"]


RUNTIME_LAYERS = {  # subpackage -> the runtime subpackages it must not import, lazily or not
    "core": ("structured", "generation", "chat", "model", "chat_session"),
    "structured": ("core", "generation", "chat", "model", "chat_session"),
    "generation": ("chat", "model", "chat_session"),
    "chat": ("core", "model", "chat_session"),
    "media": ("core", "structured", "generation", "chat", "model", "chat_session"),
}


def test_runtime_subpackages_import_one_way():
    bad = []
    for module, targets in module_imports(lazy=True).items():
        parts = module.split(".")
        if parts[:2] != ["llm_onnx", "runtime"] or len(parts) < 4:
            continue
        banned = RUNTIME_LAYERS.get(parts[2], ())
        bad += [f"{module} imports {t}" for t in targets
                if t.startswith("llm_onnx.runtime.") and t.split(".")[2] in banned]
    assert bad == []
    # every module of the runtime lives in one of the packages, or is the API on top
    loose = {p.stem for p in (PACKAGE / "runtime").glob("*.py")}
    assert loose == {"__init__", "model", "chat_session"}
    assert {p.name for p in (PACKAGE / "runtime").iterdir() if p.is_dir()
            and (p / "__init__.py").exists()} == set(RUNTIME_LAYERS)


def test_dialects_know_neither_the_request_nor_the_registry():
    registry, request = "llm_onnx.runtime.chat.dialects", "llm_onnx.runtime.chat.request"
    bad = [f"{module} imports {target}" for module, targets in module_imports(lazy=True).items()
           if module.startswith(registry + ".") for target in targets
           if target in (registry, request)]
    assert bad == []
    assert f"{registry}.base" in module_imports()  # (the package is where this test looks)


def _serve_apis() -> set[str]:
    """The serve modules that add routes (an API each)."""
    apis = set()
    for path in (PACKAGE / "serve").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name == "add_routes" for n in tree.body):
            apis.add(f"llm_onnx.serve.{path.stem}")
    return apis | {"llm_onnx.serve.web"}


def test_serve_shared_modules_import_no_api():
    graph = module_imports(lazy=True)
    apis = _serve_apis()
    assert {"llm_onnx.serve.openai_chat", "llm_onnx.serve.anthropic_messages"} <= apis
    serve = {m for m in graph if m.startswith("llm_onnx.serve.")}
    own = {m for m in serve if any(m.startswith(api) for api in apis)}  # an API's helpers
    top = {f"llm_onnx.serve.{m}" for m in ("app", "service", "server", "ray_app")}
    shared = serve - own - top
    bad = [f"{m} imports {t}" for m in shared for t in graph[m] if t in own | top]
    assert bad == []
    assert [m for m in own | shared if "llm_onnx.serve.app" in graph[m]] == []


def test_no_file_past_500_lines():
    sources = [p for pattern in ("*.py", "*.cc", "*.h") for p in PACKAGE.rglob(pattern)]
    long = {str(p.relative_to(PACKAGE.parent)): n for p in sources
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}


def test_type_checking_imports_count():
    """The generator <-> model circle was closed by a type-only import: such imports count."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from llm_onnx.runtime.model import Model\n")
    found = [n for n in _module_level(tree) if isinstance(n, ast.ImportFrom)]
    assert [n.module for n in found] == ["typing", "llm_onnx.runtime.model"]
    assert "llm_onnx.runtime.model" not in module_imports(lazy=True)[
        "llm_onnx.runtime.generation.generator"]

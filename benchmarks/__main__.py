"""`python -m benchmarks`: the benchmarks there are, each with its first docstring line."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP = {"benchmarks", "benchmarks.peers.worker", "benchmarks.full_size.workers",
        "benchmarks.fidelity.answer_runs"}


def commands() -> list[tuple[str, str]]:
    """(module, summary) of every module with a ``main``, found without importing any."""
    out = []
    for path in sorted(HERE.rglob("*.py")):
        rel = path.relative_to(HERE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__main__")
        tree = ast.parse(path.read_text())
        if name in SKIP or not any(isinstance(n, ast.FunctionDef) and n.name == "main"
                                   for n in tree.body):
            continue
        doc = " ".join((ast.get_docstring(tree) or "").split("\n\n")[0].split())
        out.append((name, textwrap.shorten(doc.split(". ")[0].rstrip("."), 180)))
    return out


def main() -> None:
    print("python -m NAME --help for each (docs/benchmarks.md):\n")
    for name, doc in commands():
        print(f"  python -m {name}")
        print(textwrap.fill(doc, 96, initial_indent=" " * 6, subsequent_indent=" " * 6))


if __name__ == "__main__":
    main()

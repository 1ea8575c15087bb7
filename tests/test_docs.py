"""The docs point at tests and source files that exist: a renamed test or module must take its
references along."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFERENCE = re.compile(r"\b((?:tests|llm_onnx|benchmarks)/[\w/]+\.py)(?:::(\w+))?")


def references(text: str):
    for m in REFERENCE.finditer(text):
        yield m.group(1), m.group(2)


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


def test_the_check_can_fail():
    text = "see `tests/model/test_presets.py::no_such_test` and tests/nowhere/test_x.py"
    found = list(references(text))
    assert found == [("tests/model/test_presets.py", "no_such_test"),
                     ("tests/nowhere/test_x.py", None)]
    assert not (ROOT / found[1][0]).exists()
    assert not re.search(r"^\s*def no_such_test\b", (ROOT / found[0][0]).read_text(), re.M)

"""The kernel library's files travel with the package and are found without a build."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from llm_onnx import kernels

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_file_is_package_data():
    """pip install (not editable) copies only the package data: a source file the globs miss
    would make `python -m llm_onnx.kernels build` fail where the package is installed."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["llm_onnx"]
    package = ROOT / "llm_onnx"
    files = [p for p in kernels.SOURCES.iterdir() if p.is_file()]
    files.append(package / "kernels" / "fetch_headers.sh")
    missed = [p.name for p in files
              if not any(fnmatch.fnmatch(str(p.relative_to(package)), g) for g in globs)]
    assert missed == []


def test_no_library_means_a_message_saying_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv(kernels.LIBRARY_ENV, str(tmp_path / "absent.so"))
    assert kernels.library_path() is None and not kernels.available()
    try:
        kernels.require()
    except kernels.KernelsError as e:
        assert "python -m llm_onnx.kernels build" in str(e)
    else:
        raise AssertionError("require() found a library that is not there")


def test_the_build_folder_changes_with_the_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "SOURCES", tmp_path)
    (tmp_path / "a.cc").write_text("int a;")
    first = kernels.build_dir()
    (tmp_path / "a.cc").write_text("int b;")
    assert kernels.build_dir() != first
    assert kernels.onnxruntime_version() in first.name


def test_info_says_where_the_library_is_or_how_to_build_it(tmp_path, monkeypatch, capsys):
    from llm_onnx.kernels.__main__ import main

    monkeypatch.setenv(kernels.LIBRARY_ENV, str(tmp_path / "absent.so"))
    assert main(["info"]) == 1
    assert "python -m llm_onnx.kernels build" in capsys.readouterr().err


def test_info_lists_the_paths_this_cpu_gets(kernel_library, capsys):
    from llm_onnx.kernels.__main__ import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert str(kernel_library) in out and out.rstrip().endswith("portable")

"""--kernels llm_onnx end to end on a tiny Qwen3-MoE (from transformers' random checkpoint):
the experts become RoutedExperts nodes, the parity gate passes, the manifest records the
kernels, greedy tokens equal the --kernels ort folder's (QMoE), and without the library the
ort folder still runs while the kernels folder is refused in one line saying what to do."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from llm_onnx import kernels
from llm_onnx.errors import ModelFolderError
from llm_onnx.runtime import GenerationOptions, Model

ARCH = "qwen3_moe_tiny"


def _op_types(folder) -> set[tuple[str, str]]:
    import onnx

    return {(n.domain, n.op_type) for graph in ("prefill.onnx", "decode.onnx")
            for n in onnx.load(str(folder / graph), load_external_data=False).graph.node}


def _greedy(folder, prompts: list[list[int]], n: int) -> list[list[int]]:
    model = Model.load(folder, provider="cpu", threads=2, speculative="off")
    options = GenerationOptions(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    return [model.generate(p, options).token_ids for p in prompts]


@pytest.fixture(scope="module")
def folders(kernel_library, tiny_export):
    return {k: tiny_export(ARCH, "int4", kernels=k) for k in ("llm_onnx", "ort")}


def test_the_experts_run_as_routed_experts_and_pass_the_parity_gate(folders):
    ours, theirs = _op_types(folders["llm_onnx"]), _op_types(folders["ort"])
    assert ("llm_onnx", "RoutedExperts") in ours and ("com.microsoft", "QMoE") not in ours
    assert ("com.microsoft", "QMoE") in theirs and not any(d == "llm_onnx" for d, _ in theirs)
    manifest = json.loads((folders["llm_onnx"] / "manifest.json").read_text())
    assert manifest["kernels"] == {"library": "llm_onnx", "ops_version": kernels.OPS_VERSION,
                                   "ops": ["RoutedExperts"]}
    assert manifest["parity"]["failures"] == [] and manifest["parity"]["scope"] != "skipped"
    assert "kernels" not in json.loads((folders["ort"] / "manifest.json").read_text())


def test_greedy_tokens_equal_with_and_without_the_kernels(folders):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 200, n).tolist() for n in (5, 17, 40)]
    assert _greedy(folders["llm_onnx"], prompts, 12) == _greedy(folders["ort"], prompts, 12)


def test_without_the_library_the_ort_folder_runs_and_ours_is_refused(folders, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setenv(kernels.LIBRARY_ENV, str(tmp_path / "not-built.so"))
    assert len(_greedy(folders["ort"], [[5, 6, 7]], 4)[0]) == 4
    with pytest.raises(ModelFolderError) as e:
        Model.load(folders["llm_onnx"], provider="cpu", threads=1)
    message = str(e.value)
    assert "\n" not in message and "python -m llm_onnx.kernels build" in message
    assert "--kernels ort" in message


def test_the_cli_says_it_in_one_line(folders, tmp_path, monkeypatch):
    from llm_onnx.cli import main

    monkeypatch.setenv(kernels.LIBRARY_ENV, str(tmp_path / "not-built.so"))
    result = CliRunner().invoke(main, ["generate", "--model", str(folders["llm_onnx"]),
                                       "--prompt-ids", "5,6,7", "--max-new-tokens", "2"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--kernels ort" in lines[0], result.output


def test_exporting_with_kernels_needs_the_library(tiny_hf, tmp_path, monkeypatch):
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.errors import ExportError
    from llm_onnx.export import ExportOptions, export_model

    monkeypatch.setenv(kernels.LIBRARY_ENV, str(tmp_path / "not-built.so"))
    with pytest.raises(ExportError, match="--kernels ort"):
        export_model(open_checkpoint(tiny_hf(ARCH)[1]), tmp_path / "out",
                     ExportOptions(precision="int4", kernels="llm_onnx"), progress=False)

"""The CUDA path on a real GPU (``pytest -m gpu``): the correctness parts of
the GPU check (benchmarks/gpu/). Skipped where no CUDA session comes up (CI has no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gpu import correctness, kernels
from llm_onnx.runtime.core.providers import cuda_status

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_status()[0], reason=f"no usable CUDA GPU: "
                                                              f"{cuda_status()[1]}")]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gpu-models")


def _failures(results: dict) -> dict:
    return {k: v for k, v in results.items() if not v.get("ok")}


def test_every_compute_node_on_cuda_or_a_clear_cpu_choice(root):
    assert _failures(correctness.check_placement(root, "cuda")) == {}


def test_fp16_and_int4_match_torch_and_the_cpu_through_the_runtime(root):
    assert _failures(correctness.check_parity(root, "cuda")) == {}


def test_matmulnbits_block_sizes_and_batches():
    assert _failures(kernels.check_matmulnbits("cuda")) == {}

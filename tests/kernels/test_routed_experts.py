"""RoutedExperts (llm_onnx/kernels/src) against its numpy reference: every instruction-set path
this CPU has, forced one at a time; odd shapes; both weight layouts and activations; repeated
runs on two threads."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from llm_onnx import kernels
from tests.kernels.experts_ref import Problem, model_bytes, random_problem, reference


def run(p: Problem, isa: str = "auto", threads: int = 1, monkeypatch=None) -> np.ndarray:
    return session(p, isa, threads, monkeypatch).run(
        None, {"x": p.x, "index": p.index, "weight": p.weight})[0]


def session(p: Problem, isa: str, threads: int, monkeypatch) -> ort.InferenceSession:
    monkeypatch.setenv(kernels.ISA_ENV, isa)  # read when the session creates its kernels
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    kernels.register(so)
    return ort.InferenceSession(model_bytes(p), so, providers=["CPUExecutionProvider"])


def assert_close(y: np.ndarray, p: Problem) -> None:
    """Within float summation order of the reference: a few 1e-6 of the output's scale (an int8
    rounding of the activations that lands the other way moves an output by ~1e-3 of it, so a
    wrong code, block or scale shows far above this)."""
    ref = reference(p)
    scale = np.abs(ref).max()
    assert np.abs(y - ref).max() <= 2e-3 * scale, (np.abs(y - ref).max(), scale)
    assert np.median(np.abs(y - ref)) <= 1e-5 * scale


CASES = {  # name -> random_problem arguments
    "swiglu-int4": dict(bits=4, block=32),
    "swiglu-int8": dict(bits=8, block=32),
    "zero-points-int4": dict(bits=4, block=16, zero_points=True),
    "zero-points-int8": dict(bits=8, block=64, zero_points=True),
    "geglu-halves-int4": dict(bits=4, block=32, activation="geglu", layout="halves"),
    "gpt-oss-clamped-int8": dict(bits=8, block=32, alpha=1.702, beta=1.0, limit=7.0),
    "block-128-int4": dict(bits=4, block=128),
}


@pytest.fixture(scope="module")
def isas(kernel_library) -> list[str]:
    return kernels.supported_isas(kernel_library)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_path_matches_the_reference_and_the_portable_code(case, isas, monkeypatch):
    # hidden 200 and width 72: neither a multiple of any block (the last block is padded)
    p = random_problem(1, n=7, d=200, width=72, e=6, k=2, **CASES[case])
    if case.startswith("gpt-oss"):
        rng = np.random.default_rng(2)
        p.gate_up_bias = rng.standard_normal((6, 144)).astype(np.float32)
        p.down_bias = rng.standard_normal((6, 200)).astype(np.float32) * 0.1
        p.x *= 4  # enough gate and up values past the limit of 7 to test the clamp
    portable = run(p, "portable", monkeypatch=monkeypatch)
    assert_close(portable, p)
    for isa in isas:
        before = kernels.created(isa, kernels.library_path())
        y = run(p, isa, monkeypatch=monkeypatch)
        assert kernels.created(isa, kernels.library_path()) == before + 1, isa
        # integer block sums are exact on every path, and the float code after them is shared
        assert np.array_equal(y, portable), isa


def test_float_activations_are_approximated(kernel_library, monkeypatch):
    """The int8 activations against float ones: a few percent of the output's scale at most
    (a wrong nibble order or zero point would be of the order of the output itself)."""
    p = random_problem(3, n=16, d=256, width=128, e=4, k=2, bits=8, block=32)
    y = run(p, monkeypatch=monkeypatch)
    ref = reference(p, quantized_activations=False)
    assert np.abs(y - ref).max() <= 0.05 * np.abs(ref).max()


@pytest.mark.parametrize("n, e, k", [(1, 8, 1), (1, 8, 8), (512, 4, 1), (512, 16, 8)])
def test_token_counts_and_top_k(n, e, k, isas, monkeypatch):
    p = random_problem(4, n=n, d=80, width=48, e=e, k=k, bits=4, block=16)
    y = run(p, isas[0], threads=2, monkeypatch=monkeypatch)
    assert_close(y, p)


def test_one_expert_for_every_token_and_experts_nobody_chose(isas, monkeypatch):
    p = random_problem(5, n=33, d=96, width=40, e=8, k=2, bits=8, block=32)
    p.index[:, 0] = 3  # every token chooses expert 3; experts 0, 2, 4, 6 by nobody
    p.index[:, 1] = np.where(np.arange(33) % 2, 5, 7)
    p.down["codes"][[0, 2, 4, 6]] = 0xFF  # garbage in the unchosen experts: must not be read
    p.down["scales"][[0, 2, 4, 6]] = np.nan
    for isa in isas:
        assert_close(run(p, isa, monkeypatch=monkeypatch), p)


def test_repeated_runs_on_two_threads_give_the_same_bits(isas, monkeypatch):
    """Each work item writes its own outputs: 2 threads must equal 1, run after run (ONNX
    Runtime's own ScatterND with reduction add lost updates at 2 threads)."""
    p = random_problem(6, n=512, d=64, width=32, e=8, k=4, bits=4, block=32)
    p.index[:, 0] = 0  # one expert with all 512 tokens: its pairs spread over both threads
    for isa in isas:
        one = run(p, isa, threads=1, monkeypatch=monkeypatch)
        two = session(p, isa, 2, monkeypatch)
        for _ in range(20):
            y = two.run(None, {"x": p.x, "index": p.index, "weight": p.weight})[0]
            assert np.array_equal(y, one), isa


def test_an_expert_index_out_of_range_is_refused(kernel_library, monkeypatch):
    p = random_problem(7, n=3, d=32, width=16, e=4, k=2, bits=4, block=16)
    p.index[1, 1] = 4
    with pytest.raises(Exception, match="expert index 4 out of range for 4 experts"):
        run(p, monkeypatch=monkeypatch)


def test_a_path_the_cpu_lacks_or_an_unknown_one_is_refused(kernel_library, monkeypatch):
    p = random_problem(8, n=1, d=32, width=16, e=2, k=1, bits=4, block=16)
    with pytest.raises(Exception, match="LLM_ONNX_KERNELS_ISA=sse9 is unknown"):
        run(p, "sse9", monkeypatch=monkeypatch)

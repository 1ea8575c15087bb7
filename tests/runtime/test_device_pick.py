"""Greedy picks where the logits are (llm_onnx.runtime.core.device_pick): the hand-written pick
graph is valid ONNX and equals a numpy reference on ties, NaN and infinities; Engine.decode(greedy=
True) returns the argmax of the logits it would have returned (masked, all-rows, ride-along rows)
and falls back to the logits where an active row is not finite; a Generator whose greedy rows
take that path gives the tokens of one that does not, and rows that sample or read logprobs still
get logits. On the CPU the engine only picks there when told (on CUDA it is the default); the
GPU's own run is in benchmarks/gpu_serve.py."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from llm_onnx.runtime import Engine, GenerationOptions, Model
from llm_onnx.runtime.core import device_pick
from llm_onnx.runtime.core.device_pick import DevicePicker, pick_model
from llm_onnx.runtime.generation.sampling import Sampler
from llm_onnx.runtime.generation.scheduler import Scheduler


def reference(logits: np.ndarray) -> np.ndarray:
    """numpy's first argmax of each row, -1 for a row holding a NaN or an infinity."""
    flat = logits.reshape(logits.shape[0], -1)
    return np.where(np.isfinite(flat).all(-1), flat.argmax(-1), -1)


def test_the_pick_graph_is_valid_onnx_and_equals_numpy():
    onnx = pytest.importorskip("onnx")
    model = onnx.load_model_from_string(pick_model())
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["TopK", "ReduceSum"]
    picker = DevicePicker()
    rng = np.random.default_rng(3)
    for vocab in (7, 1000, 49152):
        x = rng.standard_normal((6, 1, vocab)).astype(np.float32)
        x[1, 0, [vocab // 2, 2, vocab - 1]] = 50.0  # a three-way tie: the lowest index wins
        x[2, 0, 1] = np.nan
        x[3, 0, 0] = np.inf
        x[4, 0, :] = -np.inf
        x[5, 0, -1] = -np.inf  # one -inf among finite values: not usable either
        bound = picker.bind(ort.OrtValue.ortvalue_from_numpy(x))
        got = bound.pick()
        np.testing.assert_array_equal(got, reference(x))
        assert got[1] == 2
        for r in (0, 1):  # the finite rows: what the host's greedy sampler picks
            sampler = Sampler(GenerationOptions(temperature=0.0).validated(), 1, vocab, [[]])
            assert got[r] == sampler.pick_one(x[r, 0])
        x[2, 0, 1] = 0.0  # the binding reads the buffer in place at every pick
        assert bound.pick()[2] == x[2, 0].argmax()


def test_varints_of_negative_values_are_ten_bytes():
    assert device_pick._varint(-1) == b"\xff" * 9 + b"\x01"
    assert device_pick._varint(300) == b"\xac\x02"


def _picking(engine: Engine) -> Engine:
    engine.picks_on_device, engine.pick_min_rows = True, 1  # the CUDA path, here on the CPU
    return engine


def test_greedy_decode_returns_the_argmax_of_the_logits(tiny_export):
    """Each decode path with greedy=True (every row, masked with a ride-along row, one row)
    gives the argmax of the logits an identical cache gets without it; the lengths advance the
    same."""
    engine = _picking(Engine(tiny_export("llama_tiny", "fp32")))
    picked, plain = engine.new_cache(3, 16), engine.new_cache(3, 16)
    for cache in (picked, plain):
        engine.prefill(cache, 0, [1, 2, 3])
        engine.prefill(cache, 1, [4, 5])
    steps = [(np.array([6, 9]), None), (np.array([7, 3, 0]), np.array([True, True, False])),
             (np.array([8, 1]), None), (np.array([2, 5, 0]), np.array([False, True, False]))]
    for tokens, active in steps:
        ids = engine.decode(picked, tokens, active, greedy=True)
        logits = engine.decode(plain, tokens, active)
        assert ids.shape == (len(tokens),) and ids.dtype == np.int64
        rows = np.ones(len(tokens), bool) if active is None else active
        np.testing.assert_array_equal(ids[rows], logits[rows].argmax(-1))
        assert picked.lengths.tolist() == plain.lengths.tolist()
    # without picks_on_device, greedy=True is ignored: logits as ever
    engine.picks_on_device = False
    assert engine.decode(picked, np.array([1, 1]), greedy=True).shape == (2, engine.vocab_size)


def test_an_active_row_that_is_not_finite_gets_logits(tiny_export, monkeypatch):
    """A pick of -1 (NaN or an infinity in the row) on an active row: decode returns the logits
    for the host's sampler; on an inactive row it does not matter."""
    engine = _picking(Engine(tiny_export("llama_tiny", "fp32")))
    cache = engine.new_cache(2, 16)
    engine.prefill(cache, 0, [1, 2, 3])
    engine.prefill(cache, 1, [4])
    real = device_pick.PickBinding.pick
    bad_row = {"row": 1}

    def pick(self):
        ids = real(self).copy()
        ids[bad_row["row"]] = -1
        return ids

    monkeypatch.setattr(device_pick.PickBinding, "pick", pick)
    out = engine.decode(cache, np.array([5, 6]), greedy=True)
    assert out.shape == (2, engine.vocab_size)
    out = engine.decode(cache, np.array([5, 6]), np.array([True, False]), greedy=True)
    assert out.shape == (2,)


@pytest.mark.parametrize("arch", ["llama_tiny", "qwen3_5_tiny"])
def test_a_batch_picking_on_the_device_gives_the_tokens_of_the_host(arch, tiny_export,
                                                                    monkeypatch):
    """Four requests through one scheduler, twice: greedy ones picked on the device (counted)
    give the host's tokens; a sampling request in the batch makes those steps fetch logits (its
    tokens, from the same seed, agree too), as does one asking for logprobs."""
    folder = tiny_export(arch, "fp32")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 200, n).tolist() for n in (3, 9, 5, 12)]
    options = [GenerationOptions(max_new_tokens=8, temperature=0.0, ignore_eos=True),
               GenerationOptions(max_new_tokens=6, temperature=0.0, ignore_eos=True),
               GenerationOptions(max_new_tokens=7, temperature=0.8, seed=3, ignore_eos=True),
               GenerationOptions(max_new_tokens=5, temperature=0.0, ignore_eos=True)]
    picks = {"n": 0}
    real = device_pick.PickBinding.pick

    def counted(self):
        picks["n"] += 1
        return real(self)

    monkeypatch.setattr(device_pick.PickBinding, "pick", counted)
    results = {}
    for on_device in (False, True):
        model = Model.load(folder, provider="cpu")
        model.engine.picks_on_device, model.engine.pick_min_rows = on_device, 1
        scheduler = Scheduler(model, max_batch=4, prefill_chunk=4)
        handles = [scheduler.submit(p, o.validated(), logprobs=2 if i == 3 else None)
                   for i, (p, o) in enumerate(zip(prompts, options))]
        while scheduler.step():
            pass
        results[on_device] = [h.result().token_ids for h in handles]
        assert [len(t) for t in results[on_device]] == [8, 6, 7, 5]
        scored = handles[3].result().logprobs
        assert len(scored) == 5 and all(len(lp.top) == 2 for lp in scored)
        # the first two alone: every step greedy
        alone = [model.generate(p, o).token_ids for p, o in zip(prompts[:2], options[:2])]
        assert alone == results[on_device][:2]
    assert results[True] == results[False]
    assert picks["n"] > 0


def test_a_pick_that_fails_falls_back_to_the_logits_with_a_note(tiny_export, monkeypatch):
    engine = _picking(Engine(tiny_export("llama_tiny", "fp32")))
    cache = engine.new_cache(1, 16)
    engine.prefill(cache, 0, [1, 2, 3])

    def refuse(self):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(device_pick.PickBinding, "pick", refuse)
    out = engine.decode(cache, np.array([4]), greedy=True)
    assert out.shape == (1, engine.vocab_size) and not engine.picks_on_device
    assert "device pick failed (no kernel)" in engine.notes[-1]


def test_a_step_of_fewer_rows_than_pick_min_rows_returns_logits(tiny_export):
    """Below pick_min_rows the host's copy costs less than the pick's run: logits as ever."""
    engine = Engine(tiny_export("llama_tiny", "fp32"))
    engine.picks_on_device, engine.pick_min_rows = True, 2
    cache = engine.new_cache(2, 16)
    engine.prefill(cache, 0, [1, 2, 3])
    engine.prefill(cache, 1, [4])
    assert engine.decode(cache, np.array([5]), greedy=True).shape == (1, engine.vocab_size)
    assert engine.decode(cache, np.array([5, 6]), greedy=True).shape == (2,)

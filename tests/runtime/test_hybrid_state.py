"""A recurrent state per row beside the KV cache (Qwen3.5's linear-attention layers): every path
that rewinds or reuses a row's cache (rewind, prefix reuse in the scheduler, a chat session's
next turn, a rejected speculative draft, constrained fast-forward, rows riding along in a
batched step) gives the tokens a fresh run gives.

Two levels: the generator over fake engines whose cache cuts back only to checkpoints
(FakeRecurrentCache), against the same fakes with a plain cache; and the real tiny Qwen3.5
export (a byte-level tokenizer, tests/byte_model.py), against fresh runs of the same model and
against transformers where the model's own numbers are compared."""

from __future__ import annotations

import numpy as np
import pytest

from llm_onnx.runtime import GenerationOptions, Model
from llm_onnx.runtime.core.recurrent import CHECKPOINT_MARGIN, HybridCache
from llm_onnx.runtime.generation.scheduler import Scheduler
from llm_onnx.runtime.generation.speculative import SpeculativeOptions
from tests.runtime.fakes import HistoryEngine, MarkovEngine

ALWAYS = SpeculativeOptions(method="ngram", adaptive=False, ngram_min=1)


def greedy(n: int, **fields) -> GenerationOptions:
    return GenerationOptions(max_new_tokens=n, temperature=0.0, ignore_eos=True, **fields)


# ------------------------------------------------------------------ the generator, on fakes


def _fake(engine_cls, recurrent: bool, *args) -> Model:
    engine = engine_cls(*args)
    engine.recurrent = recurrent
    return Model.from_parts(engine, None)


def _rewind_and_continue(model: Model) -> list[int]:
    gen = model.generator(greedy(12))
    gen.append_tokens(list(range(3, 23)))
    for _ in range(8):
        gen.generate_next_token()
    gen.rewind(5)  # generated tokens, then into the prompt
    gen.rewind(6)
    gen.append_tokens([7, 8, 9])
    while not gen.is_done():
        gen.generate_next_token()
    return gen.tokens()


def test_rewinding_a_recurrent_row_runs_again_what_its_checkpoint_lacks():
    plain, rec = (_fake(HistoryEngine, r, 50, 128) for r in (False, True))
    assert _rewind_and_continue(rec) == _rewind_and_continue(plain)
    engine = rec.engine
    cache = engine.caches[0]
    # the prompt paused for a checkpoint before its end, and the rewind went back to it
    assert (0, 20 - cache.margin, False) in cache.taken
    runs = [ids for kind, _, ids in engine.calls if kind == "prefill"]
    assert len(runs) > len([ids for kind, _, ids in plain.engine.calls if kind == "prefill"])


def _scheduled(model: Model) -> tuple[list[list[int]], int, int]:
    """Requests sharing prefixes, one after another through a 2-row scheduler: later ones
    start from what the rows hold. Returns the answers, the prompt tokens run and submitted."""
    shared = list(range(5, 25))
    prompts = [shared + [30, 31], shared + [32], shared[:10] + [40, 41, 42], shared + [30, 33]]
    batch = Scheduler(model, max_batch=2, max_length=64)
    out = []
    for p in prompts:
        request = batch.submit(p, greedy(6))
        while batch.step():
            pass
        out.append(request.result().token_ids)
    return out, batch.generator.stats.prefill_tokens, sum(len(p) for p in prompts)


def test_a_recurrent_row_reuses_a_prefix_only_as_far_as_a_checkpoint():
    plain, rec = (_fake(HistoryEngine, r, 50, 128) for r in (False, True))
    (want, kv_run, submitted), (got, rec_run, _) = _scheduled(plain), _scheduled(rec)
    assert got == want
    # a plain cache keeps every shared token; a recurrent row what a checkpoint holds
    assert kv_run < rec_run < submitted
    cache = rec.engine.caches[0]
    assert any(length == 22 - cache.margin for _, length, _ in cache.taken)


def _speculate(model: Model) -> tuple[list[int], object]:
    gen = model.generator(greedy(40), speculative=ALWAYS)
    gen.append_tokens([1, 2, 3, 1, 2, 3, 1, 2])
    for _ in gen.events():
        pass
    return gen.result().token_ids, gen


def test_a_rejected_draft_takes_a_recurrent_row_back_to_its_copy():
    (plain, _), (rec, gen) = (_speculate(_fake(MarkovEngine, r)) for r in (False, True))
    assert rec == plain
    cache = gen.model.engine.caches[0]
    assert gen.stats.verify_runs > 0 and gen.stats.accepted_tokens < gen.stats.drafted_tokens
    assert any(transient for _, _, transient in cache.taken)  # a copy before each verify run


# ------------------------------------------------------------------ the real tiny Qwen3.5


@pytest.fixture(scope="module")
def model(hybrid_byte_model_folder):
    return Model.load(hybrid_byte_model_folder, provider="cpu", threads=1, speculative="off")


def _fresh(model: Model, prompt: list[int], n: int) -> list[int]:
    return model.generate(prompt, greedy(n)).token_ids


def _ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(9, 200, n).tolist()


def test_a_cut_back_row_runs_the_rest_to_the_same_logits(model):
    """Engine level: a row checkpointed at 9 of 23 positions, cut back to 15 (it keeps 9), then
    run from there gives the logits a single run of the 23 tokens gives; its states are those
    of a fresh row, and a row riding along in a batched step keeps its own."""
    engine = model.engine
    ids = _ids(23)
    fresh = engine.new_cache(2, 32)
    want = engine.prefill(fresh, 0, ids)
    cache = engine.new_cache(2, 32)
    assert isinstance(cache, HybridCache)
    engine.prefill(cache, 0, ids[:9])
    cache.checkpoint(0)
    engine.prefill(cache, 0, ids[9:20])
    assert cache.kept(0, 15) == 9 and cache.kept(0, 8) == 0 and cache.kept(0, 25) == 20
    cache.truncate(0, 15)
    assert cache.length_of(0) == 9
    got = engine.prefill(cache, 0, ids[9:])
    assert np.abs(got - want).max() <= 1e-5
    layer = cache.state.layers[0]
    for which in ("conv", "recurrent"):
        assert np.array_equal(cache.state_view(layer, which)[0], fresh.state_view(layer, which)[0])
    # row 1 rides along (inactive) while row 0 decodes: row 1's states do not move
    engine.prefill(cache, 1, ids[:5])
    before = [cache.state_view(layer, w)[1].copy() for w in ("conv", "recurrent")]
    engine.decode(cache, np.array([ids[3], ids[7]]), np.array([True, False]))
    after = [cache.state_view(layer, w)[1] for w in ("conv", "recurrent")]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert cache.length_of(1) == 5


def test_rewind_and_chunked_prefill_equal_fresh_runs(model):
    prompt = _ids(30, 1)
    gen = model.generator(greedy(10), prefill_chunk=4)  # chunks of 4, checkpoints among them
    gen.append_tokens(prompt)
    for _ in range(6):
        gen.generate_next_token()
    assert gen.tokens()[30:] == _fresh(model, prompt, 6)
    gen.rewind(9)  # 6 generated and 3 of the prompt
    gen.append_tokens([50, 51])
    while not gen.is_done():
        gen.generate_next_token()
    tokens = gen.tokens()
    assert tokens[:29] == prompt[:27] + [50, 51]
    assert tokens[29:] == _fresh(model, prompt[:27] + [50, 51], len(tokens) - 29)


def test_scheduled_requests_with_shared_prefixes_equal_fresh_runs(model):
    """Rows joining and leaving a 2-row scheduler in chunks, prompts sharing a system prefix
    (taken from a free row's checkpoint), n = 2 choices of one prompt: each answer equals its
    fresh run."""
    system = _ids(40, 2)
    prompts = [system + _ids(n, 10 + n) for n in (3, 7, 12, 5)] + [_ids(9, 3)]
    batch = Scheduler(model, max_batch=2, max_length=96, prefill_chunk=8)
    requests = [batch.submit(p, greedy(8)) for p in prompts]
    requests.append(batch.submit(prompts[1], greedy(8, seed=1)))  # the same prompt again
    while batch.step():
        pass
    for prompt, request in zip(prompts + [prompts[1]], requests):
        assert request.result().token_ids == _fresh(model, prompt, 8)
    assert batch.generator.stats.copied_tokens > 0  # the shared prefix was reused


def test_several_choices_of_one_prompt_decode_together(model):
    prompt = _ids(11, 4)
    results = model.generate([prompt, prompt, _ids(4, 5)], greedy(9))
    assert results[0].token_ids == results[1].token_ids == _fresh(model, prompt, 9)
    assert results[2].token_ids == _fresh(model, _ids(4, 5), 9)


def test_constrained_fast_forward_changes_no_token(model):
    """A schema forces its keys: the forced tokens ride along or run as a chunk, and the
    answer is the one the constraint gives without fast-forward."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    prompt = model.chat_prompt([{"role": "user", "content": "A person."}])
    runs = {}
    for fast in (True, False):
        model.constraints.fast_forward = fast
        try:
            runs[fast] = model.generate(prompt, json_schema=schema, max_new_tokens=60,
                                        temperature=0)
        finally:
            model.constraints.fast_forward = True
    assert runs[True].token_ids == runs[False].token_ids


def test_speculation_over_the_real_states_equals_plain_decoding(model):
    part = _ids(10, 6)
    prompt = part + part[:6]
    plain = model.generate(prompt, greedy(30)).token_ids
    gen = model.generator(greedy(30), speculative=ALWAYS)
    gen.append_tokens(prompt)
    for _ in gen.events():
        pass
    assert gen.result().token_ids == plain
    assert gen.stats.verify_runs > 0
    assert gen.stats.accepted_tokens < gen.stats.drafted_tokens  # rejections were undone


def test_a_chat_session_reuses_a_checkpoint_of_the_rewritten_history(hybrid_byte_think_model_folder):
    """Qwen3's template with thinking off ends turn 1's prompt with an empty think block that
    turn 2's history does not repeat: the row goes back to the checkpoint taken
    CHECKPOINT_MARGIN tokens before turn 1's prompt ended, runs the rest, and answers as a
    fresh chat of the whole conversation does."""
    from tests.thinking_model import QWEN3_TEMPLATE

    model = Model.load(hybrid_byte_think_model_folder, provider="cpu", threads=1,
                       speculative="off", chat_template=QWEN3_TEMPLATE.read_text())
    off = {"enable_thinking": False}
    session = model.chat_session(template_vars=off)
    session.send("Hello there.", max_new_tokens=12, temperature=0)
    prompt1 = model.chat_prompt(session.messages[:1], template_vars=off)
    second = session.send("And again?", max_new_tokens=12, temperature=0)
    prompt2 = model.chat_prompt(session.messages[:-1], template_vars=off)
    assert second.timings.prefill_tokens == len(prompt2) - (len(prompt1) - CHECKPOINT_MARGIN)
    fresh = model.chat(session.messages[:-1], template_vars=off, max_new_tokens=12,
                       temperature=0)
    assert second.token_ids == fresh.token_ids


def test_a_cuda_graphs_double_first_run_leaves_the_states_as_one_step(tiny_export, monkeypatch):
    """ONNX Runtime runs a CUDA graph's first call twice (a warm-up run, then the capture); a
    recurrent state updated in place then takes that step twice (seen on an H200: Qwen3.5's
    steps with graphs 11% off those without). Reproduced on the CPU by running a graph
    binding's first call twice as ORT does: the engine's graph path must still give the
    logits of plain decoding, at every bucket size it meets."""
    from llm_onnx.runtime.core import kv_cache
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    real = kv_cache._DecodeBinding.run

    def ort_like(self, *args, **kwargs):
        if self.graph_id is not None and self.replays == 0:
            real(self, *args, **kwargs)  # the warm-up run: the same inputs, executed
            self.replays = 0
        return real(self, *args, **kwargs)

    monkeypatch.setattr(kv_cache._DecodeBinding, "run", ort_like)
    folder = tiny_export("qwen3_5_tiny", "fp32")
    plain = Engine(folder, RuntimeOptions(provider="cpu"))
    graphs = Engine(folder, RuntimeOptions(provider="cpu"))
    graphs.cuda_graph = True  # the graph path (bucketed bindings, first-call handling)
    rng = np.random.default_rng(2)
    caches = [e.new_cache(3, 24) for e in (plain, graphs)]
    prompts = [rng.integers(0, plain.vocab_size, n) for n in (5, 9, 3)]
    for engine, cache in zip((plain, graphs), caches):
        for row, p in enumerate(prompts):
            engine.prefill(cache, row, p)
    for rows in (2, 2, 3, 3, 1):  # buckets 2, 4 and 1, each first met once
        tokens = rng.integers(0, plain.vocab_size, rows)
        want = plain.decode(caches[0], tokens)
        got = graphs.decode(caches[1], tokens)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

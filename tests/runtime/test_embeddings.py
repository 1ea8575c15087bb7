"""Model.embed over an embedding model's folder: batches equal single runs whatever their
lengths, Matryoshka truncation, token ids and text alike, the refusals (an input past the
context, a generation call on an embedding folder and the other way round)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm_onnx.errors import GenerationError, ModelFolderError
from llm_onnx.model_folder import EMBED, MANIFEST, Manifest, load_manifest
from llm_onnx.runtime import Engine, Model
from llm_onnx.runtime.core.embedder import EmbeddingEngine, truncate


def text(n: int, start: int = 10) -> str:
    return " ".join(f"t{(start + i) % 255}" for i in range(n))


@pytest.fixture(scope="module")
def model(embedding_export):
    return Model.load(embedding_export("qwen3"), provider="cpu", threads=1)


@pytest.fixture(scope="module")
def mean_model(embedding_export):
    return Model.load(embedding_export("llama"), provider="cpu", threads=1)


def test_a_text_gives_a_vector_and_a_list_a_matrix(model):
    assert model.task == "embed" and isinstance(model.engine, EmbeddingEngine)
    one = model.embed("t1 t2 t3")
    assert one.shape == (64,) and one.dtype == np.float32
    many = model.embed(["t1 t2 t3", "t4"])
    assert many.shape == (2, 64)
    np.testing.assert_allclose(many[0], one, atol=1e-6)


@pytest.mark.parametrize("fixture", ["model", "mean_model"])
def test_batches_of_different_lengths_equal_single_runs(request, fixture):
    m = request.getfixturevalue(fixture)
    texts = [text(n, 3 * n) for n in (1, 17, 4, 60, 2, 33, 9, 127)]  # 2 .. 128 tokens
    together = m.embed(texts)
    alone = np.stack([m.embed(t) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)
    one_a_run = m.embed(texts, batch_size=1)
    np.testing.assert_allclose(one_a_run, alone, atol=1e-5, rtol=0)


def test_runs_are_grouped_by_length_within_rows_and_tokens(model):
    lengths = [5, 100, 3, 40, 41, 2, 100]
    runs = model.engine.batches(lengths, batch_size=3, batch_tokens=120)
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    for run in runs:
        assert len(run) <= 3
        assert len(run) == 1 or len(run) * max(lengths[i] for i in run) <= 120
    order = [lengths[i] for run in runs for i in run]
    assert order == sorted(order)


def test_token_ids_equal_their_text(model):
    ids = model.encode("t7 t8 t9")
    assert ids[-1] == 255  # the tokenizer appends its end-of-text token
    np.testing.assert_allclose(model.embed(ids), model.embed("t7 t8 t9"), atol=1e-6)
    np.testing.assert_allclose(model.embed([ids, model.encode("t1 t2")]),
                               model.embed(["t7 t8 t9", "t1 t2"]), atol=1e-6)


def test_dimensions_keep_the_first_values_and_renormalise(model, mean_model):
    texts = ["t1 t2 t3", "t9 t8"]
    full = model.embed(texts)
    cut = model.embed(texts, dimensions=16)
    assert cut.shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(cut, axis=-1), 1.0, atol=1e-6)
    expected = full[:, :16] / np.linalg.norm(full[:, :16], axis=-1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=1e-6)
    # a model that does not normalise keeps its first values as they are
    np.testing.assert_allclose(mean_model.embed(texts, dimensions=8),
                               mean_model.embed(texts)[:, :8], atol=1e-6)
    assert truncate(full, 64, True) is full
    for bad in (0, 65, 2.5, True):
        with pytest.raises(GenerationError, match="dimensions must be an integer from 1 to 64"):
            model.embed(texts, dimensions=bad)


def test_inputs_past_the_context_are_refused_by_index(model):
    assert model.context_length == 128
    model.embed(text(127))  # 128 tokens with the end-of-text token: fits
    with pytest.raises(GenerationError, match=r"input 1 has 129 tokens but the model's context "
                                              r"is 128 tokens; shorten it"):
        model.embed(["t1", text(128)])
    with pytest.raises(GenerationError, match="input 0 is an empty string"):
        model.embed([""])
    with pytest.raises(GenerationError, match="at least one input"):
        model.embed([])
    with pytest.raises(GenerationError, match="input 1: token id 300 is outside the vocabulary"):
        model.embed([[1, 2], [300]])
    with pytest.raises(GenerationError, match="input 0 must be a string or a list of token ids"):
        model.embed([{"text": "t1"}])


def test_an_embedding_folder_does_not_generate(model):
    for call in (lambda: model.generate("t1 t2"), lambda: model.stream("t1"),
                 lambda: model.chat([{"role": "user", "content": "t1"}]),
                 lambda: model.generator(), lambda: model.chat_session()):
        with pytest.raises(GenerationError, match="is an embedding model .*--task generate"):
            call()
    with pytest.raises(GenerationError, match="embedding model"):
        model.engine.new_cache(1, 8)
    with pytest.raises(GenerationError, match="embedding model"):
        Engine(model.engine.manifest.folder)  # the generation engine over an embed folder


def test_a_generation_folder_does_not_embed(tiny_export):
    model = Model.load(tiny_export("llama_tiny"), provider="cpu", threads=1)
    assert model.task == "generate"
    with pytest.raises(GenerationError, match="is a generation model.*--task embed"):
        model.embed([[1, 2, 3]])


def test_generation_options_are_refused_for_an_embedding_folder(embedding_export):
    with pytest.raises(GenerationError, match="chat templates, tool calls and speculative"):
        Model.load(embedding_export("qwen3"), speculative="ngram")


def test_manifest_of_an_embedding_folder(embedding_export, tmp_path):
    folder = embedding_export("llama")
    manifest = load_manifest(folder)
    again = Manifest.from_json(manifest.to_json(), folder)
    assert again == manifest and again.embedding == manifest.embedding
    graph = manifest.graphs["embed"]
    assert graph.file == EMBED and graph.logits == "none"
    assert [t.name for t in graph.inputs] == ["input_ids", "sequence_lengths"]
    assert [(t.name, t.shape) for t in graph.outputs] == [("embeddings", ("batch", 48))]
    assert manifest.kv_cache.shared_buffer is False
    data = json.loads((folder / MANIFEST).read_text())
    bad = dict(data, embedding=dict(data["embedding"], pooling="max"))
    with pytest.raises(ModelFolderError, match="task 'embed' \\(pooling 'max'\\)"):
        Manifest.from_json(json.dumps(bad), folder)
    without = dict(data, files={})
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / MANIFEST).write_text(json.dumps(without))
    with pytest.raises(ModelFolderError, match="does not list embed.onnx"):
        load_manifest(copy, verify=False)

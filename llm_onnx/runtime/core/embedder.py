"""An embedding model's engine: embed.onnx (``llm-onnx export --task embed``) over batches of
token ids, one vector per input.

    engine = open_engine(folder, RuntimeOptions())  # engines.py: an EmbeddingEngine here
    vectors = engine.embed([[12, 7, 99], [5]])       # (2, E) float32, in the given order
    engine.embed(rows, dimensions=256)               # the first 256 values, re-normalised

Inputs run in batches of rows of similar length (sorted, so little padding), right-padded, each
batch at most ``batch_size`` rows and ``batch_tokens`` tokens (rows x its longest row): the
attention's scores grow with rows x length^2, so long inputs run a few at a time.

``dimensions`` (Matryoshka embeddings, OpenAI's ``dimensions``): each vector's first d values,
divided by their L2 norm again when the model's embeddings are normalised (manifest
``embedding.normalize``); a model that does not normalise gets its first d values as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from llm_onnx import model_folder as names
from llm_onnx.errors import GenerationError, ModelFolderError
from llm_onnx.runtime.core.engine import Engine, not_generating
from llm_onnx.runtime.core.providers import CUDA

BATCH_SIZE = 32  # rows per run
BATCH_TOKENS = 8192  # rows x longest row per run


def embedding_input(item: object, index: int, encode: Callable[[str], list[int]],
                    vocab_size: int, context_length: int) -> list[int]:
    """Input ``index`` of an embed call (a text, tokenized by ``encode``, or token ids) as
    checked token ids; GenerationError naming it otherwise. Nothing is truncated."""
    if isinstance(item, str):
        if not item:
            raise GenerationError(f"input {index} is an empty string.")
        ids = encode(item)
    elif isinstance(item, (list, tuple, np.ndarray)) and all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in item):
        ids = [int(i) for i in item]
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise GenerationError(f"input {index}: token id {bad[0]} is outside the "
                                  f"vocabulary (0..{vocab_size - 1}).")
    else:
        raise GenerationError(f"input {index} must be a string or a list of token ids, "
                              f"got {type(item).__name__}.")
    if not ids:
        raise GenerationError(f"input {index} has no tokens.")
    if len(ids) > context_length:
        raise GenerationError(f"input {index} has {len(ids)} tokens but the model's context "
                              f"is {context_length} tokens; shorten it (embeddings "
                              "are not truncated).")
    return ids


def truncate(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """(N, E) -> (N, d): the first ``dimensions`` values, re-normalised when ``normalize``."""
    if dimensions is None or dimensions == vectors.shape[-1]:
        return vectors
    out = np.ascontiguousarray(vectors[:, :dimensions])
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


class EmbeddingEngine(Engine):
    """An Engine over embed.onnx: one session, no KV cache, no CUDA graphs. The generation
    steps (new_cache, prefill, decode) refuse with what to do instead."""

    def _open_sessions(self) -> None:
        m = self.manifest
        if m.task != "embed" or m.embedding is None:
            raise ModelFolderError(f"{m.folder}: not an embedding model's folder (its manifest "
                                   f"says task {m.task!r}).")
        self.embedding = m.embedding
        self.device = "cuda" if self.provider == CUDA else "cpu"
        self.cuda_graph = False  # inputs of any shape: nothing to capture
        self.state_layout = None
        self.session = self._session(m.path("embed"))
        self.prefill_session = self.decode_session = self.session

    @property
    def dimensions(self) -> int:
        return self.embedding.dimensions

    def check_dimensions(self, dimensions: int | None) -> int | None:
        """``dimensions`` if it is an integer in [1, E] (None: all E); GenerationError else."""
        if dimensions is None:
            return None
        if isinstance(dimensions, bool) or not isinstance(dimensions, (int, np.integer)) \
                or not 1 <= dimensions <= self.dimensions:
            raise GenerationError(f"dimensions must be an integer from 1 to {self.dimensions} "
                                  f"(this model's embedding size), got {dimensions!r}.")
        return int(dimensions)

    def batches(self, lengths: Sequence[int], batch_size: int = BATCH_SIZE,
                batch_tokens: int = BATCH_TOKENS) -> list[list[int]]:
        """Input indices grouped into runs: shortest first, each run at most ``batch_size``
        rows and ``batch_tokens`` padded tokens (a row longer than that runs alone)."""
        runs: list[list[int]] = []
        for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
            run = runs[-1] if runs else None
            # sorted by length: row i is the run's longest so far
            if run is None or len(run) >= batch_size or (len(run) + 1) * lengths[i] > batch_tokens:
                runs.append([i])
            else:
                run.append(i)
        return runs

    def embed(self, rows: Sequence[Sequence[int]], dimensions: int | None = None, *,
              batch_size: int = BATCH_SIZE, batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
        """(N, E or dimensions) float32 embeddings of N token-id rows (each 1 to
        context_length ids), in the given order."""
        dimensions = self.check_dimensions(dimensions)
        lengths = [len(r) for r in rows]
        if any(not 1 <= n <= self.context_length for n in lengths):
            raise GenerationError(f"each input needs 1 to {self.context_length} tokens; got "
                                  f"{min(lengths)} to {max(lengths)}.")
        out = np.empty((len(rows), self.dimensions), dtype=np.float32)
        for run in self.batches(lengths, batch_size, batch_tokens):
            longest = max(lengths[i] for i in run)
            ids = np.zeros((len(run), longest), dtype=np.int64)
            for r, i in enumerate(run):
                ids[r, :lengths[i]] = rows[i]
            feed = {names.INPUT_IDS: ids, names.SEQUENCE_LENGTHS: np.array(
                [lengths[i] for i in run], dtype=np.int32)}
            (vectors,) = self.session.run([names.EMBEDDINGS], feed, self.run_options)
            out[run] = vectors
        return truncate(out, dimensions, self.embedding.normalize)

    # ------------------------------------------------------------------ not a generator

    def new_cache(self, batch: int, length: int) -> NoReturn:
        raise GenerationError(not_generating(self.manifest))

    def prefill(self, cache: Any, row: int, ids: Sequence[int] | np.ndarray,
                images: Any = None) -> NoReturn:
        raise GenerationError(not_generating(self.manifest))

    def decode(self, cache: Any, tokens: np.ndarray, active: np.ndarray | None = None,
               first_row: int = 0, greedy: bool = False) -> NoReturn:
        raise GenerationError(not_generating(self.manifest))

    @property
    def verifies(self) -> bool:
        return False

    def row_bytes(self, positions: int) -> int:
        return 0



def embedding_rows(engine: Any, inputs: Any, encode: Callable[[str], list[int]],
                   context: int) -> tuple[list[list[int]], bool]:
    """``Model.embed``'s inputs (a text, token ids, or a list of either) as checked token-id
    rows, and whether they were one input; a generation model's engine is refused."""
    if not isinstance(engine, EmbeddingEngine):
        folder = getattr(getattr(engine, "manifest", None), "folder", "this model")
        raise GenerationError(f"{folder} is a generation model: its graphs return next-token "
                              "logits, not embeddings. Export an embedding model with "
                              "`llm-onnx export --task embed --checkpoint ...`.")
    single = isinstance(inputs, str) or (not isinstance(inputs, (bytes, dict)) and bool(
        inputs) and all(isinstance(i, (int, np.integer)) for i in inputs))
    items = [inputs] if single else list(inputs)
    if not items:
        raise GenerationError("embed needs at least one input.")
    return [embedding_input(item, i, encode, engine.vocab_size, context)
            for i, item in enumerate(items)], single

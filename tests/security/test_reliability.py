"""Reliability: the default-model cache survives concurrent first uses; hostile GGUF headers are
refused before anything is allocated; prompts of any content give a result or a clear error."""

from __future__ import annotations

import multiprocessing
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_onnx.errors import CheckpointError, GenerationError
from llm_onnx.runtime import Model
from tests.runtime.fakes import FakeEngine


def _slow_export(folder_str: str, log_str: str) -> None:
    from pathlib import Path

    from llm_onnx.default_model import ensure_exported

    def export(out: Path) -> None:
        with open(log_str, "a") as log:
            log.write("export\n")
        time.sleep(1.0)  # long enough for the other process to arrive meanwhile
        out.mkdir()
        (out / "manifest.json").write_text("{}")

    ensure_exported(Path(folder_str), export)


def test_two_processes_export_the_default_model_once(tmp_path):
    folder, log = tmp_path / "models" / "default", tmp_path / "log.txt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_slow_export, args=(str(folder), str(log))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert log.read_text().count("export") == 1
    assert (folder / "manifest.json").is_file()


def gguf_with_tensor_dims(path, dims: list[int]) -> None:
    """A minimal GGUF v3 header: no metadata, one F32 tensor with the given dims."""
    name = b"token_embd.weight"
    header = b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 1) + struct.pack("<Q", 0)
    info = struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
    info += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<I", 0) + struct.pack("<Q", 0)
    body = header + info
    body += b"\0" * ((-len(body)) % 32) + b"\0" * 64
    path.write_bytes(body)


@pytest.mark.parametrize("dims", [[1 << 40, 1 << 20], [4096, 151936], [2**63 - 1]])
def test_gguf_header_claiming_absurd_sizes_is_refused(tmp_path, dims):
    from llm_onnx.checkpoints import open_checkpoint

    path = tmp_path / "evil.gguf"
    gguf_with_tensor_dims(path, dims)
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert time.perf_counter() - start < 5


@pytest.fixture(scope="module")
def real_tokenizer_model(smollm2_export):
    from tokenizers import Tokenizer

    folder = smollm2_export("fp32")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model = Model.load(folder)
    vocab = model.engine.vocab_size
    rng = np.random.default_rng(0)
    script = [rng.standard_normal(vocab).astype(np.float32) for _ in range(4)]
    fake = FakeEngine(script, context_length=256)
    fake.vocab_size = vocab
    return Model.from_parts(fake, tok, model.eos_token_ids, model.chat_template, model.special_tokens)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.characters(categories=["Cc", "Cf", "Zs", "So", "Lo", "Mn"]), max_size=200),
    st.builds(lambda c, n: c * n, st.characters(), st.integers(1, 2000)),
))
def test_any_prompt_gives_a_result_or_a_clear_error(real_tokenizer_model, text):
    model = real_tokenizer_model
    for call in (lambda: model.generate(text, max_new_tokens=3, temperature=0.7, seed=1),
                 lambda: model.chat([{"role": "user", "content": text}], max_new_tokens=3)):
        try:
            result = call()
        except GenerationError as e:
            assert "\n" not in str(e)
            continue
        assert result.finish_reason in ("stop", "stop_string", "length")
        assert isinstance(result.text, str) and len(result.token_ids) <= 3

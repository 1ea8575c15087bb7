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


def _someone_waits_on(path) -> bool:
    """Whether a process is blocked on the flock of ``path``: Linux lists waiters in
    /proc/locks ("->" lines, by device:inode). Elsewhere: after a pause, assumed."""
    import os
    from pathlib import Path

    locks = Path("/proc/locks")
    if not locks.is_file():
        time.sleep(0.3)
        return True
    inode = os.stat(path).st_ino
    return any("->" in line and line.split()[6].endswith(f":{inode}")
               for line in locks.read_text().splitlines())


def _slow_export(folder_str: str, log_str: str, arrived_str: str) -> None:
    from pathlib import Path

    from llm_onnx.default_model import ensure_exported

    def export(out: Path) -> None:
        with open(log_str, "a") as log:
            log.write(f"export start {time.time()}\n")
        # Hold the lock until both processes have asked for the folder and the other one waits
        # on the lock (or 30 s pass: the assertions then tell what went wrong).
        deadline = time.monotonic() + 30
        while len(Path(arrived_str).read_text().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        while not _someone_waits_on(out.parent / f".{out.name}.lock") and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        out.mkdir()
        (out / "manifest.json").write_text("{}")
        with open(log_str, "a") as log:
            log.write(f"export end {time.time()}\n")

    with open(arrived_str, "a") as arrived:
        arrived.write(f"{time.time()}\n")
    ensure_exported(Path(folder_str), export)
    with open(log_str, "a") as log:
        log.write(f"returned {time.time()}\n")


def test_two_processes_export_the_default_model_once(tmp_path):
    """Both processes ask for the default model while one of them is exporting it: the export
    runs once, and the second process returns only after the first finished it."""
    folder, log, arrived = tmp_path / "models" / "default", tmp_path / "log.txt", tmp_path / "in"
    arrived.write_text("")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_slow_export, args=(str(folder), str(log), str(arrived)))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    events = [line.rsplit(" ", 1) for line in log.read_text().splitlines()]
    times = {kind: [float(t) for k, t in events if k == kind]
             for kind in ("export start", "export end", "returned")}
    assert len(times["export start"]) == 1 and len(times["returned"]) == 2
    asked = sorted(float(t) for t in arrived.read_text().split())
    # The two overlapped: both had asked before the export ended, and both returned after it.
    assert asked[1] < times["export end"][0] <= min(times["returned"])
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
    """Every prompt that tokenizes to something that fits the context gets an answer; the only
    errors are the empty prompt, one of no tokens (control characters the tokenizer drops) and
    one too long for the context, each in one line."""
    model = real_tokenizer_model
    messages = [{"role": "user", "content": text}]
    context = model.engine.context_length
    generate_ids = model.encode(text) if text else []
    cases = [
        (lambda: model.generate(text, max_new_tokens=3, temperature=0.7, seed=1),
         "the prompt is empty." if not text else "the prompt has no tokens." if not generate_ids
         else "tokens do not fit" if len(generate_ids) >= context else None),
        (lambda: model.chat(messages, max_new_tokens=3),
         "tokens do not fit" if len(model.chat_prompt(messages)) >= context else None),
    ]
    for call, expected_error in cases:
        try:
            result = call()
        except GenerationError as e:
            assert "\n" not in str(e)
            assert expected_error is not None and expected_error in str(e) or \
                expected_error == "tokens do not fit" and "context" in str(e), (text, str(e))
            continue
        assert expected_error is None, (text, expected_error)
        assert result.finish_reason in ("stop", "stop_string", "length")
        assert isinstance(result.text, str) and 1 <= len(result.token_ids) <= 3

"""Prompt logprobs through a real `llm-onnx serve`: /v1/completions with ``echo`` and
``logprobs`` answers each prompt token's logprob as vLLM does (the first null), equal to
transformers' log_softmax of the same tokens; and lm-evaluation-harness's ``local-completions``
model, run against the server on a task whose data the test writes, gets per-sample
log-likelihoods equal to transformers'. The server is conftest's (tiny-chat: a word tokenizer,
6-token prefill chunks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from llm_onnx.families import get_config
from tests.hf_models import make_hf_model
from tests.serve.conftest import CONTEXT

MODEL = "tiny-chat"
PROMPT = "t5 t17 t99 t3 t42 t7 t7 t120 t64 t11 t250 t33 t18"


@pytest.fixture(scope="module")
def hf_model():
    """The transformers model conftest's chat_model_folder was exported from (same seed)."""
    return make_hf_model(get_config("llama_tiny").replace(max_position_embeddings=CONTEXT), 3)


def ids_of(text: str) -> list[int]:
    return [int(w[1:]) for w in text.split()]


def log_softmax(hf_model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1).numpy()


def test_echo_with_logprobs_are_transformers_log_softmax(client, hf_model):
    ids = ids_of(PROMPT)
    ref = log_softmax(hf_model, ids)
    r = client.completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=3,
                                  max_tokens=0)
    choice = r.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert lp.tokens == [f"t{i}" for i in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    for at in range(1, len(ids)):
        assert lp.token_logprobs[at] == pytest.approx(ref[at - 1, ids[at]], abs=1e-4)
        top = np.argsort(-ref[at - 1], kind="stable")[:3]
        assert list(lp.top_logprobs[at]) == [f"t{i}" for i in top]
        assert list(lp.top_logprobs[at].values()) == pytest.approx(ref[at - 1, top], abs=1e-4)


def test_echo_then_the_completion_streamed_and_not(client, model):
    kwargs = dict(model=MODEL, prompt=PROMPT, logprobs=2, max_tokens=5, temperature=0)
    plain = client.completions.create(**kwargs).choices[0]
    echoed = client.completions.create(echo=True, **kwargs).choices[0]
    n = len(ids_of(PROMPT))
    assert echoed.text == PROMPT + plain.text
    assert echoed.logprobs.tokens[n:] == plain.logprobs.tokens
    assert echoed.logprobs.token_logprobs[n:] == plain.logprobs.token_logprobs
    assert echoed.logprobs.top_logprobs[n:] == plain.logprobs.top_logprobs
    scored = model.prompt_logprobs(PROMPT, top=2)
    assert echoed.logprobs.token_logprobs[1:n] == pytest.approx(
        [s.logprob for s in scored[1:]], abs=1e-5)
    offsets = echoed.logprobs.text_offset
    assert offsets == sorted(offsets) and offsets[n] == sum(
        len(t) for t in echoed.logprobs.tokens[:n])
    chunks = [c.choices[0] for c in client.completions.create(echo=True, stream=True, **kwargs)]
    assert "".join(c.text for c in chunks) == echoed.text
    assert chunks[0].text == PROMPT and chunks[0].logprobs.token_logprobs[0] is None
    streamed = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    assert streamed == echoed.logprobs.token_logprobs
    assert chunks[0].logprobs.text_offset == offsets[:n]


def test_several_token_id_prompts_each_scored(client, model):
    prompts = [[9, 8, 7, 6, 5, 4, 3], [200, 100], [50]]
    r = client.completions.create(model=MODEL, prompt=prompts, echo=True, logprobs=0,
                                  max_tokens=1, temperature=0)
    for choice, ids in zip(r.choices, prompts):
        want = [None] + [s.logprob for s in model.prompt_logprobs(ids)[1:]]
        got = choice.logprobs.token_logprobs
        assert len(got) == len(ids) + 1 and got[0] is None
        assert got[1:len(ids)] == pytest.approx(want[1:], abs=1e-5)


def test_max_tokens_0_needs_echo(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="'max_tokens' must be an integer >= 1"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)


def test_echoed_logprobs_conform_to_openais_spec_but_the_first_null(server):
    """The response validates against OpenAI's description of a completion once its leading
    null (what OpenAI's legacy answers and vLLM's give) stands in for a number."""
    import httpx

    from tests.serve.test_openai_spec import echoed, validate

    body = {"model": MODEL, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 2}
    answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    assert answer["choices"][0]["logprobs"]["token_logprobs"][0] is None
    validate(echoed(answer, True), "CreateCompletionResponse")


# ------------------------------------------------------------------ lm-evaluation-harness

DOCS = [{"question": "t5 t6 t7", "choices": ["t8", "t9 t10", "t11 t12 t13"], "answer": 1},
        {"question": "t40 t41", "choices": ["t42", "t43"], "answer": 0},
        {"question": "t100 t7 t100 t7", "choices": ["t100", "t7 t7"], "answer": 1}]
TASK = """task: llm_onnx_tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def test_lm_eval_local_completions_loglikelihoods_equal_transformers(server, hf_model,
                                                                     tmp_path):
    """lm-eval finds the server's /tokenizer_info and /tokenize (its remote tokenizer), sends
    each context and choice as token ids with echo, logprobs 1, max_tokens 1, and sums the
    choice's logprobs: each equals transformers' log-likelihood of the choice's tokens."""
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "task.yaml").write_text(TASK.format(data=data))
    out = tmp_path / "out"
    args = (f"model={MODEL},base_url={server.url}/v1/completions,num_concurrent=1,"
            "max_retries=1,tokenized_requests=True")
    run = subprocess.run(
        [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions",
         "--model_args", args, "--tasks", "llm_onnx_tiny_choice",
         "--include_path", str(tmp_path / "tasks"), "--log_samples", "--output_path", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
             "TOKENIZERS_PARALLELISM": "false"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "remote tokenizer" in run.stdout + run.stderr
    samples = [json.loads(line) for path in Path(out).rglob("samples_*.jsonl")
               for line in path.read_text().splitlines()]
    assert len(samples) == len(DOCS)
    for sample in samples:
        doc = sample["doc"]
        context = ids_of(doc["question"])
        for choice, response in zip(doc["choices"], sample["filtered_resps"]):
            whole = context + ids_of(choice)
            ref = log_softmax(hf_model, whole)
            want = sum(ref[at - 1, whole[at]] for at in range(len(context), len(whole)))
            assert float(response[0]) == pytest.approx(want, abs=1e-4), (doc, choice)

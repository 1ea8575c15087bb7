"""The real SmolLM2-135M-Instruct exported: the parity gate passes, int8 keeps fp32's greedy
continuations, the answer is right."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from tests.ort_helpers import Graphs

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]


def test_int8_greedy_matches_fp32_for_16_tokens(smollm2_export):
    fp32, int8 = Graphs(smollm2_export("fp32")), Graphs(smollm2_export("int8"))
    tok = Tokenizer.from_file(str(smollm2_export("fp32") / "tokenizer.json"))
    for prompt in PROMPTS:
        ids = tok.encode(prompt).ids
        a, b = fp32.greedy(ids, 16), int8.greedy(ids, 16)
        assert a == b, (prompt, tok.decode(a), tok.decode(b))


def test_fp32_export_answers_paris(smollm2_export):
    folder = smollm2_export("fp32")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    out = Graphs(folder).greedy(tok.encode("The capital of France is").ids, 4)
    assert tok.decode(out).startswith(" Paris")


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_parity_report_is_in_the_manifest(smollm2_export, precision):
    m = json.loads((smollm2_export(precision) / "manifest.json").read_text())
    parity = m["parity"]
    assert parity["scope"] == "whole model"
    assert parity["kl_divergence"] <= parity["thresholds"]["kl"]
    assert m["tokenizer"]["chat_template"] and m["tokenizer"]["eos_token_ids"]

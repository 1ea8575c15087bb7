"""benchmarks.fidelity.answers' own logic on made-up systems: greedy answers stop at an
end-of-sequence id or the limit, forced log-probabilities follow the path, and the counts (right,
looped, cut), the KL and the targets come out as the definitions say."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fidelity import answer_runs as runs
from benchmarks.fidelity.answers import PROMPTS, checks, correct, fidelity, margins, score
from llm_onnx.families import PRESETS

V = 8
EOS = 7


class Scripted:
    """Logits that favour next[last token] (a cycle unless it reaches EOS)."""

    def __init__(self, nxt: dict[int, int]) -> None:
        self.nxt = nxt

    def _logits(self, last: int):
        x = np.zeros(V, np.float32)
        x[self.nxt.get(last, EOS)] = 5.0
        return x

    def start(self, ids, capacity):
        self.seen = list(ids)
        return self._logits(ids[-1])

    def step(self, token):
        self.seen.append(token)
        return self._logits(token)


def test_greedy_stops_at_eos_or_the_limit_and_forcing_follows_the_path():
    ends = Scripted({1: 2, 2: 3})  # 1 -> 2 -> 3 -> EOS
    assert runs.greedy_answer(ends, [0, 1], [EOS], 10) == [2, 3, EOS]
    loops = Scripted({1: 2, 2: 1})
    assert runs.greedy_answer(loops, [0, 1], [EOS], 5) == [2, 1, 2, 1, 2]
    lp = runs.forced_logprobs(loops, [0, 1], [5, 6, 4])
    assert lp.shape == (3, V) and np.allclose(np.exp(lp).sum(-1), 1)
    assert loops.seen == [0, 1, 5, 6]  # the path's tokens fed, not its own picks
    job = {"prompts": [{"ids": [0, 1], "path": [2, 1]}], "eos": [EOS], "max_new_tokens": 4}
    out = runs.answer_all(loops, job)
    assert out["answers"] == [[2, 1, 2, 1]] and out["logprobs"].shape == (2, V)


def test_an_answer_is_right_by_a_word_in_its_head():
    assert correct("The capital of France is Paris.", [r"Paris"])
    assert not correct("Parisian food is famous.", [r"Paris"])  # a word, not a prefix
    assert correct("It has 8 legs.", [r"eight", r"8"]) and not correct("It has 18 legs.", [r"8"])
    assert not correct("x" * 200 + " Paris", [r"Paris"])  # past the judged head


def test_counts_loops_and_cuts():
    limit = 40
    answers = [[5] * 3 + [EOS], [1, 2, 3] * 13 + [4], [9] * 40] + [[EOS]] * 17
    texts = ["The capital of France is Paris.", "no", "la la la"] + [""] * 17
    got = score(answers, texts, {EOS}, limit)
    assert (got["correct"], got["looped"], got["cut_without_loop"]) == (1, 1, 1)
    assert got["answers"][2]["loop_period"] == 1 and got["correct_and_ended"] == 1


def test_kl_top1_and_margins():
    ref = np.log(np.array([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1], [0.6, 0.2, 0.2]]))
    same = fidelity(ref, ref, [[0, 1], [0]])
    assert same["kl_mean"] == pytest.approx(0) and same["top1"] == 3
    other = ref[[0, 2, 1]]  # the second prompt's first position swapped
    got = fidelity(ref, other, [[0, 1], [0]])
    assert got["top1"] == 1 and got["first_token_top1"] == 1 and got["kl_mean"] > 0
    assert margins(ref, [[0, 1], [0]]) == [round(float(np.log(0.5 / 0.3)), 4),
                                           round(float(np.log(0.6 / 0.2)), 4)]


def test_checks_read_the_default_precision():
    def system(right, looped, readme_ok=True):
        rows = [{"correct": readme_ok, "cut": not readme_ok, "text": "..."}]
        return {"correct": right, "looped": looped, "answers": rows}

    report = {"systems": {"transformers fp32": system(15, 2),
                          "llm-onnx fp32 greedy": system(15, 2),
                          "llm-onnx int8 greedy": system(13, 3, readme_ok=False)}}
    small = [c["status"] for c in checks(report, PRESETS["smollm2_135m"])]
    assert small == ["MET", "MET", "MET"]
    # a model above the limit is checked at int8: here it loops more and answers less
    assert [c["status"] for c in checks(report, PRESETS["qwen3_8b"])] == ["MISS", "MISS", "MISS"]
    del report["systems"]["llm-onnx int8 greedy"]
    assert checks(report, PRESETS["qwen3_8b"]) == []  # not measured: nothing to check
    assert len(PROMPTS) == 20 and PROMPTS[0][0] == "What is the capital of France?"

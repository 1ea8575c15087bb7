"""The load test's verdicts at 8 clients (python -m benchmarks.serving.load): issue 42's 2.0x
llama-server, 3x our batch-1 decode, and a p99 time to first token no worse than
llama-server's."""

from __future__ import annotations

import pytest

from benchmarks.serving.load_report import verdicts


def _results(ours: float, peer: float, ttft_ours: float = 1.0, ttft_peer: float = 2.0) -> dict:
    return {"runs": [{"system": "llm-onnx", "precision": "int8", "clients": 8,
                      "aggregate_tok_s": ours, "ttft_p99_s": ttft_ours},
                     {"system": "llama-server", "precision": "q8_0", "clients": 8,
                      "aggregate_tok_s": peer, "ttft_p99_s": ttft_peer}],
            "baseline": {"int8": {"decode_tok_s": 100.0}}}


@pytest.mark.parametrize("ours, expected", [(300.0, ["MET ", "MET ", "MET "]),
                                            (290.0, ["MISS", "MISS", "MET "])])
def test_the_serving_targets(ours, expected):
    lines = verdicts(_results(ours, 150.0))
    assert [line[:4] for line in lines] == expected
    assert ">= 2.0x llama-server" in lines[1]
    slow_first_token = verdicts(_results(ours, 150.0, ttft_ours=3.0))
    assert slow_first_token[2].startswith("MISS")
    assert verdicts({"runs": [], "baseline": {}}) == [
        "targets: no int8 run at 8 clients"]

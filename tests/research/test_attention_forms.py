"""research/attention_forms.py: every form of decode attention it times must compute what numpy
computes over the same cache (the benchmark's own check, tested here against a second reference),
and its command line must refuse what it cannot run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from research import attention_forms


@pytest.fixture(scope="module")
def forms():
    return attention_forms


def test_the_reference_is_softmax_attention(forms):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 4, 8))
    keys, values = rng.standard_normal((2, 1, 2, 5, 8))
    got = forms.reference(q, keys, values, [3])
    for head in range(4):  # heads 0-1 read KV head 0, heads 2-3 KV head 1
        k, v = keys[0, head // 2, :3], values[0, head // 2, :3]
        s = k @ q[0, head] / np.sqrt(8)
        np.testing.assert_allclose(got[0, head], np.exp(s) / np.exp(s).sum() @ v, rtol=1e-12)


@pytest.mark.parametrize("case", [(1, 5, 16), (3, 17, 24)])
def test_every_form_attends_as_numpy(forms, case):
    rows = forms.measure(4, 2, 16, [case], rounds=1, threads=1)
    assert [r["form"] for r in rows] == list(forms.FORMS)
    for r in rows:
        assert r["max_err"] < 1e-4, r
        assert r["median_us"] > 0


def test_the_command_writes_json_and_refuses_bad_cases(forms, tmp_path, capsys):
    out = tmp_path / "a.json"
    forms.main(["--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--case", "2,3,8",
                "--rounds", "1", "--threads", "1", "--forms", "gqa,matmul-exact",
                "--json", str(out)])
    saved = json.loads(out.read_text())
    assert [r["form"] for r in saved["rows"]] == ["gqa", "matmul-exact"]
    assert saved["rows"][0]["vs_gqa"] == 1.0
    for bad, says in ((["--case", "2,8,8"], "buffer longer"), (["--case", "2,8"], "rows,context"),
                      (["--forms", "gqa,flash"], "unknown flash"),
                      (["--heads", "5", "--kv-heads", "2"], "not a multiple")):
        with pytest.raises(SystemExit):
            forms.main(bad)
        assert says in capsys.readouterr().err

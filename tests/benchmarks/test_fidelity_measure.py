"""The teacher-forced fidelity measure of the peer comparison (benchmarks/peers/fidelity.py):
KL(reference || system) and top-1 matches, against a direct numpy computation."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.peers import fidelity


def _setup(tmp_path: Path, seed: int = 0, vocab: int = 50, tokens: int = 6):
    rng = np.random.default_rng(seed)
    prompts = {"agreement": [{"name": "a", "ids": [1, 2, 3]}],
               "fidelity": [{"name": "t1", "ids": [4, 5]}], "speed": {"ids": [1]}}
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    ref_logits = rng.normal(size=(2, tokens, vocab)) * 3
    paths = ref_logits.argmax(-1)
    lp = ref_logits - ref_logits.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    np.savez(tmp_path / "ref.npz", paths=paths, logprobs=lp.astype(np.float32))
    return ref_logits, paths


def _run(tmp_path, system_logits) -> dict:
    fed = []

    def next_logits(ids, path):
        k = len(fed)
        fed.append((list(ids), list(path)))
        yield from system_logits[k]

    args = SimpleNamespace(reference=str(tmp_path / "ref.npz"), prompts=str(tmp_path / "prompts.json"),
                           result=str(tmp_path / "out.json"))
    fidelity.forced_fidelity(args, next_logits)
    out = json.loads((tmp_path / "out.json").read_text())["fidelity"]
    out["fed"] = fed
    return out


def _kl(p_logits, q_logits):
    def logsm(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    lp, lq = logsm(p_logits), logsm(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def test_identical_model_scores_zero_and_every_position(tmp_path):
    ref, paths = _setup(tmp_path)
    out = _run(tmp_path, ref)
    assert out["positions"] == ref.shape[0] * ref.shape[1]
    assert out["top1"] == out["positions"]
    assert abs(out["kl_mean"]) < 1e-6
    # every system is fed the prompt, then the reference's own path
    assert out["fed"][0] == ([1, 2, 3], paths[0].tolist())
    assert out["fed"][1] == ([4, 5], paths[1].tolist())


def test_perturbed_model_matches_numpy_kl_and_counts_flips(tmp_path):
    ref, paths = _setup(tmp_path, seed=1)
    rng = np.random.default_rng(2)
    system = ref + rng.normal(size=ref.shape) * 0.5
    system[0, 2, paths[0, 2]] -= 100.0  # one certain flip
    out = _run(tmp_path, system)
    assert out["kl_mean"] == pytest.approx(_kl(ref, system), rel=1e-5)
    expected = int((system.argmax(-1) == paths).sum())
    assert out["top1"] == expected < out["positions"]
    assert out["top1_per_prompt"] == (system.argmax(-1) == paths).sum(-1).tolist()

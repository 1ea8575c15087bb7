"""The parity tests again with the newest transformers a user's install would take (the suite
pins the one it was written against, constraints.txt): a new release that changes how configs
are saved or how a model computes is seen the day it ships, not by the first user whose
checkpoint it wrote (5.24's per_layer_config did that to Gemma 4).

The newest release is installed, without its dependencies, into a folder of its own and put
ahead of the environment's on the path of a pytest run of the parity tests: transformers against our torch
decoder, configs saved by transformers read back (tests/model). The graphs are traced from our
decoder, whatever transformers is installed, so its exports need not run twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARITY = ["tests/model"]

pytestmark = pytest.mark.install


def test_the_parity_tests_pass_with_the_newest_transformers(tmp_path):
    import transformers

    target = tmp_path / "newest"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--upgrade", "--target", str(target), "transformers"],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    newest = subprocess.run([sys.executable, "-c", "import transformers; print("
                             "transformers.__version__, transformers.__file__)"], env=env,
                            capture_output=True, text=True, check=True).stdout.split()
    assert newest[1].startswith(str(target)), newest  # the run below really takes it
    if newest[0] == transformers.__version__:
        pytest.skip(f"the newest transformers is the pinned one ({newest[0]}); the suite "
                    "itself covers it")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p",
                          "no:cacheprovider", "-q", "-x", "-m", "not install", *PARITY],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, (f"transformers {newest[0]} (pinned: "
                                 f"{transformers.__version__}):\n{run.stdout[-4000:]}")

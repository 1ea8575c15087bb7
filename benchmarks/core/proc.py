"""Children and caches: running a step to completion with its log, running a module of this
package in another environment, stamps that say whether something built earlier is still good,
and how busy the CPU is. Standard library only: the peer workers import it in every venv."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# The repository root: the benchmarks run from a checkout (`python -m benchmarks.NAME`), and a
# child in another venv finds this package through PYTHONPATH.
ROOT = Path(__file__).resolve().parents[2]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class StepFailed(RuntimeError):
    pass


def module_env(env: dict | None = None) -> dict[str, str]:
    """The environment of a child that runs a module of this package (``python -m
    benchmarks...``) from any venv: the repository root first on PYTHONPATH, ``env`` added."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**(env or {}), "PYTHONPATH": path}


def run(cmd: list, logfile: Path, env: dict | None = None, capture: bool = False) -> str:
    """Run a child to completion; its stderr (and stdout unless captured) goes to logfile."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "a") as lf:
        lf.write(f"\n$ {' '.join(map(str, cmd))}\n")
        lf.flush()
        proc = subprocess.run([str(c) for c in cmd], check=False, text=True,
                              stdout=subprocess.PIPE if capture else lf, stderr=lf,
                              env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        tail = logfile.read_text(errors="replace")[-1500:]
        raise StepFailed(f"exit {proc.returncode}: {' '.join(map(str, cmd[:4]))} ...\n"
                         f"--- {logfile} (tail) ---\n{tail}")
    return proc.stdout if capture else ""


def cpu_busy(seconds: float = 1.0) -> float:
    """Share of the CPU used by anything during ``seconds`` while this script waits (Linux):
    the 1-minute load average would still count our own previous measurement."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return values[3] + values[4], sum(values)  # idle + iowait, total
    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except OSError:
        return 0.0
    return round(1 - (idle1 - idle0) / max(1, total1 - total0), 3)


# ----------------------------------------------------------------------------- stamps


def stamp_ok(folder: Path, stamp: dict) -> bool:
    f = folder / ".bench-stamp.json"
    return f.is_file() and json.loads(f.read_text()) == stamp


def write_stamp(folder: Path, stamp: dict) -> None:
    (folder / ".bench-stamp.json").write_text(json.dumps(stamp, indent=1))


def file_id(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "bytes": st.st_size, "mtime": int(st.st_mtime)}


def tree_hash(folder: Path, pattern: str = "*.py", keep=lambda rel: True) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob(pattern)):
        if not keep(f.relative_to(folder).as_posix()):
            continue
        h.update(str(f.relative_to(folder)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def find_package_dir(python: str, package: str) -> Path | None:
    """Where `package` is installed for `python`, without importing it."""
    code = ("import importlib.util as u, sys; s = u.find_spec(sys.argv[1]); "
            "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations "
            "else '')")
    out = subprocess.run([python, "-c", code, package], check=False, capture_output=True,
                         text=True).stdout
    return Path(out.strip()) if out.strip() else None

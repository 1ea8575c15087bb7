"""Transparent huge pages for an export's allocations (glibc's ``glibc.malloc.hugetlb`` tunable).

Most of a big export's system time is page faults: every large tensor is a fresh mapping whose
4 KiB pages the kernel zeroes one fault at a time. With ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``
glibc (2.35+) asks for 2 MiB pages instead where the kernel's THP mode is ``madvise`` or
``always``: a 2-layer cut of gemma4_26b_a4b exported in 167 s instead of 362 (docs/exporting.md).
glibc reads its tunables once, when the process starts, so only a process about to start (or
re-execute itself, as ``llm-onnx export`` does) can get them: ``huge_pages_env`` says what to add
to its environment. Pure Python, no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb"
# Set in the environment of a process started with the tunable added by huge_pages_env: that
# process never adds it again (no re-exec loop, even where glibc drops GLIBC_TUNABLES, as it does
# for setuid programs).
MARKER = "LLM_ONNX_HUGE_PAGES"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_env(environ: Mapping[str, str], thp_mode: str | None,
                   glibc: str | None) -> dict[str, str]:
    """The variables to add to ``environ`` for a process to start with glibc's malloc on
    transparent huge pages; empty when it should not: glibc older than 2.35 or not glibc
    (``glibc``: ``os.confstr("CS_GNU_LIBC_VERSION")``, e.g. "glibc 2.36"; None elsewhere), THP
    mode ``never`` or unknown (``thp_mode``: the text of THP_MODE_FILE, e.g.
    "always [madvise] never"), GLIBC_TUNABLES already saying glibc.malloc.hugetlb (whatever the
    value: ``=0`` is how to opt out for good), or MARKER set (we already did)."""
    if environ.get(MARKER) or not _glibc_has_hugetlb(glibc):
        return {}
    if not thp_mode or not ("[madvise]" in thp_mode or "[always]" in thp_mode):
        return {}
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(t.split("=", 1)[0].strip() == TUNABLE for t in tunables.split(":")):
        return {}
    return {"GLIBC_TUNABLES": f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1",
            MARKER: "1"}


def _glibc_has_hugetlb(glibc: str | None) -> bool:
    name, _, version = (glibc or "").partition(" ")
    try:
        return name == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)
    except ValueError:
        return False


def this_machine() -> tuple[str | None, str | None]:
    """(THP mode text, glibc version) of this machine, for huge_pages_env; None where unknown."""
    try:
        with open(THP_MODE_FILE, encoding="ascii") as f:
            thp_mode: str | None = f.read()
    except OSError:
        thp_mode = None
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):  # not a name this platform knows (macOS, Windows)
        glibc = None
    return thp_mode, glibc


def huge_pages_on(environ: Mapping[str, str]) -> bool:
    """Whether a process started with ``environ`` asked glibc for huge pages (its
    GLIBC_TUNABLES sets glibc.malloc.hugetlb to something other than 0)."""
    values = [t.split("=", 1) for t in environ.get("GLIBC_TUNABLES", "").split(":")]
    return any(len(v) == 2 and v[0].strip() == TUNABLE and v[1].strip() not in ("", "0")
               for v in values)


__all__ = ["MARKER", "TUNABLE", "huge_pages_env", "huge_pages_on", "this_machine"]

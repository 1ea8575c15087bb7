"""When an export's process should start with glibc's huge-page tunable (huge_pages_env), decided
from the environment, the kernel's THP mode and the glibc version alone."""

from __future__ import annotations

import pytest

from llm_onnx.export.hugepages import MARKER, huge_pages_env, huge_pages_on, this_machine

MADVISE, ALWAYS = "always [madvise] never\n", "[always] madvise never\n"
NEVER = "always madvise [never]\n"
ON = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", MARKER: "1"}


@pytest.mark.parametrize("thp", [MADVISE, ALWAYS])
def test_added_where_glibc_and_the_kernel_take_it(thp):
    assert huge_pages_env({"PATH": "/bin"}, thp, "glibc 2.36") == ON
    assert huge_pages_env({}, thp, "glibc 2.35") == ON


def test_appended_to_other_tunables():
    env = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    assert huge_pages_env(env, MADVISE, "glibc 2.39")["GLIBC_TUNABLES"] == \
        "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("environ, thp, glibc", [
    ({}, NEVER, "glibc 2.36"),                                    # THP off
    ({}, None, "glibc 2.36"),                                     # no THP file (not Linux)
    ({}, "", "glibc 2.36"),
    ({}, MADVISE, "glibc 2.34"),                                  # no hugetlb tunable yet
    ({}, MADVISE, "glibc 2.9"),
    ({}, MADVISE, None),                                          # musl, macOS, Windows
    ({}, MADVISE, "musl 1.2"),
    ({}, MADVISE, "glibc x.y"),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, MADVISE, "glibc 2.36"),  # the user's opt-out
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}, MADVISE, "glibc 2.36"),  # their own setting
    ({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1"}, MADVISE,
     "glibc 2.36"),
    ({MARKER: "1"}, MADVISE, "glibc 2.36"),                       # already re-executed
])
def test_nothing_added(environ, thp, glibc):
    assert huge_pages_env(environ, thp, glibc) == {}


def test_the_environment_it_makes_is_on_and_asks_for_nothing_more():
    env = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    assert not huge_pages_on(env)
    env |= huge_pages_env(env, ALWAYS, "glibc 2.36")
    assert huge_pages_on(env) and huge_pages_env(env, ALWAYS, "glibc 2.36") == {}
    assert not huge_pages_on({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert not huge_pages_on({})


def test_this_machine_reads_what_the_decision_needs():
    thp, glibc = this_machine()
    assert thp is None or "[" in thp
    assert glibc is None or isinstance(glibc, str)

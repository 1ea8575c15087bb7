"""Each system measured alone: before every stage of the full-size run, settle() brings the
machine to the same state (an earlier stage's processes ended, the writeback done, a quiet CPU,
the page cache dropped) and records it; and the memory figures of a process (RSS, PSS, anonymous
and file-backed, the peak) from Linux's /proc."""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks.core.proc import cpu_busy, log


def memory(pid: int | str = "self") -> dict[str, float]:
    """MiB: resident and proportional set size, anonymous and file-backed, the peak (VmHWM)."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, *rest = line.split()
            if key in ("Rss:", "Pss:", "Anonymous:", "Pss_Anon:", "Pss_File:"):
                out[key[:-1].lower()] = round(int(rest[0]) / 1024, 1)
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "RssFile:")):
                key, value, _ = line.split()
                out[key[:-1].lower()] = round(int(value) / 1024, 1)
    return out


MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Cached", "Dirty", "Writeback", "AnonPages",
                "Mapped", "SwapTotal", "SwapFree")


MEMINFO = Path("/proc/meminfo")


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def meminfo(path: Path | str = MEMINFO) -> dict[str, float]:
    """MEMINFO_KEYS of a /proc/meminfo text (``path``), in MiB."""
    out: dict[str, float] = {}
    for line in Path(path).read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in MEMINFO_KEYS and rest.split():
            out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


def stray_processes(pid: int | None = None) -> list[dict]:
    """The live (not zombie) descendants of ``pid`` (this process): a worker or server an
    earlier stage left running."""
    pid = os.getpid() if pid is None else pid
    parents: dict[int, tuple[int, str, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        parents[int(d.name)] = (int(rest[1]), rest[0], name)
    found, frontier = [], {pid}
    while frontier:
        children = {p for p, (ppid, _, _) in parents.items() if ppid in frontier}
        found += [{"pid": p, "name": parents[p][2]} for p in sorted(children)
                  if parents[p][1] != "Z"]
        frontier = children
    return found


def big_processes(min_mib: float = 256) -> list[dict]:
    """Other processes on the machine resident at ``min_mib`` MiB or more (this one excluded)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss = int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
        if rss >= min_mib:
            out.append({"pid": int(d.name), "name": fields["Name"].strip(), "rss_mib": round(rss)})
    return sorted(out, key=lambda p: -p["rss_mib"])


def end_strays(strays, sleep=time.sleep) -> list[dict]:
    """SIGTERM what ``strays()`` lists, SIGKILL after 30 s; what there was."""
    import signal

    found = strays()
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        left = strays()
        if not left:
            break
        names = ", ".join(f"{s['name']} ({s['pid']})" for s in left)
        log(f"settle: ending {names}, left by an earlier stage ({sig.name})")
        for s in left:
            try:
                os.kill(s["pid"], sig)
            except ProcessLookupError:
                pass
        for _ in range(int(wait / 0.2)):
            if not strays():
                break
            sleep(0.2)
    return found


def settle(drop: bool = True, label: str = "", *, dirty_max_mib: float = 64,
           dirty_wait_s: float = 300, busy_max: float = 0.10, load_max: float | None = None,
           idle_wait_s: float = 120, meminfo_path: Path | str = MEMINFO,
           drop_path: Path | str = DROP_CACHES, strays=stray_processes, others=big_processes,
           busy=None, loadavg=os.getloadavg, sleep=time.sleep) -> dict:
    """Bring the machine to the same state before each timed stage, and record it:

    1. no process of an earlier stage alive (a server left running is ended, and named);
    2. os.sync(), then wait (up to ``dirty_wait_s``) until Dirty + Writeback are under
       ``dirty_max_mib``: an export or a GGUF just written leaves gigabytes being written back;
    3. wait (up to ``idle_wait_s``) until the CPU is quiet: under ``busy_max`` of it used in a
       second (benchmarks.core.proc.cpu_busy) and the 1-minute load average under ``load_max``
       (half the cores), the previous stage's load having decayed;
    4. sync again and drop the page cache (``drop``; where ``drop_path`` is writable, as root),
       last, so the stage starts with neither the previous stage's files nor its own cached.

    Returns /proc/meminfo's figures (MiB) after all this, whether the cache was dropped, the
    seconds waited, the load average, the CPU share, this process's RSS and other processes
    resident at 256 MiB or more."""
    busy = busy or cpu_busy
    load_max = 0.5 * (os.cpu_count() or 1) if load_max is None else load_max
    start = time.monotonic()
    out: dict = {"strays_ended": end_strays(strays, sleep)}

    os.sync()
    while True:
        m = meminfo(meminfo_path)
        pending = m.get("Dirty", 0) + m.get("Writeback", 0)
        out["dirty_settled"] = pending <= dirty_max_mib
        if out["dirty_settled"] or time.monotonic() - start >= dirty_wait_s:
            break
        log(f"settle{label and ' ' + label}: {pending:.0f} MiB dirty or under writeback")
        sleep(5)
        os.sync()
    out["dirty_wait_s"] = round(time.monotonic() - start, 1)

    idle_start = time.monotonic()
    while True:
        out["cpu_busy"], out["loadavg"] = busy(), [round(x, 2) for x in loadavg()]
        out["idle"] = out["cpu_busy"] <= busy_max and out["loadavg"][0] <= load_max
        if out["idle"] or time.monotonic() - idle_start >= idle_wait_s:
            break
        sleep(4)
    out["idle_wait_s"] = round(time.monotonic() - idle_start, 1)

    os.sync()  # the last step, right before the stage: what others wrote or read meanwhile too
    out["cache_dropped"] = False
    if not drop:
        out["drop_note"] = "kept (--no-drop-caches)"
    else:
        try:
            with open(drop_path, "w") as f:
                f.write("3\n")
            out["cache_dropped"] = True
        except OSError as e:
            out["drop_note"] = f"not dropped: {e}"
            log(f"settle{label and ' ' + label}: page cache {out['drop_note']}")
    out["waited_s"] = round(time.monotonic() - start, 1)
    out["meminfo_mib"] = meminfo(meminfo_path)
    out["bench_rss_mib"] = memory()["rss"]
    out["others"] = others()
    log(f"settle{label and ' ' + label}: {settle_line(out)}")
    return out


def settle_line(s: dict) -> str:
    """One line of what settle() recorded: free memory and page cache before the stage."""
    m = s["meminfo_mib"]
    swap = (f"swap {gib(m['SwapTotal'] - m['SwapFree'])} of {gib(m['SwapTotal'])}"
            if m.get("SwapTotal") else "no swap")
    others = ", ".join(f"{p['name']} {gib(p['rss_mib'])}" for p in s.get("others", []))
    return (f"free {gib(m['MemFree'])} GiB, available {gib(m['MemAvailable'])}, page cache "
            f"{gib(m['Cached'])}, dirty+writeback {gib(m['Dirty'] + m['Writeback'])}, anon "
            f"{gib(m['AnonPages'])}, mapped {gib(m['Mapped'])}, {swap}; cache "
            f"{'dropped' if s['cache_dropped'] else s.get('drop_note', 'kept')}; waited "
            f"{s['waited_s']:.0f} s; load {s['loadavg'][0]:.2f}, CPU busy "
            f"{100 * s['cpu_busy']:.0f}%" + (f"; others: {others}" if others else ""))


def gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.2f}"

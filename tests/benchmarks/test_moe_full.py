"""The full-size run (python -m benchmarks.full_size) measures each system alone: settle() before
every stage ends what an earlier stage left running, waits for the writeback, drops the page cache
and waits for a quiet CPU, and records /proc/meminfo; the table prints that record before each
system's numbers."""

from __future__ import annotations

import os
import subprocess

from benchmarks.full_size import alone, report

MEMINFO = """MemTotal:       24684084 kB
MemFree:        22283816 kB
MemAvailable:   23560964 kB
Buffers:            5528 kB
Cached:          1545136 kB
SwapCached:            0 kB
SwapTotal:             0 kB
SwapFree:              0 kB
Dirty:            {dirty} kB
Writeback:         {wb} kB
AnonPages:        734296 kB
Mapped:            10980 kB
HugePages_Total:       0
"""


def fake_machine(tmp_path, dirty_kb: int, wb_kb: int = 0):
    """A meminfo file whose dirty pages are written back at the first sleep, and a stand-in for
    /proc/sys/vm/drop_caches."""
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO.format(dirty=dirty_kb, wb=wb_kb))
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        path.write_text(MEMINFO.format(dirty=2048, wb=0))

    return path, tmp_path / "drop_caches", sleeps, sleep


def test_settle_waits_for_writeback_drops_the_cache_and_records_meminfo(tmp_path):
    path, drop, sleeps, sleep = fake_machine(tmp_path, dirty_kb=900 * 1024, wb_kb=100 * 1024)
    busy = iter([0.6, 0.02])  # busy at first, then quiet
    s = alone.settle(True, meminfo_path=path, drop_path=drop, strays=list, sleep=sleep,
                        busy=lambda: next(busy), loadavg=lambda: (0.31, 0.5, 0.7), load_max=1.0)
    assert s["meminfo_mib"] == {
        "MemTotal": 24105.6, "MemFree": 21761.5, "MemAvailable": 23008.8, "Cached": 1508.9,
        "SwapTotal": 0.0, "SwapFree": 0.0, "Dirty": 2.0, "Writeback": 0.0, "AnonPages": 717.1,
        "Mapped": 10.7}
    assert s["dirty_settled"] and s["cache_dropped"] and drop.read_text() == "3\n"
    assert s["idle"] and s["cpu_busy"] == 0.02 and s["loadavg"] == [0.31, 0.5, 0.7]
    assert len(sleeps) == 2 and s["strays_ended"] == [] and s["bench_rss_mib"] > 0


def test_settle_records_a_cache_kept_or_not_droppable_and_writeback_not_done(tmp_path):
    path, _, _, sleep = fake_machine(tmp_path, dirty_kb=900 * 1024)
    quiet = {"strays": list, "sleep": sleep, "busy": lambda: 0.0, "loadavg": lambda: (0, 0, 0)}
    kept = alone.settle(False, meminfo_path=path, dirty_wait_s=0, **quiet)
    assert not kept["cache_dropped"] and kept["drop_note"] == "kept (--no-drop-caches)"
    assert not kept["dirty_settled"] and kept["meminfo_mib"]["Dirty"] == 900
    blocked = alone.settle(True, meminfo_path=path, drop_path=tmp_path / "no" / "drop",
                              **quiet)
    assert not blocked["cache_dropped"] and blocked["drop_note"].startswith("not dropped: ")


def test_settle_ends_a_process_an_earlier_stage_left(tmp_path):
    path, drop, _, _ = fake_machine(tmp_path, dirty_kb=0)
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert {"pid": child.pid, "name": "sleep"} in alone.stray_processes()
        others = [p["pid"] for p in alone.big_processes(min_mib=0)]
        assert child.pid in others and os.getpid() not in others
        s = alone.settle(True, meminfo_path=path, drop_path=drop, busy=lambda: 0.0,
                            loadavg=lambda: (0, 0, 0),
                            strays=lambda: [p for p in alone.stray_processes()
                                            if p["pid"] == child.pid])
        assert s["strays_ended"] == [{"pid": child.pid, "name": "sleep"}]
        assert child.wait(5) < 0  # ended by a signal
    finally:
        child.kill()
        child.wait()


def settled(tmp_path, drop: bool) -> dict:
    path, drop_path, _, sleep = fake_machine(tmp_path, dirty_kb=0)
    return alone.settle(drop, meminfo_path=path, drop_path=drop_path, strays=list, others=list,
                           sleep=sleep, busy=lambda: 0.02, loadavg=lambda: (0.31, 0.5, 0.7),
                           load_max=1.0)


def test_table_prints_the_machine_before_each_stage(tmp_path):
    mem = {"rss": 1024.0, "pss": 1024.0, "vmhwm": 2048.0}
    llama = {"load_s": 1.0, "memory_after_load": mem, "memory_after_generate": mem,
             "prompt_ms": 100.0, "prefill_tok_s": 50.0, "decode_tok_s": 12.0,
             "settle": settled(tmp_path, True)}
    row = {"system": "llama-server", "clients": 4, "aggregate_tok_s": 20.0, "ttft_p50_s": 0.1,
           "ttft_p99_s": 0.2, "itl_p50_s": 0.05, "per_request_tok_s": 5.0, "error_count": 0,
           "settle": {**settled(tmp_path, False),
                      "others": [{"pid": 1, "name": "python", "rss_mib": 1536}]}}
    r = {"config": "qwen3_moe_tiny", "layers": 2, "args": {},
         "machine": {"date": "today", "onnxruntime": "1.31.1", "cpus": 2},
         "export": {}, "ours": {}, "llama": {"Q4_0": llama}, "serve": {"Q4_0": [row]}}
    lines = report.table(r).splitlines()
    assert ("- llama.cpp Q4_0: free 21.25 GiB, available 22.47, page cache 1.47, dirty+writeback "
            "0.00, anon 0.70, mapped 0.01, no swap; cache dropped; waited 0 s; load 0.31, "
            "CPU busy 2%") in lines
    assert any(line.startswith("- serve llama-server Q4_0 x4: free 21.25 GiB")
               and "cache kept (--no-drop-caches)" in line
               and line.endswith("; others: python 1.50") for line in lines)
    for stage in ("llama", "serve"):  # a record from before settle(): no such lines
        r[stage] = {k: ([{**x, "settle": None} for x in v] if isinstance(v, list)
                        else {**v, "settle": None}) for k, v in r[stage].items()}
    assert not any(line.startswith("- ") for line in report.table(r).splitlines())

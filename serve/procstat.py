"""Process figures from Linux /proc for benchmarks and tests: CPU seconds of a process and
of each of its threads, the machine's idle and stolen shares, and sampled peaks of anonymous
and file-backed resident memory (the kernel keeps a peak only of their sum, VmHWM).

Linux only; a process that has ended reads as nothing (an empty dict, NaN or zero).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Final

__all__ = [
    "MEMORY_FIELDS",
    "MemorySampler",
    "cpu_s",
    "cpu_ticks",
    "machine_note",
    "memory_kb",
    "peak_rss_mb",
    "stat_cpu_s",
    "thread_cpu_s",
]


def stat_cpu_s(stat: str) -> float:
    """utime + stime, seconds, of a /proc .../stat line (a process's or one thread's)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds (load-independent cost)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat").read_text())


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (thread name, utime + stime seconds) of each of a process's threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (stat[stat.index("(") + 1 : stat.rindex(")")], stat_cpu_s(stat))
    return out


def cpu_ticks() -> list[int]:
    """The machine's CPU time counters (/proc/stat `cpu` line: user nice system idle iowait
    irq softirq steal ...), in clock ticks summed over all CPUs."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def machine_note(before: list[int], after: list[int]) -> str:
    """How much of the machine the run had: idle and hypervisor-stolen shares of all CPUs'
    time over the run. On a shared VM, steal (and neighbours' load, which shows up as the
    same work taking more CPU time) moves this bench's figures by ~30% between runs."""
    d = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(d[:8]) or 1
    return f"machine during the run: {100 * d[3] / total:.0f}% idle, {100 * d[7] / total:.0f}% stolen by the hypervisor"


def peak_rss_mb(pid: int, field: str = "VmHWM") -> float:
    """Peak RSS (VmHWM) or another /proc status field of a process, MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


MEMORY_FIELDS: Final = ("RssAnon", "RssFile", "RssShmem")


def memory_kb(pid: int, fields: tuple[str, ...] = MEMORY_FIELDS) -> dict[str, int]:
    """`fields` of /proc/PID/status (default RssAnon, RssFile, RssShmem) now, kB. OSError
    when the process is gone."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in fields:
            out[name] = int(rest.split()[0])
    return out


class MemorySampler:
    """Samples a process's RssAnon / RssFile / RssShmem every `every_s` seconds on a thread
    and keeps each one's peak (the kernel keeps a peak only of their sum, VmHWM). A peak
    shorter than `every_s` can be missed; at 10 ms a sample costs ~0.2% of a core."""

    def __init__(self, pid: int, every_s: float = 0.01) -> None:
        self.pid, self.every_s = pid, every_s
        self.peak_kb = dict.fromkeys(MEMORY_FIELDS, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def _sample(self) -> None:
        with contextlib.suppress(OSError, ValueError, IndexError):  # the process ended
            for name, kb in memory_kb(self.pid).items():
                self.peak_kb[name] = max(self.peak_kb[name], kb)

    def _run(self) -> None:
        self._sample()
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def peak_mb(self, name: str) -> float:
        return self.peak_kb[name] / 1024

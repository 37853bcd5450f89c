"""Other work on the machine while a config is timed: the CPU time that every process but this one
and its children used (and, on a virtual machine, the time the host stole), in cores, from Linux's
/proc. A config timed beside a test suite or another job reads slow, and more at small chunks (more
calls, each waiting for a core): the memory spec's rows of one EPYC, timed beside other work, read
1.1-1.9x today's TTFT, the most at 128 tokens. The profiler re-measures such a config and records
the figure in every row (`foreign_cores`); training leaves out the rows above the dataset's limit
(store.dataset.contended)."""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC = Path("/proc")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _machine_ticks() -> int | None:
    """Busy ticks of every CPU since boot (user, nice, system, irq, softirq, steal; idle and iowait
    are not), None without /proc."""
    try:
        fields = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return user + nice + system + irq + softirq + steal  # guest time is already in user


def _own_ticks() -> int:
    """Ticks this process, its live descendants and the children they reaped have used."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        after = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces: fields after it
        pid = int(entry.name)
        parents[pid] = int(after[1])
        ticks[pid] = sum(int(v) for v in after[11:15])  # utime, stime, cutime, cstime
    mine, total = {os.getpid()}, 0
    grown = True
    while grown:  # descendants, generation by generation
        more = {pid for pid, parent in parents.items() if parent in mine} - mine
        grown, mine = bool(more), mine | more
    for pid in mine:
        total += ticks.get(pid, 0)
    return total


class ForeignLoad:
    """`with ForeignLoad() as load: ...`, then `load.cores`: the cores other work kept busy, on
    average, while the block ran (None where /proc cannot tell)."""

    def __enter__(self) -> ForeignLoad:
        self.cores: float | None = None
        self._machine, self._own, self._t0 = _machine_ticks(), _own_ticks(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        machine, elapsed = _machine_ticks(), time.monotonic() - self._t0
        if machine is None or self._machine is None or elapsed <= 0:
            return
        foreign = (machine - self._machine) - (_own_ticks() - self._own)
        self.cores = max(0.0, foreign * _TICK_S / elapsed)

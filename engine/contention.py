"""Other work on the machine while a config is timed: the CPU time that every process but this one
and its children used (and, on a virtual machine, the time the host stole), in cores, from Linux's
/proc. A config timed beside a test suite or another job reads slow, and more at small chunks (more
calls, each waiting for a core). The profiler re-measures such a config and records the figure in
every row (`foreign_cores`); training leaves out the rows above the dataset's limit
(store.dataset.contended_limit). A machine's descriptors measured beside other work are not cached
(engine.hardware.descriptors)."""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC = Path("/proc")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
# the counters are whole ticks, each process's rounded down and the machine's sampled: a few ticks of
# other work are rounding, not work (a short config's 100 ms would read 0.3 cores from three)
ROUNDING_TICKS = 4


def _machine_ticks() -> int | None:
    """Busy ticks of every CPU since boot (user, nice, system, irq, softirq, steal; idle and iowait
    are not), None without /proc."""
    try:
        fields = (PROC / "stat").read_text().split("\n", 1)[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    except (OSError, ValueError):
        return None
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
            after = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces: fields after it
            parents[int(entry.name)] = int(after[1])
            ticks[int(entry.name)] = sum(int(v) for v in after[11:15])  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):  # gone since the listing
            continue
    mine, grown = {os.getpid()}, True
    while grown:  # descendants, generation by generation
        more = {pid for pid, parent in parents.items() if parent in mine} - mine
        grown, mine = bool(more), mine | more
    return sum(ticks.get(pid, 0) for pid in mine)


class ForeignLoad:
    """`with ForeignLoad() as load: ...`, then `load.cores`: the cores other work kept busy, on
    average, while the block ran (None where /proc cannot tell)."""

    def __enter__(self) -> ForeignLoad:
        self.cores: float | None = None
        self._machine = _machine_ticks()
        self._own = 0 if self._machine is None else _own_ticks()
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        machine, elapsed = _machine_ticks(), time.monotonic() - self._t0
        if machine is None or self._machine is None or elapsed <= 0:
            return
        foreign = (machine - self._machine) - (_own_ticks() - self._own) - ROUNDING_TICKS
        self.cores = max(0, foreign) * _TICK_S / elapsed

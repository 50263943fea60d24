"""Where a sweep's CPU time goes, and the speed-up ``-j N`` can reach from it (issue 22,
target 7): measured in CPU seconds, so that it can be checked on a machine other jobs load.

* ``SweepCpu`` (``SweepResult.cpu``): this process's CPU seconds per phase of the sweep
  (``time.process_time``, all its threads: the executor's result thread counts in ``run``),
  each job's own CPU seconds (``time.process_time`` around one capture or one point's
  replay, in whichever process ran it: Arrow's threads count; in this process, so does the
  executor's result thread meanwhile) and whether it ran here, and the workers' CPU seconds
  (``RUSAGE_CHILDREN`` once they are reaped: start-up, imports and idling included).
  ``serial_s`` is this process's CPU outside jobs: the part no worker can take.
* ``schedule(jobs, n)``: the wall time ``n`` processes take over the jobs by the sweep's
  policy (each free process takes the first ready job in preference order; a job waits for
  the jobs it comes ``after``; workers free from ``start_s``): ``predict`` adds the serial
  part. With the jobs' CPU times measured at ``-j 1``, ``total_s / predict(cpu, 2)`` is the
  speed-up ``-j 2`` reaches where each process has a core and a job costs what it cost
  alone; ``total_s / (serial_s + jobs_s / n)`` is Amdahl's bound for perfectly balanced jobs.
"""

from __future__ import annotations

import heapq
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["JobCpu", "SweepCpu", "Clock", "schedule", "predict", "children_cpu_s"]

#: a forked worker is up this long after the sweep asks for it (measured ~0.03 s)
FORK_START_S = 0.03


@dataclass(frozen=True)
class JobCpu:
    """One job of a sweep: ``kind`` capture or point, its index among those, its CPU
    seconds, whether this process ran it, and the jobs (indices in ``SweepCpu.jobs``) that
    must end before it starts."""
    kind: str
    index: int
    cpu_s: float
    here: bool = True
    after: tuple[int, ...] = ()


@dataclass
class SweepCpu:
    """CPU seconds of one sweep (see the module docstring). ``jobs`` is in the order ``-j N``
    prefers them (captures in config order, then points largest first), whatever order
    ``-j 1`` ran them in."""
    phases: dict[str, float] = field(default_factory=dict)
    jobs: list[JobCpu] = field(default_factory=list)
    workers_s: float = 0.0

    @property
    def here_s(self) -> float:
        """This process's CPU seconds, all phases."""
        return sum(self.phases.values())

    @property
    def total_s(self) -> float:
        """This process's and the workers' CPU seconds."""
        return self.here_s + self.workers_s

    @property
    def jobs_s(self) -> float:
        return sum(j.cpu_s for j in self.jobs)

    @property
    def serial_s(self) -> float:
        """This process's CPU outside its jobs (planning, pinning, dispatch, writing)."""
        return max(0.0, self.here_s - sum(j.cpu_s for j in self.jobs if j.here))

    def as_json(self) -> dict[str, object]:
        return {"phases": {k: round(v, 4) for k, v in self.phases.items()},
                "workers_s": round(self.workers_s, 4),
                "jobs": [{"kind": j.kind, "index": j.index, "cpu_s": round(j.cpu_s, 4),
                          "here": j.here, "after": list(j.after)} for j in self.jobs]}


class Clock:
    """This process's CPU seconds charged to named phases: ``lap(phase)`` charges the time
    since the previous lap (or the start) to ``phase``."""

    def __init__(self, cpu: SweepCpu) -> None:
        self.cpu = cpu
        self._t = time.process_time()

    def lap(self, phase: str) -> None:
        t = time.process_time()
        self.cpu.phases[phase] = self.cpu.phases.get(phase, 0.0) + t - self._t
        self._t = t


def children_cpu_s() -> float:
    """CPU seconds of this process's reaped child processes so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def schedule(jobs: Sequence[JobCpu], n: int, start_s: float = FORK_START_S) -> float:
    """Wall seconds from the first job to the last one's end on ``n`` processes (this one
    free at 0, ``n - 1`` workers from ``start_s``): whenever a process is free it takes the
    first job, in list order, whose ``after`` jobs have ended (as ``Pool.run`` hands them
    out); a job costs its ``cpu_s``. (Quadratic in the jobs: for benchmarks, not for
    sweeps of 100,000 points.)"""
    free = [(0.0, 0)] + [(start_s, k) for k in range(1, n)]    # (free at, process)
    heapq.heapify(free)
    end: dict[int, float] = {}
    todo = list(range(len(jobs)))
    last = 0.0
    while todo:
        t, proc = heapq.heappop(free)
        i = next((i for i in todo
                  if all(a in end and end[a] <= t for a in jobs[i].after)), -1)
        if i < 0:           # nothing ready: wait for the next job to end
            later = [e for e in end.values() if e > t]
            if not later:
                raise ValueError("schedule: a job waits on one that never starts")
            heapq.heappush(free, (min(later), proc))
            continue
        todo.remove(i)
        end[i] = t + jobs[i].cpu_s
        last = max(last, end[i])
        heapq.heappush(free, (end[i], proc))
    return last


def predict(cpu: SweepCpu, n: int, start_s: float = FORK_START_S) -> float:
    """Wall seconds of the sweep on ``n`` idle cores: its serial part plus ``schedule``."""
    return cpu.serial_s + (schedule(cpu.jobs, n, start_s) if n > 1 else cpu.jobs_s)

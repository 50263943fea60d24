# cython: boundscheck=False, wraparound=False
# (compiled: every index is in range by construction; interpreted, every index is checked)
"""SimPy's event queue with its entries typed, for the compiled core.

SimPy keeps its pending events in a heap of ``(time, priority, event id, event)`` tuples
(``Environment.schedule``, ``Environment.step``). Ordering two of them compares the tuples
item by item through Python's rich comparison: at ~34 comparisons per replayed op, ~11 k
instructions of a fast-mode op's ~155 k, plus a tuple made and freed per event.
``EventQueue`` keeps the same entries as columns (the times as C doubles, priority and id
packed in one C integer, the events in a list) in a binary heap of its own, so a comparison
is two C comparisons. Its order is SimPy's exactly: the id is unique, so ``(time, priority,
id)`` is a total order and every heap pops the same sequence.

``Env`` is ``simpy.Environment`` with its ``schedule``, ``peek`` and ``step`` on an
``EventQueue`` (SimPy's extension point: ``simpy.rt.RealtimeEnvironment`` overrides ``step``
too); its events, processes and ``run`` are SimPy's, unchanged. It runs where the compiled
core does (``fabric.core.environment``: compiled as ``_eventq_c``, typed by ``eventq.pxd``);
the heap as plain Python loops would be slower than ``heapq``'s C, so where the core is pure
Python, and in flit mode (the reference), the environment is SimPy's own with its list heap
as a ``HeapQueue``: the same ``push`` for the replay's own timers (``stations.Server``,
``cpu.Cpu``, ``fabric.events.after``), pushed as ``Environment.schedule`` does.
"""

from __future__ import annotations

from array import array
from heapq import heappush
from typing import Any

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, URGENT

__all__ = ["EventQueue", "HeapQueue", "Env", "plain_env"]

_PRIO_SHIFT = 56            # a packed key: (priority + _PRIO_BIAS) << 56 | event id
_PRIO_BIAS = 8              # priorities -8 .. 7 (SimPy uses -1, URGENT 0 and NORMAL 1)
_ID_MASK = 0xFF_FFFF_FFFF_FFFF      # the low 56 bits (a literal: C-typed when compiled)
_CAP0 = 1024


class HeapQueue(list):
    """SimPy's own heap (a list of ``(time, priority, id, event)``, which ``Environment.step``
    pops) with ``push``: ``Environment.schedule`` for an event at an absolute time."""

    def __init__(self, eid: Any) -> None:
        super().__init__()
        self.eid = eid          # the environment's id counter (``Environment._eid``)

    def push(self, t: float, prio: int, ev: Any) -> None:
        heappush(self, (t, prio, next(self.eid), ev))


def plain_env() -> simpy.Environment:
    """SimPy's ``Environment``, its heap a ``HeapQueue``."""
    env = simpy.Environment()
    env._queue = HeapQueue(env._eid)
    return env


def _grown(a: array, cap: int) -> array:
    """A new array of ``cap`` zeros of ``a``'s type starting with ``a``."""
    b = array(a.typecode, bytes(a.itemsize * cap))
    b[:len(a)] = a
    return b


class EventQueue:
    """A binary heap of scheduled events: ``n`` entries, entry ``i`` the time ``t[i]``, the
    key ``k[i]`` (priority and id packed: ``push``) and the slot ``ix[i]`` of its event in
    ``evs``; the root at 0, the children of ``i`` at ``2 i + 1`` and ``2 i + 2``. The sifts
    move C numbers only: an event stays in its slot until popped, and a freed slot (``fr[:nf]``)
    takes the next one. Each array is replaced by one twice as large when full (one with a
    typed view on it cannot be resized)."""
    __slots__ = ("_at", "t", "_ak", "k", "_ai", "ix", "_af", "fr", "evs", "n", "nf", "cap",
                 "eid")

    def __init__(self) -> None:
        self._at = array("d", bytes(8 * _CAP0))
        self.t: Any = self._at
        self._ak = array("q", bytes(8 * _CAP0))
        self.k: Any = self._ak
        self._ai = array("q", bytes(8 * _CAP0))
        self.ix: Any = self._ai
        self._af = array("q", bytes(8 * _CAP0))
        self.fr: Any = self._af
        self.evs: list[Any] = []
        self.n = 0
        self.nf = 0
        self.cap = _CAP0
        self.eid = 0

    def __len__(self) -> int:
        return self.n

    def _grow(self) -> None:
        cap = 2 * self.cap
        self._at = _grown(self._at, cap)
        self._ak = _grown(self._ak, cap)
        self._ai = _grown(self._ai, cap)
        self._af = _grown(self._af, cap)
        self.t, self.k, self.ix, self.fr = self._at, self._ak, self._ai, self._af
        self.cap = cap

    def push(self, t: float, prio: int, ev: Any) -> None:
        """Schedule ``ev`` at time ``t`` with priority ``prio`` (the next event id is its)."""
        if not -_PRIO_BIAS <= prio < _PRIO_BIAS:
            raise ValueError(f"event priority {prio} outside -{_PRIO_BIAS}..{_PRIO_BIAS - 1}")
        key = ((prio + _PRIO_BIAS) << _PRIO_SHIFT) | self.eid
        self.eid += 1
        if self.n == self.cap:
            self._grow()
        if self.nf:                         # a freed slot (there are at most cap slots)
            self.nf -= 1
            slot = self.fr[self.nf]
            self.evs[slot] = ev
        else:
            slot = len(self.evs)
            self.evs.append(ev)
        i = self.n
        self.n += 1
        while i > 0:                        # up while the parent is later
            p = (i - 1) >> 1
            tp = self.t[p]
            if tp < t or (tp == t and self.k[p] < key):
                break
            self.t[i] = tp
            self.k[i] = self.k[p]
            self.ix[i] = self.ix[p]
            i = p
        self.t[i] = t
        self.k[i] = key
        self.ix[i] = slot

    def peek(self) -> float:
        """The time of the next event (infinity if none)."""
        return self.t[0] if self.n else float("inf")

    def pop(self, env: Any) -> Any:
        """Remove the next event and return it, ``env._now`` set to its time;
        ``EmptySchedule`` if there is none."""
        n = self.n
        if not n:
            raise EmptySchedule
        env._now = self.t[0]
        slot = self.ix[0]
        ev = self.evs[slot]
        self.evs[slot] = None
        self.fr[self.nf] = slot
        self.nf += 1
        n -= 1
        self.n = n
        if n:
            t = self.t[n]
            key = self.k[n]
            slot = self.ix[n]
            i = 0
            while True:                     # the last entry down from the root
                c = 2 * i + 1
                if c >= n:
                    break
                tc = self.t[c]
                if c + 1 < n:
                    tr = self.t[c + 1]
                    if tr < tc or (tr == tc and self.k[c + 1] < self.k[c]):
                        c += 1
                        tc = tr
                if t < tc or (t == tc and key < self.k[c]):
                    break
                self.t[i] = tc
                self.k[i] = self.k[c]
                self.ix[i] = self.ix[c]
                i = c
            self.t[i] = t
            self.k[i] = key
            self.ix[i] = slot
        return ev

    def entries(self) -> list[tuple[float, int, int, Any]]:
        """The entries as SimPy's heap holds them, ``(time, priority, id, event)``, in the
        order they will be popped (for tests and inspection)."""
        got = [(self.t[i], (self.k[i] >> _PRIO_SHIFT) - _PRIO_BIAS, self.k[i] & _ID_MASK,
                self.evs[self.ix[i]]) for i in range(self.n)]
        return sorted(got, key=lambda e: (e[0], e[1], e[2]))


class Env(simpy.Environment):
    """``simpy.Environment`` on an ``EventQueue`` (see the module docstring)."""

    def __init__(self, initial_time: float = 0) -> None:
        super().__init__(initial_time)
        self._queue: Any = EventQueue()

    def schedule(self, event: Any, priority: Any = NORMAL, delay: float = 0) -> None:
        self._queue.push(self._now + delay, priority, event)

    def peek(self) -> float:
        return self._queue.peek()

    def step(self) -> None:
        """``Environment.step`` (SimPy 4's, line for line) on the ``EventQueue``."""
        event = self._queue.pop(self)
        callbacks, event.callbacks = event.callbacks, None
        try:
            for callback in callbacks:
                callback(event)
        except StopSimulation:
            event.callbacks = callbacks[callbacks.index(callback) + 1:]
            self.schedule(event, URGENT - 1)
            raise
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


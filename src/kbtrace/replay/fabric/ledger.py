# cython: boundscheck=False, wraparound=False
# (compiled: the indices below are in range by construction; the pure-Python run, whose
# arrays check every index, is the test of that: tests/test_replay_core.py)
"""Fast mode's flow bookings per link as C records: what ``fair`` keeps of each stream a flow
booked on a link, without a Python object per hop.

A flow books one stream per link of its path (~36 on ``default.yaml``), but at most ~1.5% of
them are ever read again (a later stream meeting it there, ``fair.incumbents``; its own move,
``fair._push``); the rest are scanned and dropped once it has arrived there or completed. So a
flow is named by its slot in ``Slots`` (an index, not a reference: nothing per hop is
reference counted or tracked by the cyclic GC), which keeps per slot and hop five C doubles
(start, lone end, work, tail, and whether its arrival moved: ``note``, ``values``) in one
growable array (``array('d')``, a typed view where compiled), and a link's bookings are
``Recs``: per booking three C doubles (when all of it has arrived there, ``a_end``; the slot;
the hop), both written by one C call as the flow takes the link (``Recs.book``: from
``routes._Plan.take`` where the path is free, the link's ``Recs`` held by the plan, else from
``fair.book``). Once ``fair`` made a record object for a hop (``fair.Booked``, in ``Flow.links[j]``)
its values are the object's; a move of its arrival (``Booked.arrive``) marks the hop
(``moved``) and the slot's state byte (``MOVED``; ``GONE`` once the flow is complete): then
the link reads that hop's ``a_end`` from the object. Dropping is a compaction by a clock
compare (``scan``, ``prune``). A slot is reused only after every link dropped the
bookings of its complete flow (``Slots.recycle``, after ``fair.prune_flows``).

Who holds a node's overhead reservation (~29 per flow, few ever looked up) is written beside
it in the node's ``booking.Spans`` as it is made (``Slots.own``), naming the flow the same way,
by slot, with the slot's serial number (``Slots.sn``: a slot reused by a later flow is not
its; ``Slots.key``), and its head's arrival: two C doubles, no reference held (``Slots.owner``
reads them). Imports nothing of the
package (compiled: ``booking``'s ``Spans`` type).
"""

from __future__ import annotations

from array import array
from typing import Any

from kbtrace.errors import ReplayError
from kbtrace.replay.intervals import TIME_EPS

__all__ = ["FabState", "Slots", "Recs", "DONE", "GONE", "LIVE", "MOVED", "REC", "HOP"]

GONE = 0        # the slot's flow is complete (or the slot is free)
LIVE = 1        # under way, every booking's a_end as booked
MOVED = 2       # under way, the arrival of one of its hops moved (``Slots.moved``), or its
                # tails (``Slots.retimed``)
REC = 3         # doubles per booking on a link: a_end, slot, hop
HOP = 5         # doubles per slot and hop: start, lone end, work, tail, moved (0 / 1)
_CAP0 = 64
SLOTS_MAX = 1 << 20     # flows under way at once (``Slots.key``)
_INF = float("inf")


class FabState:
    """The fast fabric's state that the booking code reads per transfer and hop (a base of
    ``fast.FastFabric``, which fills it in): compiled, an extension type whose fields the
    compiled functions that take it typed (``routes``, ``heads``, ``bodies``, ``fair``) read as
    C struct fields, not as attribute look-ups in the fabric's ``__dict__`` (~100
    instructions each, some 150 per transfer); interpreted, a plain base class. The
    attributes' meanings are ``Fabric``'s and ``FastFabric``'s: ``env``, ``rec``, ``hbm``,
    ``flit_bytes``, ``link_bw``, ``link_prop``, ``node_ov``, ``node_kind``, ``fair``, ``_f``,
    ``link_steps``, ``node_iv``, ``link_flows``, ``link_own``, ``flow_slots``, ``body_in``,
    ``push_depth``, ``held``, ``sends``, ``routes_nb``."""


class Slots:
    """Flows by slot (``flows``, None once complete), their state bytes (``st``), serial
    numbers (``sn``: which flow it is, counting every ``enter``) and their hops' values
    (``hv``: ``HOP`` doubles per hop, ``hops`` hops per slot)."""
    __slots__ = ("flows", "_ast", "st", "_asn", "sn", "serial", "_ahv", "hv", "hops", "free",
                 "gone", "cap")

    def __init__(self) -> None:
        self.flows: list = []
        self._ast = array("b", bytes(_CAP0))
        self.st: Any = self._ast
        self._asn = array("d", bytes(8 * _CAP0))
        self.sn: Any = self._asn
        self.serial = 0
        self.hops = 8
        self._ahv = array("d", bytes(8 * HOP * self.hops * _CAP0))
        self.hv: Any = self._ahv
        self.free: list[int] = []
        self.gone: list[int] = []
        self.cap = _CAP0

    def enter(self, f: Any, hops: int) -> int:
        """A slot for flow ``f`` of ``hops`` hops (it is ``LIVE``)."""
        if hops > self.hops:
            self._layout(self.cap, hops)
        if self.free:
            i = self.free.pop()
            self.flows[i] = f
        else:
            i = len(self.flows)
            if i == SLOTS_MAX:      # (``key``)
                raise ReplayError(f"fast mode: more than {SLOTS_MAX:,} transfers under way at "
                                  f"once; replay with --fidelity fast-fcfs or flit")
            self.flows.append(f)
            if i >= self.cap:
                new = array("b", bytes(2 * self.cap))
                new[:self.cap] = self._ast[:self.cap]
                self._ast = new
                self.st = new
                sn = array("d", bytes(16 * self.cap))
                sn[:self.cap] = self._asn[:self.cap]
                self._asn = sn
                self.sn = sn
                self._layout(2 * self.cap, self.hops)
                self.cap *= 2
        self.st[i] = LIVE
        self.serial += 1
        self.sn[i] = self.serial
        return i

    def _layout(self, cap: int, hops: int) -> None:
        """Room for ``cap`` slots of ``hops`` hops (at least twice as many as before)."""
        if hops > self.hops:
            h = 2 * self.hops
            while h < hops:
                h *= 2
            hops = h
        new = array("d", bytes(8 * HOP * hops * cap))
        w = HOP * self.hops
        for i in range(len(self._ahv) // w):
            new[HOP * hops * i:HOP * hops * i + w] = self._ahv[w * i:w * (i + 1)]
        self._ahv = new
        self.hv = new
        self.hops = hops

    def note(self, i: int, j: int, s: float, e: float, busy: float, tail: float) -> None:
        """Slot ``i``'s flow booked from ``s``, alone until ``e``, ``busy`` ns of work, its
        tail leaving at ``tail``, at its hop ``j``."""
        q = HOP * (self.hops * i + j)
        self.hv[q] = s
        self.hv[q + 1] = e
        self.hv[q + 2] = busy
        self.hv[q + 3] = tail
        self.hv[q + 4] = 0.0

    def values(self, i: int, j: int) -> tuple[float, float, float, float]:
        """What ``note`` noted of slot ``i``'s hop ``j``: ``(start, lone end, work, tail)``."""
        q = HOP * (self.hops * i + j)
        return self.hv[q], self.hv[q + 1], self.hv[q + 2], self.hv[q + 3]

    def leave(self, i: int) -> None:
        """Slot ``i``'s flow completed: its bookings count as gone; the slot is reused after
        the next ``recycle``."""
        self.st[i] = GONE
        self.flows[i] = None
        self.gone.append(i)

    def moved(self, i: int, j: int) -> None:
        """The arrival of slot ``i``'s flow at its hop ``j`` moved (its record object's
        ``a_end`` holds)."""
        self.st[i] = MOVED
        self.hv[HOP * (self.hops * i + j) + 4] = 1.0

    def retimed(self, i: int) -> None:
        """Slot ``i``'s flow's times were taken out to move (``fair._times``): a tail of it
        may now be later than its slot notes (``bodies.hold_bodies`` reads its flow then)."""
        self.st[i] = MOVED

    def moved_at(self, i: int, j: int) -> bool:
        return self.hv[HOP * (self.hops * i + j) + 4] != 0.0

    def key(self, i: int) -> float:
        """Slot ``i``'s flow as one C double: its serial number and slot (exact below 2 ** 53:
        2 ** 33 flows)."""
        return self.sn[i] * SLOTS_MAX + i

    def own(self, iv: Any, i: int, slot: int, a: float) -> None:
        """Slot ``slot``'s flow, its head arriving at ``a``, holds the reservation ``t[i:i + 2]``
        of a node's ``Spans`` ``iv``."""
        iv.own(i, self.key(slot), a)

    def owner(self, iv: Any, i: int, n: int) -> Any:
        """Who holds the reservation ``t[i:i + 2]`` of node ``n``'s ``Spans`` ``iv``: None (no
        flow), the flow (its head arrived as it starts) or ``(flow, hop, arrival)`` (its hop:
        where ``n`` is on its route, which passes a node once); ``DONE`` for a flow complete
        since (its slot left or reused; its hop then -1)."""
        if not iv.owned():
            return None
        x = iv.v[i]
        if x < 0.0:
            return None
        k = int(x)
        sl = k % SLOTS_MAX
        f = self.flows[sl]
        a = iv.v[i + 1]
        if f is None or self.sn[sl] != k // SLOTS_MAX:      # complete since
            return DONE if a == iv.at(i) else (DONE, -1, a)
        if a == iv.at(i):       # its head arrived as it starts (alone)
            return f
        return f, f.rt.nodes.index(n), a

    def recycle(self) -> None:
        """No link holds a booking of a complete flow any more: their slots are free."""
        if self.gone:
            self.free.extend(self.gone)
            self.gone = []


class _Table:
    """A link's bookings' (``Recs``') count: ``n`` entries in C arrays of capacity ``cap``
    (none until the first entry: most links take none), their flows named by slot in the
    fabric's ``Slots`` ``tab``."""
    __slots__ = ("n", "cap", "tab")

    def __init__(self, tab: Slots) -> None:
        self.n = 0
        self.cap = 0
        self.tab = tab

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0


class Recs(_Table):
    """A link's bookings, in the order they were made (see the module docstring)."""
    __slots__ = ("_a", "v")

    def __init__(self, tab: Slots) -> None:
        _Table.__init__(self, tab)
        self._a: Any = None
        self.v: Any = None

    def book(self, slot: int, j: int, s: float, e: float, busy: float, tail: float) -> float:
        """Slot ``slot``'s flow booked this link at its hop ``j`` from ``s``, alone until
        ``e`` at the share ``busy / (e - s)`` (at most 1), its tail leaving at ``tail``: noted
        in its slot (``Slots.note``) and here. Returns when all of it has arrived there
        (``a_end``; ``fair.book``, ``routes._Plan.take``)."""
        r = busy / (e - s)
        if r > 1.0:
            r = 1.0
        a_end = s + busy / r
        self.tab.note(slot, j, s, e, busy, tail)
        n = self.n
        if n == self.cap:
            self._grow()
        q = REC * n
        self.v[q] = a_end
        self.v[q + 1] = slot
        self.v[q + 2] = j
        self.n = n + 1
        return a_end

    def _grow(self) -> None:
        """Room for twice as many bookings."""
        cap = 2 * self.cap if self.cap else _CAP0
        new = array("d", bytes(8 * REC * cap))
        if self.n:
            new[:REC * self.n] = self._a[:REC * self.n]
        self._a = new
        self.v = new
        self.cap = cap

    def slot_at(self, i: int) -> int:
        return int(self.v[REC * i + 1])

    def hop_at(self, i: int) -> int:
        return int(self.v[REC * i + 2])

    def scan(self, slot: int, h: float, now: float) -> list:
        """Drop the bookings of flows complete or all arrived by ``now``; the indices (after
        the drop) of the others arriving after ``h``, slot ``slot``'s excepted, in order."""
        out = []
        hi = h + TIME_EPS
        tab = self.tab
        w = 0
        for i in range(self.n):
            q = REC * i
            sl = int(self.v[q + 1])
            st = tab.st[sl]
            if st == GONE:
                continue
            a = self.v[q] if st == LIVE else self._a_end(q, sl)
            if a <= now:
                continue
            if w < i:           # (moved down: its REC values)
                p = REC * w
                self.v[p] = self.v[q]
                self.v[p + 1] = self.v[q + 1]
                self.v[p + 2] = self.v[q + 2]
            if a > hi and sl != slot:
                out.append(w)
            w += 1
        self.n = w
        return out

    def prune(self, now: float) -> None:
        """Drop the bookings of flows complete or all arrived by ``now`` (``scan`` asking for
        none of the others)."""
        self.scan(-1, _INF, now)

    def _a_end(self, q: int, sl: int) -> float:
        """The ``a_end`` of the booking at ``v[q]``, whose slot ``sl`` is ``MOVED`` (its record
        object's, if this hop's arrival moved)."""
        j = int(self.v[q + 2])
        if self.tab.moved_at(sl, j):
            return self.tab.flows[sl].links[j].a_end
        return self.v[q]


class _Done:
    """What ``Slots.owner`` names where a reservation's flow is complete (its slot left or
    reused): its readers ask only whether it is finished."""
    __slots__ = ()
    fin = True


DONE = _Done()

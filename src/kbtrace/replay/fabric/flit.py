"""Flit mode (the reference): per-flit events through standing link and node processes
(the package docstring describes the model)."""

from __future__ import annotations

from collections import deque
from typing import Any

import simpy

from kbtrace.errors import InvariantError
from kbtrace.replay.fabric.base import Fabric, Transfer
from kbtrace.replay.fabric.events import _Ev, after
from kbtrace.replay.hbm import HbmController
from kbtrace.replay.recorder import Recorder

__all__ = ["FlitFabric"]


class _Fifo:
    """An unbounded FIFO with one getter process: ``simpy.Store``'s event sequence, minus its
    generic machinery (per-request objects with resource bookkeeping, trigger loops).

    The same events are scheduled in the same order as with a ``Store`` (so equal-time ties,
    and every output, are unchanged): ``put`` appends the item and schedules a put event whose
    processing hands the head item to a waiting ``get``, which is then scheduled; ``get``
    returns an event scheduled at once if an item is there, else left waiting.
    """
    __slots__ = ("items", "waiting", "sched", "_hand_cb")

    def __init__(self, env: simpy.Environment) -> None:
        self.items: deque[Any] = deque()
        self.waiting: _Ev | None = None
        self.sched = env.schedule
        self._hand_cb = self._hand

    def put(self, item: Any) -> None:
        self.items.append(item)
        ev = _Ev()
        ev.callbacks = [self._hand_cb]
        ev._ok = True
        ev._value = None
        self.sched(ev)

    def _hand(self, _ev: _Ev) -> None:
        g = self.waiting
        if g is not None and self.items:
            self.waiting = None
            g._ok = True
            g._value = self.items.popleft()
            self.sched(g)

    def get(self) -> _Ev:
        assert self.waiting is None, "a _Fifo has one getter process"
        g = _Ev()
        g.callbacks = []
        if self.items:
            g._ok = True
            g._value = self.items.popleft()
            self.sched(g)
        else:
            g._value = None
            self.waiting = g
        return g



class FlitFabric(Fabric):
    """Reference mode: per-flit events through standing link and node processes."""

    fidelity = "flit"

    def __init__(self, env: simpy.Environment, topo: Any, rec: Recorder,
                 hbm: dict[int, HbmController]) -> None:
        super().__init__(env, topo, rec, hbm)
        self.lstore = [_Fifo(env) for _ in topo.links]
        self.inbox = [_Fifo(env) for _ in topo.nodes]
        for lk in topo.links:
            env.process(self._link_proc(lk.idx, lk.dst))
        for nd in topo.nodes:
            env.process(self._node_proc(nd.idx))

    def _start(self, x: Transfer, ready: list[float] | None) -> None:
        env = self.env
        fb = self.flit_bytes
        nb = x.nbytes
        n = x.n
        put = self.lstore[x.links[0]].put
        flits = []
        for i in range(n):
            sz = fb if nb - i * fb > fb else nb - i * fb
            flits.append(_Flit(x, i, max(sz, 0), x.addr + i * fb))
        if ready is None:
            x.enter[0] = x.hput = env.now
            for f in flits:
                put(f)
            return
        order = sorted(range(n), key=ready.__getitem__)
        groups: list[tuple[float, list[_Flit]]] = []
        for rank, i in enumerate(order):
            f = flits[i]
            f.idx = rank
            t = ready[i]
            if groups and groups[-1][0] == t:
                groups[-1][1].append(f)
            else:
                groups.append((t, [f]))
        x.enter[0] = x.hput = groups[0][0]
        now = env.now

        def put_all(e: simpy.Event) -> None:       # a group's flits, when they are ready
            for f in e.value or ():
                put(f)

        for t, fs in groups:
            if t <= now:
                for f in fs:
                    put(f)
            else:
                env.timeout(t - now, fs).callbacks.append(put_all)

    def _after(self, delay: float, value: Any = None) -> _Ev:
        return after(self.env, delay, value)

    def _link_proc(self, li: int, dst: int):
        env = self.env
        get = self.lstore[li].get
        bw = self.link_bw[li]
        prop = self.link_prop[li]
        deliver = self._deliver
        after = self._after
        last_start = 0.0
        while True:
            f = yield get()
            now = env.now
            if now < last_start:  # pragma: no cover - SimPy time never goes back
                raise InvariantError(f"link {li}: service start {now} < previous {last_start}")
            last_start = now
            x = f.x
            if f.idx == 0:
                x.queue[f.pos] += now - x.hput
            if bw > 0 and f.nbytes > 0:
                yield after(f.nbytes / bw)
            if prop > 0:
                after(prop, f).callbacks.append(deliver)
            else:
                self._arrive(f)

    def _deliver(self, ev: _Ev) -> None:
        self._arrive(ev._value)

    def _arrive(self, f: _Flit) -> None:
        x = f.x
        pos = f.pos = f.pos + 1
        now = self.env.now
        if f.idx == 0:
            x.enter[pos] = now
        if f.idx == x.n - 1:
            x.leave[pos - 1] = now
        self.inbox[x.nodes[pos]].put(f)

    def _node_proc(self, ni: int):
        env = self.env
        get = self.inbox[ni].get
        ov = self.node_ov[ni]
        lstore = self.lstore
        after = self._after
        while True:
            f = yield get()
            x = f.x
            pos = f.pos
            if f.idx == 0:
                x.queue[pos] += env.now - x.enter[pos]
                if ov > 0:
                    yield after(ov)
            if pos == len(x.links):
                self._terminal(x, f)
            else:
                if f.idx == 0:
                    x.hput = env.now
                lstore[x.links[pos]].put(f)

    def _terminal(self, x: Transfer, f: _Flit) -> None:
        now = self.env.now
        x.got += f.nbytes
        if x.hbm is not None:
            t = x.hbm.commit(f.addr, f.nbytes, now, 1, x.op_id)
            if t > x.last:
                x.last = t
        elif now > x.last:
            x.last = now
        if f.idx == x.n - 1:
            if x.got != x.nbytes:
                raise InvariantError(
                    f"transfer of op {x.op_id} to node {x.nodes[-1]}: {x.got} bytes arrived, "
                    f"{x.nbytes} sent (bytes not conserved)")
            t = x.last
            if t > now:
                self.env.timeout(t - now).callbacks.append(lambda _e: x.finish(t))
            else:
                x.finish(now)


class _Flit:
    __slots__ = ("x", "idx", "nbytes", "addr", "pos")

    def __init__(self, x: Transfer, idx: int, nbytes: int, addr: int) -> None:
        self.x = x
        self.idx = idx
        self.nbytes = nbytes
        self.addr = addr
        self.pos = 0


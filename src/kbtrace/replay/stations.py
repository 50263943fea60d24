"""A PE's stations and servers (``pe`` describes the model and builds them).

A *station* (``Station``) is a FIFO of waiting tokens in front of identical servers;
a server (``Server`` and its kinds: ``Compute`` for TCM fetch / store and the accel
slot, ``DmaReadFast`` / ``DmaWriteFast`` / ``DmaFlit`` for DMA channels, ``Scheduler``,
``Proc`` for IPCQ) is a callback-driven state machine that is itself the SimPy event of
its current service. ``Command`` (one op's plan), ``Token`` (one tile on its way through
the stages) and ``Program`` (a program's ops and its completion event) are what flows
through them. Servers reach their PE (``pe.Pe``, typed ``Any`` here so the import runs one
way: ``pe`` imports this module) for its parameters, stations and the simulation context.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from math import ceil
from typing import Any, Protocol

import simpy
from simpy.events import NORMAL  # the priority of a Timeout

from kbtrace.replay import plans as P
from kbtrace.replay.ops import Op
from kbtrace.replay.recorder import STAGE_CODE

_DMA_READ, _FETCH, _STORE, _GEMM = P.DMA_READ, P.FETCH, P.STORE, P.GEMM
_C_FABRIC, _C_SCHED = STAGE_CODE["fabric"], STAGE_CODE["scheduler"]
_C_FETCH, _C_STORE, _C_GEMM, _C_MATH = (STAGE_CODE[s] for s in ("fetch", "store", "gemm", "math"))

__all__ = ["Command", "command", "Token", "token", "Program", "Station", "Server",
           "StageServer", "Compute", "DmaServer", "DmaReadFast", "DmaWriteFast", "DmaFlit",
           "Scheduler", "Proc"]


class Command:
    """One op's plan on its way through the PE (made by ``command``)."""
    __slots__ = ("op", "op_id", "plan", "left", "t_start", "t_issue")
    op: Op
    op_id: int
    plan: P.Plan
    left: int
    t_start: float
    t_issue: float


def command(op: Op, plan: P.Plan, t_issue: float) -> Command:
    """The command of ``op`` issued at ``t_issue``: no tile started, ``len(plan)`` to go.
    (A factory, not ``__init__``: compiled, one is made per op by the type's allocator and C
    stores instead of a call whose arguments are parsed.)"""
    c = Command.__new__(Command)
    c.op = op
    c.op_id = op.op_id               # (read by every row of its stages)
    c.plan = plan
    c.left = len(plan)
    c.t_start = -1.0
    c.t_issue = t_issue
    return c


class Token:
    """One tile of a command on its way through the stages (made by ``token``)."""
    __slots__ = ("cmd", "tile", "stages", "idx", "t_in")
    cmd: Command
    tile: int
    stages: tuple[P.Stage, ...]
    idx: int
    t_in: float


def token(cmd: Command, tile: int, stages: tuple[P.Stage, ...], t_in: float) -> Token:
    """Tile ``tile`` of ``cmd`` at its first stage, there since ``t_in`` (a factory, as
    ``command``)."""
    tok = Token.__new__(Token)
    tok.cmd = cmd
    tok.tile = tile
    tok.stages = stages
    tok.idx = 0
    tok.t_in = t_in
    return tok


class OpFeed(Protocol):
    """A program's ops in issue order, iterated once (``source.ProgramFeed``, or a list)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Op]: ...


class Program:
    """A program to run: its ops (``n``, issued in the order ``it`` gives them) and the event
    its end succeeds."""
    __slots__ = ("done", "n", "it")

    def __init__(self, ops: OpFeed, done: simpy.Event) -> None:
        self.done = done
        self.n = len(ops)
        self.it = iter(ops)


class Station:
    """FIFO queue in front of identical servers."""
    __slots__ = ("idle", "waiting")

    def __init__(self) -> None:
        self.idle: list[Server] = []
        self.waiting: deque[Any] = deque()

    def submit(self, tok: Any) -> None:
        if self.idle:
            srv = self.idle.pop()
            if not srv.serve(tok):
                srv.drain()
        else:
            self.waiting.append(tok)


class Server:
    """One server of a station, and the SimPy event of its current service.

    ``env.step()`` only needs ``callbacks`` and ``_ok`` of what it pops, so a server
    schedules itself (``_timer``: what ``env.schedule`` does, pushed on the event queue
    here) instead of allocating a ``Timeout`` per service.
    Subclasses implement ``serve(tok)`` (start the service; True if it takes time,
    i.e. its completion will call ``_fire``) and ``route()`` (record the finished
    service, pass the token on; return a token to serve next in place, or None).
    """
    __slots__ = ("callbacks", "_cbl", "_fire_cb", "station", "pe", "env", "rec", "x", "queue",
                 "tok", "t0", "core", "engine_of", "sched_name")
    _ok = True            # a service never fails

    def __init__(self, pe: Any, station: Station) -> None:
        self.pe = pe
        self.env = pe.env
        self.rec = pe.sim.rec
        self.x = self.rec.hop_rows          # (``Recorder.hop`` by stage code: ``x.add``)
        self.queue = pe.env._queue          # (``env.schedule``: ``eventq``)
        self.core = pe.sim.core             # (``opcore.OpCore``: completions, HBM reads)
        self.engine_of = pe.engine_of       # op kind -> the engine its completion names
        self.sched_name = pe.names["scheduler"]
        self.station = station
        self._fire_cb = self._fire
        self._cbl = [self._fire_cb]
        self.callbacks: list[Any] | None = None
        self.tok: Any = None
        self.t0 = 0.0
        station.idle.append(self)

    def _timer(self, delay: float) -> None:
        self.callbacks = self._cbl
        self.queue.push(self.env._now + delay, NORMAL, self)

    def drain(self) -> None:
        """The current service ended at once: serve the next tokens until one takes time."""
        while True:
            tok = self._next()
            if tok is None or self.serve(tok):
                return

    def _fire(self, _ev: Any) -> None:
        """The current service ended: pass its token on, serve the next one."""
        tok = self._next()
        if tok is not None and not self.serve(tok):
            self.drain()

    def _next(self) -> Any:
        """Finish the current service; the token to serve next (in place or queued), or None."""
        tok = self.route()
        if tok is None:
            waiting = self.station.waiting
            if waiting:
                return waiting.popleft()
            self.station.idle.append(self)
        return tok

    def _finish(self, cmd: Command) -> None:
        """``cmd``'s last tile is done (or it had none): its op completes now."""
        t_start = cmd.t_start if cmd.t_start >= 0 else self.env._now
        op = cmd.op
        self.core.complete(op, cmd.t_issue, t_start,
                           self.engine_of.get(op.kind) or self.sched_name)

    def serve(self, tok: Any) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def route(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class StageServer(Server):
    """A server of tile stages: passes a finished token to its next stage's station.

    A stage's fields are read by name (``st.kind``; ``st.a`` / ``st.b``: a DMA stage's address
    and bytes), or unpacked: compiled, an index into a named tuple (a subclass of tuple) is
    CPython's generic ``__getitem__`` slot (a method call with a boxed index, ~5x a field's
    descriptor)."""
    __slots__ = ("stations", "in_place")

    def __init__(self, pe: Any, station: Station, in_place: bool = False) -> None:
        super().__init__(pe, station)
        self.stations = pe.stations
        self.in_place = in_place         # DMA read: consecutive DMA_READ stages stay here

    def _begin(self, tok: Token) -> P.Stage:
        """Start serving ``tok`` now (its command's start time if first); its stage."""
        now = self.env._now
        cmd = tok.cmd
        if cmd.t_start < 0:
            cmd.t_start = now
        self.tok = tok
        self.t0 = now
        return tok.stages[tok.idx]

    def _pass_on(self, tok: Token, now: float) -> Token | None:
        idx = tok.idx = tok.idx + 1
        stages = tok.stages
        if idx == len(stages):
            cmd = tok.cmd
            cmd.left -= 1
            if cmd.left == 0:
                self._finish(cmd)
            return None
        tok.t_in = now
        kind = stages[idx].kind
        if self.in_place and kind == _DMA_READ:
            return tok
        self.stations[kind].submit(tok)
        return None


class Compute(StageServer):
    """TCM read (fetch), TCM write (store) or the accel slot (GEMM and MATH): one timer."""
    __slots__ = ("dur", "fetch_bw", "store_bw", "mac_rows", "mac_cols", "pipe", "gemm_ghz",
                 "lanes", "math_ov", "math_ghz", "n_fs", "n_gemm", "n_math")

    def __init__(self, pe: Any, station: Station) -> None:
        super().__init__(pe, station)
        self.dur = 0.0
        self.fetch_bw, self.store_bw = pe.fetch_bw, pe.store_bw
        g, m = pe.gemm, pe.mathp
        self.mac_rows, self.mac_cols = g.mac_rows, g.mac_cols
        self.pipe, self.gemm_ghz = g.pipeline_cycles, g.clock_ghz
        self.lanes, self.math_ov, self.math_ghz = m.simd_lanes, m.overhead_ns, m.clock_ghz
        self.n_fs, self.n_gemm, self.n_math = pe.n_fs, pe.n_gemm, pe.n_math

    def serve(self, tok: Token) -> bool:
        kind, a, b, c = self._begin(tok)
        if kind == _FETCH:
            dur = a / self.fetch_bw
        elif kind == _STORE:
            dur = a / self.store_bw
        elif kind == _GEMM:
            dur = (ceil(a / self.mac_rows) * ceil(b / self.mac_cols) * c
                   + self.pipe) / self.gemm_ghz
        else:
            dur = max(self.math_ov, ceil(a / self.lanes) * b / self.math_ghz)
        self.dur = dur
        if dur > 0:
            self._timer(dur)
            return True
        return False

    def route(self) -> Token | None:
        tok = self.tok
        now = self.env._now
        kind, a, _b, _c = tok.stages[tok.idx]
        if kind == _FETCH:
            stage, node, nb = _C_FETCH, self.n_fs, a
        elif kind == _STORE:
            stage, node, nb = _C_STORE, self.n_fs, a
        elif kind == _GEMM:
            stage, node, nb = _C_GEMM, self.n_gemm, 0
        else:
            stage, node, nb = _C_MATH, self.n_math, 0
        t_in = tok.t_in
        self.x.add(tok.cmd.op_id, tok.tile, stage, node, -1, t_in, now, self.dur,
                   self.t0 - t_in, nb)
        return self._pass_on(tok, now)


class DmaServer(StageServer):
    """One DMA channel (read or write), held through the whole round trip."""
    __slots__ = ("sim", "fab", "resolved", "n_dma", "setup", "src", "lat", "t_ack", "_data_cb",
                 "_sent_cb", "_stage", "fast", "hbm", "lats")

    def __init__(self, pe: Any, station: Station, read: bool) -> None:
        super().__init__(pe, station, in_place=read)
        self.sim = pe.sim
        self.fab = pe.sim.fabric
        self.resolved = pe.sim._resolved
        self.hbm = pe.sim.hbm
        self.fast = pe.fast
        self.n_dma = pe.n_dma
        self.setup = pe.dma_ov
        self.src = 0
        self.lat = self.t_ack = 0.0
        self._stage = STAGE_CODE["dma_read" if read else "dma_write"]
        #: control-message latencies between this DMA engine and each node it has talked to
        #: (``_cmd_ns``; as many as the nodes at most)
        self.lats: dict[int, float] = {}

    def route(self) -> Token | None:
        tok = self.tok
        now = self.env._now
        st = tok.stages[tok.idx]
        if not self.in_place and self.fast:   # fast write: the ack leg's row
            t_ack, lat = self.t_ack, self.lat
            self.x.add(tok.cmd.op_id, tok.tile, _C_FABRIC, self.src, -1, t_ack,
                       t_ack + lat, 0.0, 0.0, 0)
        t_in, t0 = tok.t_in, self.t0
        self.x.add(tok.cmd.op_id, tok.tile, self._stage, self.n_dma, -1, t_in, now,
                   now - t0, t0 - t_in, st.b)
        return self._pass_on(tok, now)

    def _begin_at(self, tok: Token) -> P.Stage:
        """``_begin`` plus the node owning the stage's address, kept in ``self.src``."""
        st = self._begin(tok)
        addr = st.a
        node = self.resolved.get(addr)
        self.src = node if node is not None else self.sim.resolve(addr)
        return st

    def _cmd_ns(self, node: int) -> float:
        """``fabric.command_ns`` of this engine's control message to / from ``node`` (a read's
        request to its source, a write's ack from its destination), memoised per server."""
        lat = self.lats.get(node)
        if lat is None:
            fab = self.fab
            lat = self.lats[node] = (fab.command_ns(self.n_dma, node) if self.in_place
                                     else fab.command_ns(node, self.n_dma))
        return lat


class DmaReadFast(DmaServer):
    """fast read: one timer (setup + request leg), then the data leg's one fabric event."""
    __slots__ = ()

    def __init__(self, pe: Any, station: Station) -> None:
        super().__init__(pe, station, read=True)
        self._cbl = [self._request_arrived]
        self._data_cb = self._fire_cb

    def serve(self, tok: Token) -> bool:
        self._begin_at(tok)
        lat = self._cmd_ns(self.src)
        t = self.t0 + self.setup
        self.x.add(tok.cmd.op_id, tok.tile, _C_FABRIC, self.n_dma, -1, t, t + lat, 0.0, 0.0,
                   0)
        self._timer(self.setup + lat)
        return True

    def _request_arrived(self, _ev: Any) -> None:
        """The request reached the source: read HBM, book the data transfer back."""
        tok = self.tok
        st = tok.stages[tok.idx]
        op_id, tile, src, addr, nb = tok.cmd.op_id, tok.tile, self.src, st.a, st.b
        if nb <= 0:
            ev = self.fab.command(op_id, tile, src, self.n_dma)
        elif src in self.hbm:
            ev = self.core.hbm_read(op_id, tile, src, self.n_dma, addr, nb)
        else:
            ev = self.fab.send(op_id, tile, src, self.n_dma, nb, addr)
        ev.callbacks.append(self._data_cb)


class DmaWriteFast(DmaServer):
    """fast write: data leg, HBM commit and ack leg are the one ``fabric.send`` event."""
    __slots__ = ()

    def __init__(self, pe: Any, station: Station) -> None:
        super().__init__(pe, station, read=False)
        self._sent_cb = self._sent

    def serve(self, tok: Token) -> bool:
        st = self._begin_at(tok)
        dst = self.src
        lat = self.lat = self._cmd_ns(dst)
        nb = st.b
        if nb > 0:              # (fast mode's send: addr, ready, at, ack)
            ev = self.fab.send(tok.cmd.op_id, tok.tile, self.n_dma, dst, nb, st.a,
                               None, self.t0 + self.setup, lat)
            ev.callbacks.append(self._sent_cb)
        else:
            self.t_ack = self.t0 + self.setup
            self._timer(self.setup + lat)
        return True

    def _sent(self, ev: simpy.Event) -> None:
        self.t_ack = ev._value          # fabric.send's event (fabric.after): its value
        self._fire(ev)


class DmaFlit(DmaServer):
    """flit DMA: setup, then the per-flit legs (``Sim.dma_read`` / ``dma_write``) as a process."""
    __slots__ = ()

    def serve(self, tok: Token) -> bool:
        st = self._begin(tok)
        self.env.process(self._leg(tok.cmd.op_id, tok.tile, st)).callbacks.append(self._fire_cb)
        return True

    def _leg(self, op_id: int, tile: int, st: P.Stage):
        if self.setup > 0:
            yield self.env.timeout(self.setup)
        leg = self.sim.dma_read if self.in_place else self.sim.dma_write
        yield from leg(op_id, tile, self.n_dma, st.a, st.b)


class Scheduler(Server):
    """Scheduler: ``overhead_ns`` per command, then its tiles go to their first stations."""
    __slots__ = ("ov", "n_sched", "stations")

    def __init__(self, pe: Any, station: Station) -> None:
        super().__init__(pe, station)
        self.ov = pe.sched_ov
        self.n_sched = pe.n_sched
        self.stations = pe.stations

    def serve(self, cmd: Command) -> bool:
        self.tok = cmd
        self.t0 = self.env._now
        ov = self.ov
        if ov > 0:
            self._timer(ov)
            return True
        return False

    def book(self, cmd: Command, t0: float) -> None:
        """Serve ``cmd`` from ``t0`` (a dispatch end, ``>= now``); the server was idle."""
        self.tok = cmd
        self.t0 = t0
        self._timer(t0 + self.ov - self.env._now)

    def route(self) -> None:
        cmd = self.tok
        now = self.env._now
        self.x.add(cmd.op_id, -1, _C_SCHED, self.n_sched, -1, self.t0, now, self.ov, 0.0, 0)
        plan = cmd.plan
        if not plan:
            self._finish(cmd)
            return None
        stations = self.stations
        if len(plan) == 1:
            stations[plan[0][0].kind].submit(token(cmd, -1, plan[0], now))
        else:
            for ti, stages in enumerate(plan):
                stations[stages[0].kind].submit(token(cmd, ti, stages, now))
        return None


class Proc(Server):
    """A rare, multi-leg service (IPCQ) run as a generator process: ``fn(token)``."""
    __slots__ = ("fn",)

    def __init__(self, pe: Any, station: Station, fn: Any) -> None:
        super().__init__(pe, station)
        self.fn = fn

    def serve(self, tok: Any) -> bool:
        self.env.process(self.fn(tok)).callbacks.append(self._fire_cb)
        return True

    def route(self) -> None:
        return None

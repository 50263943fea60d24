"""The PE: PE_CPU, scheduler, DMA, fetch/store (TCM), GEMM/MATH (accel slot), IPCQ.

Every engine is a *station* created with the PE: a FIFO ``deque`` of waiting
tokens and a list of idle servers, its capacity being the number of servers.
Submitting a token to a station with an idle server starts its service at
once (no handoff event); otherwise the token waits its turn. The servers are
callback-driven state machines, not generator processes: a service is one
SimPy event, its completion (the server object is itself the event it
schedules, so nothing is allocated per service), and the completion callback
records the hop row, routes the token to the next stage's station (ADR-0014 D6
self-routing; the last stage completes the tile) and starts the next waiting
token. A zero-length service completes synchronously, without an event.

===========  ==========================  ========================================  ================
component    servers (capacity)          time per token                            SimPy events
===========  ==========================  ========================================  ================
PE_CPU       1 (program order)           ``dispatch_cycles / clock`` per op        1 (a)
scheduler    1 (single FIFO feeder)      ``overhead_ns`` per command               1 (a)
DMA read     ``pe.dma.read_channels``    setup + request leg + HBM + data leg      fast 2, flit (b)
DMA write    ``pe.dma.write_channels``   setup + data leg + HBM commit + ack leg   fast 2, flit (b)
DMA vc_comm  1 (IPCQ sends)              setup + data leg + slot write             process (c)
TCM read     1 (fetch)                   ``nbytes / min(fetch_store, tcm read)``   1
TCM write    1 (store)                   ``nbytes / min(fetch_store, tcm write)``  1
accel slot   1 (GEMM and MATH share it)  MAC-array / SIMD model                    1
IPCQ rx      1 (recv, in issue order)    wait data + slot read + credit return     process (c)
===========  ==========================  ========================================  ================

(a) one for both when a sync command is dispatched while the scheduler is
idle: the CPU, the scheduler's only feeder, is blocked until the op
completes, so the scheduler is booked from the dispatch end at once.
(b) flit DMA runs the per-flit legs (``Sim.dma_read`` / ``dma_write``) as a
process whose completion ends the service. (c) IPCQ services (rare) are
processes too.

fast DMA: a read is one timer for setup + request leg, whose callback reads
HBM and books the data transfer (``Sim.hbm_read`` -> ``fabric.send``), whose
one event ends the service; a write is the ``fabric.send(..., at=..., ack=...)``
event (to HBM: one more, the commit when the data arrives). DMA channels are held through the whole round trip
(request, HBM, data, ack). Consecutive DMA_READ stages of one tile run in
place on the channel.

PE_CPU issues in program order: an op waits for its ``deps``, is dispatched
(metadata-only calls, ``ops.is_metadata``, complete there at no cost: no command),
then either blocks the CPU (sync ops, until they complete) or lets it issue
the next op; a program ends when all its ops completed. Op completions reach
the CPU as direct callbacks (``Sim.on_done``), not SimPy events.

Tie-break rule (within a PE): services ending at the same time complete in
the order they were scheduled (SimPy's insertion id). On completion a token
is routed on first (starting at once if the next station is idle), then the
server takes the head of its queue; op-completion callbacks run at once, in
the order they were registered; a fused dispatch + scheduling event (a) is
inserted when the dispatch starts; an idle station's servers are reused last
idle, first busy (servers of a station are identical, so this never moves a
timestamp).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from math import ceil
from typing import TYPE_CHECKING, Any

import simpy
from simpy.events import NORMAL  # the priority of a Timeout

from kbtrace.replay import plans as P
from kbtrace.replay.ops import Op, is_metadata
from kbtrace.topology.model import PeCoord

if TYPE_CHECKING:  # pragma: no cover
    from kbtrace.replay.engine import Sim

__all__ = ["Pe", "Command", "Token", "Program"]

_ENGINE = {"load": "dma", "store": "dma", "dot": "gemm", "fill": "math", "math": "math",
           "composite": "scheduler"}


class Command:
    __slots__ = ("op", "plan", "left", "t_start", "t_issue")

    def __init__(self, op: Op, plan: P.Plan, t_issue: float) -> None:
        self.op = op
        self.plan = plan
        self.left = len(plan)
        self.t_start = -1.0
        self.t_issue = t_issue


class Token:
    __slots__ = ("cmd", "tile", "stages", "idx", "t_in")

    def __init__(self, cmd: Command, tile: int, stages: tuple[P.Stage, ...], t_in: float) -> None:
        self.cmd = cmd
        self.tile = tile
        self.stages = stages
        self.idx = 0
        self.t_in = t_in


class Program:
    __slots__ = ("ops", "done")

    def __init__(self, ops: list[Op], done: simpy.Event) -> None:
        self.ops = ops
        self.done = done


class _Station:
    """FIFO queue in front of identical servers."""
    __slots__ = ("idle", "waiting")

    def __init__(self) -> None:
        self.idle: list[_Server] = []
        self.waiting: deque[Any] = deque()

    def submit(self, tok: Any) -> None:
        if self.idle:
            srv = self.idle.pop()
            if not srv.serve(tok):
                srv.drain()
        else:
            self.waiting.append(tok)


class _Server:
    """One server of a station, and the SimPy event of its current service.

    ``env.step()`` only needs ``callbacks`` and ``_ok`` of what it pops, so a server
    schedules itself (``_timer``) instead of allocating a ``Timeout`` per service.
    Subclasses implement ``serve(tok)`` (start the service; True if it takes time,
    i.e. its completion will call ``_fire``) and ``route()`` (record the finished
    service, pass the token on; return a token to serve next in place, or None).
    """
    __slots__ = ("callbacks", "_cbl", "_fire_cb", "station", "pe", "env", "rec", "sched", "tok",
                 "t0")
    _ok = True            # a service never fails

    def __init__(self, pe: Pe, station: _Station) -> None:
        self.pe = pe
        self.env = pe.env
        self.rec = pe.sim.rec
        self.sched = pe.env.schedule
        self.station = station
        self._fire_cb = self._fire
        self._cbl = [self._fire_cb]
        self.callbacks: list[Any] | None = None
        self.tok: Any = None
        self.t0 = 0.0
        station.idle.append(self)

    def _timer(self, delay: float) -> None:
        self.callbacks = self._cbl
        self.sched(self, NORMAL, delay)

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

    def serve(self, tok: Any) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def route(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class _StageServer(_Server):
    """A server of tile stages: passes a finished token to its next stage's station."""
    __slots__ = ("stations", "in_place")

    def __init__(self, pe: Pe, station: _Station, in_place: bool = False) -> None:
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
                self.pe.finish_cmd(cmd)
            return None
        tok.t_in = now
        kind = stages[idx].kind
        if self.in_place and kind == P.DMA_READ:
            return tok
        self.stations[kind].submit(tok)
        return None


class _Compute(_StageServer):
    """TCM read (fetch), TCM write (store) or the accel slot (GEMM and MATH): one timer."""
    __slots__ = ("dur",)

    def serve(self, tok: Token) -> bool:
        st = self._begin(tok)
        kind = st.kind
        pe = self.pe
        if kind == P.FETCH:
            dur = st.a / pe.fetch_bw
        elif kind == P.STORE:
            dur = st.a / pe.store_bw
        elif kind == P.GEMM:
            g = pe.gemm
            dur = (ceil(st.a / g.mac_rows) * ceil(st.b / g.mac_cols) * st.c
                   + g.pipeline_cycles) / g.clock_ghz
        else:
            m = pe.mathp
            dur = max(m.overhead_ns, ceil(st.a / m.simd_lanes) * st.b / m.clock_ghz)
        self.dur = dur
        if dur > 0:
            self.callbacks = self._cbl
            self.sched(self, NORMAL, dur)
            return True
        return False

    def route(self) -> Token | None:
        tok = self.tok
        now = self.env._now
        st = tok.stages[tok.idx]
        kind = st.kind
        pe = self.pe
        if kind == P.FETCH:
            stage, node, nb = "fetch", pe.n_fs, st.a
        elif kind == P.STORE:
            stage, node, nb = "store", pe.n_fs, st.a
        elif kind == P.GEMM:
            stage, node, nb = "gemm", pe.n_gemm, 0
        else:
            stage, node, nb = "math", pe.n_math, 0
        t_in = tok.t_in
        self.rec.hop(tok.cmd.op.op_id, tok.tile, stage, node, -1, t_in, now, self.dur,
                     self.t0 - t_in, nb)
        return self._pass_on(tok, now)


class _DmaServer(_StageServer):
    """One DMA channel (read or write), held through the whole round trip."""
    __slots__ = ("sim", "fab", "resolved", "n_dma", "setup", "src", "lat", "t_ack", "_data_cb",
                 "_sent_cb", "_stage")

    def __init__(self, pe: Pe, station: _Station, read: bool) -> None:
        super().__init__(pe, station, in_place=read)
        self.sim = pe.sim
        self.fab = pe.sim.fabric
        self.resolved = pe.sim._resolved
        self.n_dma = pe.n_dma
        self.setup = pe.dma_ov
        self.src = self.lat = self.t_ack = 0
        self._stage = "dma_read" if read else "dma_write"

    def route(self) -> Token | None:
        tok = self.tok
        now = self.env._now
        st = tok.stages[tok.idx]
        if not self.in_place and self.pe.fast:   # fast write: the ack leg's row
            t_ack, lat = self.t_ack, self.lat
            self.rec.hop(tok.cmd.op.op_id, tok.tile, "fabric", self.src, -1, t_ack, t_ack + lat,
                         0.0, 0.0, 0)
        t_in, t0 = tok.t_in, self.t0
        self.rec.hop(tok.cmd.op.op_id, tok.tile, self._stage, self.n_dma, -1, t_in, now, now - t0,
                     t0 - t_in, st.b)
        return self._pass_on(tok, now)

    def _begin_at(self, tok: Token) -> P.Stage:
        """``_begin`` plus the node owning the stage's address, kept in ``self.src``."""
        st = self._begin(tok)
        node = self.resolved.get(st.a)
        self.src = node if node is not None else self.sim.resolve(st.a)
        return st


class _DmaReadFast(_DmaServer):
    """fast read: one timer (setup + request leg), then the data leg's one fabric event."""
    __slots__ = ()

    def __init__(self, pe: Pe, station: _Station) -> None:
        super().__init__(pe, station, read=True)
        self._cbl = [self._request_arrived]
        self._data_cb = self._fire_cb

    def serve(self, tok: Token) -> bool:
        self._begin_at(tok)
        lat = self.fab.command_ns(self.n_dma, self.src)
        t = self.t0 + self.setup
        self.rec.hop(tok.cmd.op.op_id, tok.tile, "fabric", self.n_dma, -1, t, t + lat, 0.0, 0.0, 0)
        self._timer(self.setup + lat)
        return True

    def _request_arrived(self, _ev: Any) -> None:
        """The request reached the source: read HBM, book the data transfer back."""
        tok = self.tok
        st = tok.stages[tok.idx]
        op_id, tile, src, nb = tok.cmd.op.op_id, tok.tile, self.src, st.b
        if nb <= 0:
            ev = self.fab.command(op_id, tile, src, self.n_dma)
        elif src in self.sim.hbm:
            ev = self.sim.hbm_read(op_id, tile, src, self.n_dma, st.a, nb)
        else:
            ev = self.fab.send(op_id, tile, src, self.n_dma, nb, st.a)
        ev.callbacks.append(self._data_cb)


class _DmaWriteFast(_DmaServer):
    """fast write: data leg, HBM commit and ack leg are the one ``fabric.send`` event."""
    __slots__ = ()

    def __init__(self, pe: Pe, station: _Station) -> None:
        super().__init__(pe, station, read=False)
        self._sent_cb = self._sent

    def serve(self, tok: Token) -> bool:
        st = self._begin_at(tok)
        dst = self.src
        lat = self.lat = self.fab.command_ns(dst, self.n_dma)
        if st.b > 0:
            ev = self.fab.send(tok.cmd.op.op_id, tok.tile, self.n_dma, dst, st.b, st.a,
                               at=self.t0 + self.setup, ack=lat)
            ev.callbacks.append(self._sent_cb)
        else:
            self.t_ack = self.t0 + self.setup
            self._timer(self.setup + lat)
        return True

    def _sent(self, ev: simpy.Event) -> None:
        self.t_ack = ev._value          # fabric.send's event (fabric.after): its value
        self._fire(ev)


class _DmaFlit(_DmaServer):
    """flit DMA: setup, then the per-flit legs (``Sim.dma_read`` / ``dma_write``) as a process."""
    __slots__ = ()

    def serve(self, tok: Token) -> bool:
        st = self._begin(tok)
        self.env.process(self._leg(tok.cmd.op.op_id, tok.tile, st)).callbacks.append(self._fire_cb)
        return True

    def _leg(self, op_id: int, tile: int, st: P.Stage):
        if self.setup > 0:
            yield self.env.timeout(self.setup)
        leg = self.sim.dma_read if self.in_place else self.sim.dma_write
        yield from leg(op_id, tile, self.n_dma, st.a, st.b)


class _Scheduler(_Server):
    """Scheduler: ``overhead_ns`` per command, then its tiles go to their first stations."""
    __slots__ = ()

    def serve(self, cmd: Command) -> bool:
        self.tok = cmd
        self.t0 = self.env._now
        ov = self.pe.sched_ov
        if ov > 0:
            self._timer(ov)
            return True
        return False

    def book(self, cmd: Command, t0: float) -> None:
        """Serve ``cmd`` from ``t0`` (a dispatch end, ``>= now``); the server was idle."""
        self.tok = cmd
        self.t0 = t0
        self._timer(t0 + self.pe.sched_ov - self.env._now)

    def route(self) -> None:
        cmd, pe = self.tok, self.pe
        now = self.env._now
        self.rec.hop(cmd.op.op_id, -1, "scheduler", pe.n_sched, -1, self.t0, now, pe.sched_ov,
                     0.0, 0)
        plan = cmd.plan
        if not plan:
            pe.finish_cmd(cmd)
            return None
        stations = pe.stations
        if len(plan) == 1:
            stations[plan[0][0].kind].submit(Token(cmd, -1, plan[0], now))
        else:
            for ti, stages in enumerate(plan):
                stations[stages[0].kind].submit(Token(cmd, ti, stages, now))
        return None


class _Proc(_Server):
    """A rare, multi-leg service (IPCQ) run as a generator process: ``fn(token)``."""
    __slots__ = ("fn",)

    def __init__(self, pe: Pe, station: _Station, fn: Any) -> None:
        super().__init__(pe, station)
        self.fn = fn

    def serve(self, tok: Any) -> bool:
        self.env.process(self.fn(tok)).callbacks.append(self._fire_cb)
        return True

    def route(self) -> None:
        return None


DISPATCH, CYCLES = 0, 1
_CPU_KINDS = frozenset({"wait", "cycles", "send", "recv"})   # ops PE_CPU handles itself


class _Cpu:
    """PE_CPU: issues each program's ops in program order; programs run one after another.

    A state machine driven by its own timer (dispatch, ``cycles``) and by callbacks:
    deps completed, IPCQ credits granted, the blocking op completed, all ops of the
    program completed. It only registers a callback while it is blocked, so it is
    never re-entered.
    """
    __slots__ = ("pe", "sim", "env", "callbacks", "_cbl", "progs", "prog", "i", "issued", "op",
                 "t_issue", "t_ready", "t0", "phase", "n_wait", "_resume_cb", "_dep_cb", "_end_cb",
                 "_credit_cb")
    _ok = True

    def __init__(self, pe: Pe) -> None:
        self.pe = pe
        self.sim = pe.sim
        self.env = pe.env
        self._cbl = [self._fire]
        self.callbacks: list[Any] | None = None
        self.progs: deque[Program] = deque()
        self.prog: Program | None = None
        self.i = 0
        self.issued: list[int] = []
        self.op: Op | None = None
        self.t_issue = self.t_ready = self.t0 = 0.0
        self.phase = DISPATCH
        self.n_wait = 0
        self._resume_cb = self._advance
        self._dep_cb = self._dep_done
        self._end_cb = self._end_done
        self._credit_cb = self._credits

    def submit(self, prog: Program) -> None:
        self.progs.append(prog)
        if self.prog is None:
            self.prog = self.progs.popleft()
            self._advance()

    def _timer(self, phase: int, delay: float) -> None:
        self.phase = phase
        self.callbacks = self._cbl
        self.env.schedule(self, NORMAL, delay)

    def _advance(self) -> None:
        """Issue ops until one blocks; start the next program when one ends."""
        while True:
            ops = self.prog.ops
            while self.i < len(ops):
                op = self.op = ops[self.i]
                self.i += 1
                self.t_issue = t = self.env._now
                self.sim.rec.issue(op.op_id, t)
                # a recv's dep is its matching send: the IPCQ receive side waits for the data,
                # so the CPU posts a recv_async (and issues a blocking recv) without waiting
                if op.deps and op.kind != "recv" and self._wait(op.deps, self._dep_cb):
                    return
                if not self._dispatch():
                    return
            if self._wait(self.issued, self._end_cb) or not self._program_done():
                return

    def _wait(self, op_ids: list[int], cb: Callable[[], Any]) -> bool:
        """Have ``cb`` called as each op of ``op_ids`` not yet done completes (``n_wait``
        counts them down); False if all are done already."""
        done = self.sim._done
        pend = [o for o in op_ids if not done[o]]
        if not pend:
            return False
        self.n_wait = len(pend)
        for o in pend:
            self.sim.on_done(o, cb)
        return True

    def _program_done(self) -> bool:
        self.prog.done.succeed()
        self.issued = []
        self.i = 0
        if self.progs:
            self.prog = self.progs.popleft()
            return True
        self.prog = None
        return False

    def _dep_done(self) -> None:
        self.n_wait -= 1
        if self.n_wait == 0 and self._dispatch():
            self._advance()

    def _end_done(self) -> None:
        self.n_wait -= 1
        if self.n_wait == 0 and self._program_done():
            self._advance()

    def _dispatch(self) -> bool:
        """Dispatch ``self.op`` (its deps are done); True if the CPU may issue the next op now.

        A sync command dispatched while the scheduler is idle books the scheduler at
        once from the dispatch end: the CPU is the scheduler's only feeder and stays
        blocked until the op completes, so nothing can reach the scheduler first, and
        dispatch + scheduling cost one event.
        """
        now = self.t_ready = self.env._now
        pe = self.pe
        op = self.op
        if is_metadata(op):     # no command, no cost (ADR-0046 D3, D6)
            self.sim.complete(op, self.t_issue, now, pe.names["pe_cpu"])
            return True
        d = pe.dispatch_ns
        if d <= 0:
            return self._dispatched()
        if op.is_async or op.kind in _CPU_KINDS or not pe.sched.idle:
            self._timer(DISPATCH, d)
            return False
        sim = self.sim
        t = now + d
        sim.rec.hop(op.op_id, -1, "pe_cpu", pe.n_cpu, -1, self.t_issue, t, d, now - self.t_issue, 0)
        pe.sched.idle.pop().book(Command(op, sim.plan(op), self.t_issue), t)
        sim.on_done(op.op_id, self._resume_cb)
        return False

    def _fire(self, _ev: Any) -> None:
        if self.phase == DISPATCH:
            if self._dispatched():
                self._advance()
        else:
            self._cycles_done()
            self._advance()

    def _dispatched(self) -> bool:
        op, pe, sim = self.op, self.pe, self.sim
        now = self.env._now
        sim.rec.hop(op.op_id, -1, "pe_cpu", pe.n_cpu, -1, self.t_issue, now, pe.dispatch_ns,
                    self.t_ready - self.t_issue, 0)
        kind = op.kind
        if kind == "wait":
            sim.complete(op, self.t_issue, self.t_ready, pe.names["pe_cpu"])
            return True
        if kind == "cycles":
            self.t0 = now
            dur = (op.cycles or 0) / pe.cpu_clock
            if dur > 0:
                self._timer(CYCLES, dur)
                return False
            self._cycles_done()
            return True
        if kind == "send":     # block until the receiver has free slots, then hand off
            self.t0 = now
            ch, k = sim.ipcq_channel(op)
            ch.get(k).callbacks.append(self._credit_cb)
            return False
        if kind == "recv":
            pe.rx.submit((op, self.t_issue, now))
        else:
            pe.sched.submit(Command(op, sim.plan(op), self.t_issue))
        if sim._done[op.op_id]:
            return True
        if op.is_async:
            self.issued.append(op.op_id)
            return True
        sim.on_done(op.op_id, self._resume_cb)
        return False

    def _cycles_done(self) -> None:
        op, pe = self.op, self.pe
        now = self.env._now
        dur = (op.cycles or 0) / pe.cpu_clock
        self.sim.rec.hop(op.op_id, -1, "pe_cpu", pe.n_cpu, -1, self.t0, now, dur, 0.0, 0)
        self.sim.complete(op, self.t_issue, self.t0, pe.names["pe_cpu"])

    def _credits(self, _ev: simpy.Event) -> None:
        op, pe = self.op, self.pe
        now = self.env._now
        self.sim.rec.hop(op.op_id, -1, "ipcq", pe.n_ipcq, -1, self.t0, now, 0.0, now - self.t0, 0)
        self.issued.append(op.op_id)
        pe.tx.submit((op, self.t_issue, now))
        self._advance()


class Pe:
    """All components of one PE, wired to the shared simulation context."""

    def __init__(self, sim: Sim, coord: PeCoord) -> None:
        self.sim = sim
        self.coord = coord
        self.env = sim.env
        topo = sim.topo
        p = sim.params.pe
        nid = {c: topo.pe_node(coord, c).idx for c in
               ("pe_cpu", "scheduler", "dma", "fetch_store", "gemm", "math", "tcm", "ipcq")}
        self.n_cpu, self.n_sched, self.n_dma = nid["pe_cpu"], nid["scheduler"], nid["dma"]
        self.n_fs, self.n_gemm, self.n_math = nid["fetch_store"], nid["gemm"], nid["math"]
        self.n_ipcq = nid["ipcq"]
        self.names = {k: topo.nodes[v].id for k, v in nid.items()}
        self.engine_of = {kind: self.names[eng] for kind, eng in _ENGINE.items()}
        self.dispatch_ns = p.pe_cpu.dispatch_cycles / p.pe_cpu.clock_ghz
        self.cpu_clock = p.pe_cpu.clock_ghz
        self.sched_ov = p.scheduler.overhead_ns
        self.dma_ov = p.dma.overhead_ns
        self.fast = sim.fast
        self.fetch_bw = min(p.fetch_store.bw_gbps, p.tcm.read_bw_gbps)
        self.store_bw = min(p.fetch_store.bw_gbps, p.tcm.write_bw_gbps)
        self.gemm = p.gemm
        self.mathp = p.math
        rd, wr, fetch, store, accel = (_Station() for _ in range(5))
        self.stations = [None] * len(P.STAGE_NAMES)
        for kind, st in ((P.DMA_READ, rd), (P.DMA_WRITE, wr), (P.FETCH, fetch), (P.STORE, store),
                         (P.GEMM, accel), (P.MATH, accel)):
            self.stations[kind] = st
        for _ in range(p.dma.read_channels):
            _DmaReadFast(self, rd) if self.fast else _DmaFlit(self, rd, read=True)
        for _ in range(p.dma.write_channels):
            _DmaWriteFast(self, wr) if self.fast else _DmaFlit(self, wr, read=False)
        for st in (fetch, store, accel):
            _Compute(self, st)
        self.sched = _Station()
        _Scheduler(self, self.sched)
        self.tx = _Station()            # DMA vc_comm channel
        _Proc(self, self.tx, self._ipcq_send)
        self.rx = _Station()            # IPCQ receive side
        _Proc(self, self.rx, self._ipcq_recv)
        self.cpu = _Cpu(self)

    def run_program(self, prog: Program) -> None:
        """Queue a program on the PE_CPU (programs of one PE run in submission order)."""
        self.cpu.submit(prog)

    def finish_cmd(self, cmd: Command) -> None:
        t_start = cmd.t_start if cmd.t_start >= 0 else self.env._now
        eng = self.engine_of.get(cmd.op.kind) or self.names["scheduler"]
        self.sim.complete(cmd.op, cmd.t_issue, t_start, eng)

    # ------------------------------------------------------------------ IPCQ
    def _ipcq_send(self, item: tuple[Op, float, float]):
        """DMA vc_comm channel: move the payload into the receiver's slot."""
        op, t_issue, t_in = item
        env, sim = self.env, self.sim
        t0 = env.now
        if self.dma_ov > 0:
            yield env.timeout(self.dma_ov)
        peer = sim.peer_pe(op)
        yield sim.fabric.send(op.op_id, -1, self.n_dma, peer.n_dma, int(op.nbytes))
        yield from sim.slot_access(op.op_id, peer, int(op.nbytes), write=True)
        sim.rec.hop(op.op_id, -1, "ipcq", self.n_dma, -1, t_in, env.now, env.now - t0, t0 - t_in,
                    int(op.nbytes))
        sim.ipcq_ready(op.op_id).succeed()
        sim.complete(op, t_issue, t0, self.names["ipcq"])

    def _ipcq_recv(self, item: tuple[Op, float, float]):
        """Receiver side: wait for the data, read the slot, return the credit (blocking)."""
        op, t_issue, t_in = item
        env, sim = self.env, self.sim
        send_id = sim.match_of(op)
        ready = sim.ipcq_ready(send_id)
        if not ready.processed:
            yield ready
        t0 = env.now
        sim.rec.hop(op.op_id, -1, "ipcq", self.n_ipcq, -1, t_in, t0, 0.0, t0 - t_in, 0)
        yield from sim.slot_access(op.op_id, self, int(op.nbytes), write=False)
        sender = sim.peer_pe(op)
        yield sim.fabric.send(op.op_id, -1, self.n_dma, sender.n_dma,
                              int(sim.params.pe.ipcq.credit_bytes))
        ch, k = sim.ipcq_channel(sim.ops[send_id])
        yield ch.put(k)
        sim.complete(op, t_issue, t0, self.names["ipcq"])

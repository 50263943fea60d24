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
from typing import TYPE_CHECKING, Any, cast

import simpy
from simpy.events import NORMAL  # the priority of a Timeout

from kbtrace.replay import plans as P
from kbtrace.replay.ops import Op, is_metadata
from kbtrace.replay.recorder import STAGE_CODE
from kbtrace.replay.stations import (
    Command,
    Compute,
    DmaFlit,
    DmaReadFast,
    DmaWriteFast,
    Proc,
    Program,
    Scheduler,
    Station,
    Token,
)
from kbtrace.topology.model import PeCoord

if TYPE_CHECKING:  # pragma: no cover
    from kbtrace.replay.context import SimContext

__all__ = ["Pe", "Command", "Token", "Program"]

_ENGINE = {"load": "dma", "store": "dma", "dot": "gemm", "fill": "math", "math": "math",
           "composite": "scheduler"}


DISPATCH, CYCLES = 0, 1
_CPU_KINDS = frozenset({"wait", "cycles", "send", "recv"})   # ops PE_CPU handles itself
_C_CPU = STAGE_CODE["pe_cpu"]


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
        # the op being issued: set by ``_advance`` before anything reads it (None only
        # before the first program starts)
        self.op: Op = cast(Op, None)
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
        self.env.schedule(self, NORMAL, delay)  # type: ignore[arg-type]  # (duck-typed: Server)

    def _advance(self) -> None:
        """Issue ops until one blocks; start the next program when one ends."""
        while True:
            prog = self.prog
            assert prog is not None      # (called only while a program runs)
            it, n = prog.it, prog.n
            while self.i < n:
                op = self.op = next(it)
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
        assert self.prog is not None
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
        sim.rec.row(op.op_id, -1, _C_CPU, pe.n_cpu, -1, self.t_issue, t, d, now - self.t_issue, 0)
        srv: Scheduler = pe.sched.idle.pop()  # type: ignore[assignment]  # (its only server)
        srv.book(Command(op, sim.plan(op), self.t_issue), t)
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
        sim.rec.row(op.op_id, -1, _C_CPU, pe.n_cpu, -1, self.t_issue, now, pe.dispatch_ns,
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
            sim.sends[op.op_id] = op      # its recv reads the buffer settings from it
            ch, k = sim.ipcq_channel(op)
            sim.ipcq_waiting[op.op_id] = k
            ch.get(k).callbacks.append(self._credit_cb)
            return False
        if kind == "recv":     # the rx engine takes it once its data is in the slot
            item = (op, self.t_issue, now)
            ready = sim.ipcq_ready(sim.match_of(op))
            if ready.callbacks is None:
                pe.rx.submit(item)
            else:
                def deliver(_e: Any, it: tuple[Op, float, float] = item,
                            sub: Callable[[Any], None] = pe.rx.submit) -> None:
                    sub(it)
                ready.callbacks.append(deliver)
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
        sim = self.sim
        sim.ipcq_waiting.pop(op.op_id, None)
        sim.ipcq_held.setdefault((op.launch, op.program, op.peer_program, op.direction),
                                 []).append(op.op_id)
        self.sim.rec.hop(op.op_id, -1, "ipcq", pe.n_ipcq, -1, self.t0, now, 0.0, now - self.t0, 0)
        self.issued.append(op.op_id)
        pe.tx.submit((op, self.t_issue, now))
        self._advance()


class Pe:
    """All components of one PE, wired to the shared simulation context."""

    def __init__(self, sim: SimContext, coord: PeCoord) -> None:
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
        rd, wr, fetch, store, accel = (Station() for _ in range(5))
        self.stations: list[Station | None] = [None] * len(P.STAGE_NAMES)
        for kind, st in ((P.DMA_READ, rd), (P.DMA_WRITE, wr), (P.FETCH, fetch), (P.STORE, store),
                         (P.GEMM, accel), (P.MATH, accel)):
            self.stations[kind] = st
        for _ in range(p.dma.read_channels):
            DmaReadFast(self, rd) if self.fast else DmaFlit(self, rd, read=True)
        for _ in range(p.dma.write_channels):
            DmaWriteFast(self, wr) if self.fast else DmaFlit(self, wr, read=False)
        for st in (fetch, store, accel):
            Compute(self, st)
        self.sched = Station()
        Scheduler(self, self.sched)
        self.tx = Station()            # DMA vc_comm channel
        Proc(self, self.tx, self._ipcq_send)
        self.rx = Station()            # IPCQ receive side
        Proc(self, self.rx, self._ipcq_recv)
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
        """DMA vc_comm channel: move the payload into the receiver's slot (a raw-address
        send from HBM / SRAM reads memory on the way: the data leaves from there)."""
        op, t_issue, t_in = item
        env, sim = self.env, self.sim
        t0 = env.now
        if self.dma_ov > 0:
            yield env.timeout(self.dma_ov)
        peer = sim.peer_pe(op)
        nb = int(op.nbytes)
        if op.src_space in ("hbm", "sram") and nb > 0:
            src = sim.resolve(op.src_addr)
            yield sim.fabric.command(op.op_id, -1, self.n_dma, src)
            if src in sim.hbm:
                yield sim.hbm_read(op.op_id, -1, src, peer.n_dma, int(op.src_addr), nb)
            else:
                yield sim.fabric.send(op.op_id, -1, src, peer.n_dma, nb, int(op.src_addr))
        else:
            yield sim.fabric.send(op.op_id, -1, self.n_dma, peer.n_dma, nb)
        yield from sim.slot_access(op.op_id, peer, nb, True, sim.ipcq_params(op)[2])
        sim.rec.hop(op.op_id, -1, "ipcq", self.n_dma, -1, t_in, env.now, env.now - t0, t0 - t_in,
                    nb)
        sim.ipcq_ready(op.op_id).succeed()
        sim.complete(op, t_issue, t0, self.names["ipcq"])

    def _ipcq_recv(self, item: tuple[Op, float, float]):
        """Receiver side (its data has landed): read the slot, copy it to ``dst`` when that is
        not this PE's TCM (``tl.recv(dst_addr=...)``), return the credit (blocking).
        ``recv_no_consume`` (diagnostic) skips the slot read."""
        op, t_issue, t_in = item
        env, sim = self.env, self.sim
        send_id = sim.match_of(op)
        t0 = env.now
        sim.rec.hop(op.op_id, -1, "ipcq", self.n_ipcq, -1, t_in, t0, 0.0, t0 - t_in, 0)
        nb = int(op.nbytes)
        send = sim.sends[send_id]
        if op.name != "recv_no_consume":
            yield from sim.slot_access(op.op_id, self, nb, False, sim.ipcq_params(send)[2])
        if op.dst_space in ("hbm", "sram") and nb > 0:
            yield from sim.dma_write(op.op_id, -1, self.n_dma, int(op.dst_addr), nb)
        sender = sim.peer_pe(op)
        yield sim.fabric.send(op.op_id, -1, self.n_dma, sender.n_dma,
                              int(sim.params.pe.ipcq.credit_bytes))
        ch, k = sim.ipcq_channel(send)
        held = sim.ipcq_held.get((send.launch, send.program, send.peer_program, send.direction))
        if held and send_id in held:
            held.remove(send_id)
        yield ch.put(k)
        del sim.sends[send_id]
        sim.complete(op, t_issue, t0, self.names["ipcq"])

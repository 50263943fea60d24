"""The PE: PE_CPU, scheduler, DMA, fetch/store (TCM), GEMM/MATH (accel slot), IPCQ.

Every engine is a standing SimPy process, created with the PE, that takes
tokens from its own inbox ``Store`` in FIFO order; the process *is* the
resource, so its capacity is the number of worker processes on that inbox:

=============  =============================  ======================================
component      workers (capacity)             time per token
=============  =============================  ======================================
PE_CPU         1 (program order)              ``dispatch_cycles / clock`` per op
scheduler      1 (single FIFO feeder)         ``overhead_ns`` per command
DMA read       ``pe.dma.read_channels``       setup + request leg + HBM + data leg
DMA write      ``pe.dma.write_channels``      setup + data leg + HBM commit + ack leg
DMA vc_comm    1 (IPCQ sends)                 setup + data leg + slot write
TCM read       1 (fetch)                      ``nbytes / min(fetch_store, tcm read)``
TCM write      1 (store)                      ``nbytes / min(fetch_store, tcm write)``
accel slot     1 (GEMM and MATH share it)     MAC-array / SIMD model
IPCQ rx        1 (recv, in issue order)       wait data + slot read + credit return
=============  =============================  ======================================

DMA channels are held through the whole round trip (request, HBM, data,
ack). Consecutive DMA_READ stages of one tile run in place on the channel.
Tiles self-route (ADR-0014 D6): a worker passes the token straight to the
next stage's inbox; the last stage completes the tile.
"""

from __future__ import annotations

from collections import deque
from math import ceil
from typing import TYPE_CHECKING, Any

import simpy
from simpy.events import Event

from kbtrace.replay import plans as P
from kbtrace.replay.ops import Op
from kbtrace.topology.model import PeCoord

if TYPE_CHECKING:  # pragma: no cover
    from kbtrace.replay.engine import Sim

__all__ = ["Pe", "Command", "Token", "Program", "FifoStore"]


class FifoStore:
    """Unbounded FIFO inbox with exactly ``simpy.Store``'s event schedule, minus its overhead.

    Same events, scheduled in the same order: ``put`` schedules a put event at once
    and, when that event is processed, hands the head item to the head waiting
    getter; ``get`` returns an event that succeeds at once if an item is there
    (serving the head waiting getter first), else when a later put is processed.
    So replay timing and tie-breaking are unchanged (``simpy.Store`` with unbounded
    capacity never blocks a put, and serves at most one getter per trigger).
    """
    __slots__ = ("env", "items", "getters", "_serve_cb")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.items: deque[Any] = deque()
        self.getters: deque[Event] = deque()
        self._serve_cb = self._serve

    def put(self, item: Any) -> Event:
        ev = Event(self.env)
        ev.callbacks.append(self._serve_cb)
        self.items.append(item)
        return ev.succeed()

    def get(self) -> Event:
        ev = Event(self.env)
        getters = self.getters
        getters.append(ev)
        if self.items:
            getters.popleft().succeed(self.items.popleft())
        return ev

    def _serve(self, _ev: Event) -> None:
        if self.getters and self.items:
            self.getters.popleft().succeed(self.items.popleft())


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


class Pe:
    """All components of one PE, wired to the shared simulation context."""

    def __init__(self, sim: Sim, coord: PeCoord) -> None:
        self.sim = sim
        self.coord = coord
        env = self.env = sim.env
        topo = sim.topo
        p = sim.params.pe
        nid = {c: topo.pe_node(coord, c).idx for c in
               ("pe_cpu", "scheduler", "dma", "fetch_store", "gemm", "math", "tcm", "ipcq")}
        self.n_cpu, self.n_sched, self.n_dma = nid["pe_cpu"], nid["scheduler"], nid["dma"]
        self.n_fs, self.n_gemm, self.n_math = nid["fetch_store"], nid["gemm"], nid["math"]
        self.n_ipcq = nid["ipcq"]
        self.names = {k: topo.nodes[v].id for k, v in nid.items()}
        self.dispatch_ns = p.pe_cpu.dispatch_cycles / p.pe_cpu.clock_ghz
        self.cpu_clock = p.pe_cpu.clock_ghz
        self.sched_ov = p.scheduler.overhead_ns
        self.dma_ov = p.dma.overhead_ns
        self.fast = sim.fast
        self.fetch_bw = min(p.fetch_store.bw_gbps, p.tcm.read_bw_gbps)
        self.store_bw = min(p.fetch_store.bw_gbps, p.tcm.write_bw_gbps)
        self.gemm = p.gemm
        self.mathp = p.math
        self.cpu_in = FifoStore(env)
        self.sched_in = FifoStore(env)
        rd, wr = FifoStore(env), FifoStore(env)
        cmp_q = FifoStore(env)
        self.q = {P.DMA_READ: rd, P.DMA_WRITE: wr, P.FETCH: FifoStore(env),
                  P.STORE: FifoStore(env), P.GEMM: cmp_q, P.MATH: cmp_q}
        self.send_q = FifoStore(env)
        self.recv_q = FifoStore(env)
        env.process(self._cpu())
        env.process(self._scheduler())
        for _ in range(p.dma.read_channels):
            env.process(self._worker(rd))
        for _ in range(p.dma.write_channels):
            env.process(self._worker(wr))
        env.process(self._worker(self.q[P.FETCH]))
        env.process(self._worker(self.q[P.STORE]))
        env.process(self._worker(cmp_q))
        env.process(self._ipcq_send())
        env.process(self._ipcq_recv())

    # ------------------------------------------------------------------ PE_CPU
    def _cpu(self):
        get = self.cpu_in.get
        while True:
            prog = yield get()
            outstanding = []
            for op in prog.ops:
                ev = yield from self._issue(op)
                if ev is not None:
                    outstanding.append(ev)
            pending = [e for e in outstanding if not e.processed]
            if pending:
                yield self.env.all_of(pending)
            prog.done.succeed()

    def _issue(self, op: Op):
        env, sim, rec = self.env, self.sim, self.sim.rec
        t_issue = env.now
        if op.deps:
            ev = sim.wait_for(op.deps)
            if ev is not None:
                yield ev
        t_ready = env.now
        if self.dispatch_ns > 0:
            yield env.timeout(self.dispatch_ns)
        rec.hop(op.op_id, -1, "pe_cpu", self.n_cpu, -1, t_issue, env.now, self.dispatch_ns,
                t_ready - t_issue, 0)
        kind = op.kind
        if kind == "wait":
            sim.complete(op, t_issue, t_ready, self.names["pe_cpu"])
            return None
        if kind == "cycles":
            dur = (op.cycles or 0) / self.cpu_clock
            t0 = env.now
            if dur > 0:
                yield env.timeout(dur)
            rec.hop(op.op_id, -1, "pe_cpu", self.n_cpu, -1, t0, env.now, dur, 0.0, 0)
            sim.complete(op, t_issue, t0, self.names["pe_cpu"])
            return None
        if kind == "send":
            yield from self._send_credits(op, t_issue)
            return sim.done_event(op.op_id)
        if kind == "recv":
            self.recv_q.put((op, t_issue, env.now))
            ev = sim.done_event(op.op_id)
            if not op.is_async:
                yield ev
            return ev
        cmd = Command(op, sim.plan(op), t_issue)
        self.sched_in.put(cmd)
        ev = sim.done_event(op.op_id)
        if not op.is_async:
            yield ev
        return ev

    # ------------------------------------------------------------------ scheduler
    def _scheduler(self):
        env, get, q = self.env, self.sched_in.get, self.q
        rec = self.sim.rec
        while True:
            cmd = yield get()
            t0 = env.now
            if self.sched_ov > 0:
                yield env.timeout(self.sched_ov)
            rec.hop(cmd.op.op_id, -1, "scheduler", self.n_sched, -1, t0, env.now, self.sched_ov,
                    0.0, 0)
            now = env.now
            if not cmd.plan:
                self._finish_cmd(cmd)
            for ti, stages in enumerate(cmd.plan):
                q[stages[0].kind].put(Token(cmd, ti if len(cmd.plan) > 1 else -1, stages, now))

    def _finish_cmd(self, cmd: Command) -> None:
        eng = {"load": "dma", "store": "dma", "dot": "gemm", "fill": "math", "math": "math",
               "composite": "scheduler"}.get(cmd.op.kind, "scheduler")
        t_start = cmd.t_start if cmd.t_start >= 0 else self.env.now
        self.sim.complete(cmd.op, cmd.t_issue, t_start, self.names[eng])

    # ------------------------------------------------------------------ engines
    def _worker(self, inbox: FifoStore):
        env, get, q = self.env, inbox.get, self.q
        while True:
            tok = yield get()
            cmd = tok.cmd
            if cmd.t_start < 0:
                cmd.t_start = env.now
            while True:
                st = tok.stages[tok.idx]
                yield from self._stage(tok, st)
                tok.idx += 1
                if tok.idx == len(tok.stages):
                    cmd.left -= 1
                    if cmd.left == 0:
                        self._finish_cmd(cmd)
                    break
                tok.t_in = env.now
                nxt = tok.stages[tok.idx].kind
                if not (nxt == st.kind == P.DMA_READ):
                    q[nxt].put(tok)
                    break

    def _stage(self, tok: Token, st: P.Stage):
        env, rec = self.env, self.sim.rec
        op_id, tile = tok.cmd.op.op_id, tok.tile
        kind = st.kind
        t_in = tok.t_in
        t0 = env.now
        if kind == P.DMA_READ or kind == P.DMA_WRITE:
            read = kind == P.DMA_READ
            sim = self.sim
            if self.fast:  # fast mode folds the descriptor overhead into its closed form
                leg = (sim.dma_read_fast if read else sim.dma_write_fast)(
                    op_id, tile, self.n_dma, st.a, st.b, self.dma_ov)
            else:
                if self.dma_ov > 0:
                    yield env.timeout(self.dma_ov)
                leg = (sim.dma_read if read else sim.dma_write)(op_id, tile, self.n_dma, st.a, st.b)
            yield from leg
            rec.hop(op_id, tile, "dma_read" if read else "dma_write", self.n_dma, -1, t_in,
                    env.now, env.now - t0, t0 - t_in, st.b)
        else:
            if kind == P.FETCH:
                dur, stage, node = st.a / self.fetch_bw, "fetch", self.n_fs
            elif kind == P.STORE:
                dur, stage, node = st.a / self.store_bw, "store", self.n_fs
            elif kind == P.GEMM:
                g = self.gemm
                cyc = ceil(st.a / g.mac_rows) * ceil(st.b / g.mac_cols) * st.c + g.pipeline_cycles
                dur, stage, node = cyc / g.clock_ghz, "gemm", self.n_gemm
            else:
                m = self.mathp
                dur = max(m.overhead_ns, ceil(st.a / m.simd_lanes) * st.b / m.clock_ghz)
                stage, node = "math", self.n_math
            if dur > 0:
                yield env.timeout(dur)
            nb = st.a if kind in (P.FETCH, P.STORE) else 0
            rec.hop(op_id, tile, stage, node, -1, t_in, env.now, dur, t0 - t_in, nb)

    # ------------------------------------------------------------------ IPCQ
    def _send_credits(self, op: Op, t_issue: float):
        """PE_CPU side of tl.send: block until the receiver has free slots, then hand off."""
        env, sim = self.env, self.sim
        ch, k = sim.ipcq_channel(op)
        t0 = env.now
        yield ch.get(k)
        sim.rec.hop(op.op_id, -1, "ipcq", self.n_ipcq, -1, t0, env.now, 0.0, env.now - t0, 0)
        self.send_q.put((op, t_issue, env.now))

    def _ipcq_send(self):
        """DMA vc_comm channel: move the payload into the receiver's slot."""
        env, sim, get = self.env, self.sim, self.send_q.get
        rec = sim.rec
        while True:
            op, t_issue, t_in = yield get()
            t0 = env.now
            if self.dma_ov > 0:
                yield env.timeout(self.dma_ov)
            peer = sim.peer_pe(op)
            yield sim.fabric.send(op.op_id, -1, self.n_dma, peer.n_dma, int(op.nbytes))
            yield from sim.slot_access(op.op_id, peer, int(op.nbytes), write=True)
            rec.hop(op.op_id, -1, "ipcq", self.n_dma, -1, t_in, env.now, env.now - t0, t0 - t_in,
                    int(op.nbytes))
            sim.ipcq_ready(op.op_id).succeed()
            sim.complete(op, t_issue, t0, self.names["ipcq"])

    def _ipcq_recv(self):
        """Receiver side: wait for the data, read the slot, return the credit (blocking)."""
        env, sim, get = self.env, self.sim, self.recv_q.get
        p = sim.params.pe.ipcq
        while True:
            op, t_issue, t_in = yield get()
            send_id = sim.match_of(op)
            ready = sim.ipcq_ready(send_id)
            if not ready.processed:
                yield ready
            t0 = env.now
            sim.rec.hop(op.op_id, -1, "ipcq", self.n_ipcq, -1, t_in, t0, 0.0, t0 - t_in, 0)
            yield from sim.slot_access(op.op_id, self, int(op.nbytes), write=False)
            sender = sim.peer_pe(op)
            yield sim.fabric.send(op.op_id, -1, self.n_dma, sender.n_dma, int(p.credit_bytes))
            ch, k = sim.ipcq_channel(sim.ops[send_id])
            yield ch.put(k)
            sim.complete(op, t_issue, t0, self.names["ipcq"])

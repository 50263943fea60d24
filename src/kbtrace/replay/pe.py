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
HBM and books the data transfer (``OpCore.hbm_read`` -> ``fabric.send``), whose
one event ends the service; a write is the ``fabric.send(..., at=..., ack=...)``
event (to HBM: one more, the commit when the data arrives). DMA channels are held through the whole round trip
(request, HBM, data, ack). Consecutive DMA_READ stages of one tile run in
place on the channel.

PE_CPU (``cpu.Cpu``) issues in program order: an op waits for its ``deps``, is dispatched
(metadata-only calls, ``ops.is_metadata``, complete there at no cost: no command),
then either blocks the CPU (sync ops, until they complete) or lets it issue
the next op; a program ends when all its ops completed. Op completions reach
the CPU as direct callbacks (``OpCore.on_done``), not SimPy events.

Tie-break rule (within a PE): services ending at the same time complete in
the order they were scheduled (SimPy's insertion id). On completion a token
is routed on first (starting at once if the next station is idle), then the
server takes the head of its queue; op-completion callbacks run at once, in
the order they were registered; a fused dispatch + scheduling event (a) is
inserted when the dispatch starts; an idle station's servers are reused last
idle, first busy (servers of a station are identical, so this never moves a
timestamp).

Compiled: in fast mode with the compiled core (``fabric.core.pe_model``) the stations,
servers and PE_CPU are the compiled twins of ``stations.py`` and ``cpu.py``, typed by their
``.pxd`` files (the same operations in the same order: byte-identical outputs,
``tests/test_replay_core.py``); flit mode and ``KBTRACE_PURE_PYTHON=1`` run the ``.py``
files. A PE reaches them through ``SimContext.pe_model`` / ``pe_cpu``; they ask
``opcore.OpCore`` (``Sim.core``, compiled with them) for plans, issues, completions and HBM
reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kbtrace.replay import plans as P
from kbtrace.replay.ops import Op
from kbtrace.replay.stations import Command, Program, Station, Token
from kbtrace.topology.model import PeCoord

if TYPE_CHECKING:  # pragma: no cover
    from kbtrace.replay.context import SimContext

__all__ = ["Pe", "Command", "Token", "Program"]

_ENGINE = {"load": "dma", "store": "dma", "dot": "gemm", "fill": "math", "math": "math",
           "composite": "scheduler"}


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
        #: the stations and servers: ``stations.py``, or in fast mode its compiled twin
        #: (``fabric.core.pe_stations``)
        S = self.model = sim.pe_model
        rd, wr, fetch, store, accel = (S.Station() for _ in range(5))
        self.stations: list[Station | None] = [None] * len(P.STAGE_NAMES)
        for kind, st in ((P.DMA_READ, rd), (P.DMA_WRITE, wr), (P.FETCH, fetch), (P.STORE, store),
                         (P.GEMM, accel), (P.MATH, accel)):
            self.stations[kind] = st
        for _ in range(p.dma.read_channels):
            S.DmaReadFast(self, rd) if self.fast else S.DmaFlit(self, rd, read=True)
        for _ in range(p.dma.write_channels):
            S.DmaWriteFast(self, wr) if self.fast else S.DmaFlit(self, wr, read=False)
        for st in (fetch, store, accel):
            S.Compute(self, st)
        self.sched = S.Station()
        S.Scheduler(self, self.sched)
        self.tx = S.Station()          # DMA vc_comm channel
        S.Proc(self, self.tx, self._ipcq_send)
        self.rx = S.Station()          # IPCQ receive side
        S.Proc(self, self.rx, self._ipcq_recv)
        self.cpu = sim.pe_cpu(self)

    def run_program(self, prog: Program) -> None:
        """Queue a program on the PE_CPU (programs of one PE run in submission order)."""
        self.cpu.submit(prog)

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

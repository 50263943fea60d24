"""``replay()``: build -> elaborate -> run -> finalize.

build      open the trace, check it fits the topology, create the SimPy
           environment, HBM controllers, the fabric (flit or fast), the PEs used
           by the trace, the recorder.
elaborate  group ops into host copies and launches (programs in program
           order), match IPCQ sends to recvs, start the host process.
run        step the SimPy environment to exhaustion, counting events.
finalize   always closes the writers (aborting them on failure); on success
           checks the physical invariants, writes ``op_timing.parquet``,
           ``nodes.parquet``, ``links.parquet`` and ``run.json`` atomically.

Tie-break rule (determinism): events at equal simulated time are processed
in SimPy's (time, priority, insertion id) order; insertion order is itself
deterministic because components are built in ``node_idx`` / PE order, the
host issues work in ``op_id`` order, launches hand programs to PE_CPUs in
(launch, program) order and every station queue is FIFO. Work that needs no
event runs synchronously inside the callback that caused it, in a fixed
order (``pe.py``: a finished token is routed on before its server takes the
next waiting token; ``OpCore.complete`` runs an op's ``on_done`` callbacks in
registration order). In ``fast`` mode link and node reservations are
granted in the order transfers start, i.e. the same order.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import simpy

from kbtrace import __version__, schema
from kbtrace._integrity import digests
from kbtrace._io import (
    atomic_dir,
    stable_hash,
    trace_hash,
    write_json,
    write_table,
)
from kbtrace._names import tag, variant
from kbtrace.errors import KbtraceError, ReplayError
from kbtrace.replay import invariants, ipcq, stations
from kbtrace.replay.cpu import Cpu
from kbtrace.replay.eventq import plain_env
from kbtrace.replay.fabric import make_fabric
from kbtrace.replay.fabric.core import (
    environment,
    hbm_controller,
    op_core,
    pe_model,
    row_buffers,
    seg_kernels,
)
from kbtrace.replay.hbm import HbmController, pc_table
from kbtrace.replay.opcore import OpCore
from kbtrace.replay.ops import Op
from kbtrace.replay.options import Progress, ReplayOptions, Run
from kbtrace.replay.pe import Pe
from kbtrace.replay.recorder import Recorder
from kbtrace.replay.rowbuf import CompactRows, DoneRows, HopRows
from kbtrace.replay.source import OpSource
from kbtrace.topology.model import PeCoord

__all__ = ["replay", "Sim"]

#: the data files of a run directory (their digests are run.json ``files``)
RUN_FILES = ("op_timing.parquet", "hops.parquet", "nodes.parquet", "links.parquet")
GC_GEN0_THRESHOLD = 1_000_000
PROGRESS_EVERY = 1 << 15          # SimPy events between progress reports
RESOLVE_CACHE = 1 << 16           # memoised address -> node lookups (cleared when full)


_OT_COLUMNS = ("op_id", "launch", "program", "sip", "cube", "pe", "seq", "kind", "name", "nbytes")
_EXTRA = ("src_file", "src_line")      # read for error messages only


def _open(trace: Any, topo: Any) -> tuple[Path | None, dict[str, Any], OpSource]:
    """(trace dir, trace.json, its ops read once in batches and validated against ``topo``);
    the schema checked first."""
    if hasattr(trace, "ops") and hasattr(trace, "meta") and not hasattr(trace, "ops_path"):
        table = trace.ops()                 # a duck-typed trace (tests): its table as given
        schema.check_schema(table.schema, schema.OPS, "ops.parquet")
        meta = dict(trace.meta)
        return getattr(trace, "path", None), meta, OpSource(
            table, columns=[c for c in _EXTRA if c in table.column_names], topo=topo, meta=meta,
            check=True)
    if hasattr(trace, "ops_path"):           # a Trace object (open_trace checks its own)
        schema.check_schema(pq.read_schema(trace.ops_path), schema.OPS, "ops.parquet")
    else:
        from kbtrace.tracefile import open_trace
        trace = open_trace(trace, hashed=("ops.parquet",))
    meta = dict(trace.meta)
    return trace.path, meta, OpSource(path=trace.ops_path, columns=list(_EXTRA), topo=topo,
                                      meta=meta, check=True)


class Sim:
    """The shared simulation context the components talk through."""

    def __init__(self, topo: Any, source: OpSource, opts: ReplayOptions, out_dir: Path) -> None:
        self.topo = topo
        self.params = topo.params
        self.source = source
        self.n_ops = source.n
        flit = opts.fidelity == "flit"     # the reference: none of the compiled core
        self.env = plain_env() if flit else environment()
        ctrl = HbmController if flit else hbm_controller()
        self.hbm = {nd.idx: ctrl(nd.idx, self.params.cube.hbm)
                    for nd in topo.nodes if nd.kind == "hbm_ctrl"}
        if opts.hbm_pcs:            # the pseudo-channel log (hbm_pcs.parquet)
            for h in self.hbm.values():
                h.log = []
        pes = [PeCoord(*c) for c in sorted(source.used)]      # plain tuples hash faster
        alias = {}
        for c in pes:
            alias[topo.pe_node(c, "math").idx] = topo.pe_node(c, "gemm").idx
        kernels = None if flit else seg_kernels()
        self.rec = Recorder(out_dir, source.n, len(topo.links), opts.batch_rows, alias,
                            (HopRows, CompactRows, DoneRows) if flit else row_buffers(), kernels)
        if opts.check_invariants:
            self.rec.busy = invariants.BusyCheck(self, kernels)
        self.fabric = make_fabric(opts.fidelity, self.env, topo, self.rec, self.hbm)
        self.fast = opts.fidelity != "flit"
        #: the per-op work the PE model asks for (``opcore``; its compiled twin in fast mode
        #: with the compiled core): plans, issues, completions, HBM reads
        self.core: Any = (OpCore if flit else op_core())(self.env, self.params, self.rec,
                                                         self.hbm, self.fabric, source.n,
                                                         opts.fidelity)
        core = self.core
        self.plan = core.plan
        self.on_done = core.on_done
        self.complete = core.complete
        self.hbm_read = core.hbm_read
        self._done: bytearray = core.done
        #: IPCQ sends issued and not yet received (op_id -> record): a recv reads its send's
        #: buffer settings from it
        self.sends: dict[int, Op] = {}
        self._waiters: dict[int, simpy.Event] = {}
        self._ready: dict[int, simpy.Event] = {}
        self._chan: dict[tuple[int, int, int, str], simpy.Container] = {}
        self._ipcq_cfg: dict[str | None, tuple[int, int, str]] = {}
        #: for deadlock reports: sends waiting for slots (op_id -> slots needed), and the
        #: sends holding each buffer's slots (channel key -> op_ids), see ``ipcq.diagnose``
        self.ipcq_waiting: dict[int, int] = {}
        self.ipcq_held: dict[tuple[int, int, int, str], list[int]] = {}
        self._match: dict[int, int] = {}
        self._resolved: dict[int, int] = {}
        self.launches: list[dict[str, float]] = []
        self.host = topo.host.idx
        #: the PE model (the stations and servers' module, PE_CPU's class): fast mode's
        #: compiled twins with the compiled core
        self.pe_model: Any
        self.pe_cpu: Any
        self.pe_model, self.pe_cpu = (stations, Cpu) if flit else pe_model()
        self.pes = {c: Pe(self, c) for c in pes}

    # ------------------------------------------------------------------ op bookkeeping
    def done_event(self, op_id: int) -> simpy.Event:
        """A SimPy event that fires when op ``op_id`` completes (for generator code)."""
        ev = self._waiters.get(op_id)
        if ev is None:
            ev = self._waiters[op_id] = self.env.event()
            if self._done[op_id]:
                ev.succeed()
            else:
                self.on_done(op_id, ev.succeed)
        return ev

    def wait_for(self, deps: list[int]) -> simpy.Event | None:
        pend = [self.done_event(d) for d in deps if not self._done[d]]
        if not pend:
            return None
        return pend[0] if len(pend) == 1 else self.env.all_of(pend)

    def progress(self, events: int, t_wall: float) -> Progress:
        return Progress(self.rec.n_done, self.n_ops, events, float(self.env.now),
                        time.perf_counter() - t_wall)

    def resolve(self, addr: int) -> int:
        """The node owning physical address ``addr`` (memoised per address; the memo is
        emptied when it holds ``RESOLVE_CACHE`` addresses, so a trace streaming over distinct
        addresses does not grow it with every op)."""
        n = self._resolved.get(addr)
        if n is None:
            if len(self._resolved) >= RESOLVE_CACHE:
                self._resolved.clear()
            try:
                n = self._resolved[addr] = self.topo.resolve(int(addr)).idx
            except KbtraceError as e:
                raise ReplayError(f"address {int(addr):#x} does not map onto topology "
                                  f"{self.params.name!r}: {e}") from None
        return n

    # ------------------------------------------------------------------ memory paths
    def dma_read(self, op_id: int, tile: int, dma: int, addr: int, nbytes: int):
        src = self.resolve(addr)
        yield self.fabric.command(op_id, tile, dma, src)
        if nbytes <= 0:
            yield self.fabric.command(op_id, tile, src, dma)
        elif src in self.hbm:
            yield self.hbm_read(op_id, tile, src, dma, addr, nbytes)
        else:
            yield self.fabric.send(op_id, tile, src, dma, nbytes, addr)

    def dma_write(self, op_id: int, tile: int, dma: int, addr: int, nbytes: int):
        dst = self.resolve(addr)
        if nbytes > 0:
            yield self.fabric.send(op_id, tile, dma, dst, nbytes, addr)
        yield self.fabric.command(op_id, tile, dst, dma)

    # ------------------------------------------------------------------ IPCQ
    def peer_pe(self, op: Op) -> Pe:
        return self.pes[PeCoord(op.peer_sip, op.peer_cube, op.peer_pe)]

    def match_of(self, recv: Op) -> int:
        return self._match[recv.op_id]

    def ipcq_params(self, op: Op) -> tuple[int, int, str]:
        """(n_slots, slot_bytes, buffer_kind) of an IPCQ op: its launch's settings
        (``extra_json`` ``{"ipcq": {...}}``), else the topology's ``pe.ipcq``."""
        key = op.extra_json
        got = self._ipcq_cfg.get(key)
        if got is None:
            p = self.params.pe.ipcq
            over = json.loads(key).get("ipcq", {}) if key else {}
            got = self._ipcq_cfg[key] = (int(over.get("n_slots", p.n_slots)),
                                         int(over.get("slot_bytes", p.slot_bytes)),
                                         str(over.get("buffer_kind", p.buffer_kind)))
        return got

    def ipcq_channel(self, send: Op) -> tuple[simpy.Container, int]:
        """The rx buffer of ``send``'s (sender, receiver, direction) and the slots it takes
        (ADR-0025: one buffer of ``n_slots`` per direction)."""
        n_slots, slot_bytes, _kind = self.ipcq_params(send)
        key = (send.launch, send.program,
               send.peer_program if send.peer_program is not None else -1, send.direction)
        ch = self._chan.get(key)
        if ch is None:
            ch = self._chan[key] = simpy.Container(self.env, capacity=n_slots, init=n_slots)
        k = max(1, min(n_slots, -(-int(send.nbytes) // slot_bytes)))
        return ch, k

    def ipcq_ready(self, send_id: int) -> simpy.Event:
        ev = self._ready.get(send_id)
        if ev is None:
            ev = self._ready[send_id] = self.env.event()
        return ev

    def slot_access(self, op_id: int, pe: Pe, nbytes: int, write: bool, kind: str | None = None):
        """Slot write (receiver inbound) or read (recv consume) in the buffer tier."""
        p = self.params.pe.ipcq
        kind = kind or p.buffer_kind
        tier = getattr(p, kind)
        fab = self.fabric
        if kind in ("sram", "hbm") and nbytes > 0:
            c = pe.coord
            bank = (self.topo.sram(c.sip, c.cube) if kind == "sram" else self.topo.hbm_ctrl(c)).idx
            addr = self.topo.hbm_base(c) if kind == "hbm" else 0
            if write:
                yield fab.send(op_id, -1, pe.n_dma, bank, nbytes, addr)
            else:
                yield fab.command(op_id, -1, pe.n_dma, bank)
                if kind == "hbm":
                    yield self.hbm_read(op_id, -1, bank, pe.n_dma, addr, nbytes)
                else:
                    yield fab.send(op_id, -1, bank, pe.n_dma, nbytes)
        t0 = self.env.now
        dur = (nbytes / tier.bw_gbps if tier.bw_gbps > 0 else 0.0) + tier.overhead_ns
        if dur > 0:
            yield self.env.timeout(dur)
        self.rec.hop(op_id, -1, "ipcq", pe.n_ipcq, -1, t0, self.env.now, 0.0, 0.0, nbytes)

    # ------------------------------------------------------------------ host + launches
    def _launch_ns(self, coords: list[PeCoord]) -> tuple[float, dict[PeCoord, float]]:
        """(fan-out barrier latency: max over PEs of host -> IO_CPU -> M_CPU -> PE_CPU,
        per PE its completion's way back PE_CPU -> M_CPU -> IO_CPU -> host)."""
        topo, cmd = self.topo, self.fabric.command_ns
        host = self.host
        down = 0.0
        up = {}
        for c in coords:
            io = topo.io_cpu(c.sip).idx
            m = topo.m_cpu(c.sip, c.cube).idx
            cpu = topo.pe_node(c, "pe_cpu").idx
            down = max(down, cmd(host, io) + cmd(io, m) + cmd(m, cpu))
            up[c] = cmd(cpu, m) + cmd(m, io) + cmd(io, host)
        return down, up

    def copy_end(self, mem: int) -> int:
        """Node index where a host copy to / from memory node ``mem`` enters the tray: the
        PCIe EP of its SIP (``system.host.copy_from: pcie_ep``, the reference) or the host."""
        if self.topo.params.system.host.copy_from == "host":
            return self.host
        return self.topo.pcie_ep(self.topo.node(mem).sip).idx

    def host_copy(self, op: Op):
        env, fab = self.env, self.fabric
        t0 = env.now
        self.core.issue(op.op_id, t0)
        nb = int(op.nbytes)
        if op.kind == "h2d":     # a posted write: done at the last commit (ADR-0034 D8)
            dst = self.resolve(op.dst_addr)
            end = self.copy_end(dst)
            if nb > 0:
                yield fab.send(op.op_id, -1, end, dst, nb, int(op.dst_addr))
            else:
                yield fab.command(op.op_id, -1, end, dst)
        else:
            src = self.resolve(op.src_addr)
            end = self.copy_end(src)
            yield fab.command(op.op_id, -1, end, src)
            if nb > 0 and src in self.hbm:
                yield self.hbm_read(op.op_id, -1, src, end, int(op.src_addr), nb)
            elif nb > 0:
                yield fab.send(op.op_id, -1, src, end, nb, int(op.src_addr))
        self.complete(op, t0, t0, self.topo.node(end).id)

    def host_program(self, items: list[tuple[str, Any]]):
        env = self.env
        for what, item in items:
            if what == "copy":
                if item.deps:
                    ev = self.wait_for(item.deps)
                    if ev is not None:
                        yield ev
                yield from self.host_copy(item)
                continue
            launch, programs = item
            t0 = env.now
            coords = sorted({PeCoord(*self.source.progs[(launch, p)].coord) for p in programs})
            down, up = self._launch_ns(coords)
            yield env.timeout(down)
            t_barrier = env.now
            dones = []
            t_back = [t_barrier]  # each PE's completion reaches the host as its program ends
            for prog in sorted(programs):
                ops = self.source.feed(launch, prog)
                ev = env.event()
                c = PeCoord(*ops.coord)
                def arrived(_e: Any, u: float = up[c],
                            back: Callable[[float], None] = t_back.append) -> None:
                    back(env.now + u)
                ev.callbacks.append(arrived)
                dones.append(ev)
                self.pes[c].run_program(self.pe_model.Program(ops, ev))
            yield env.all_of(dones)
            t_body = env.now
            yield env.timeout(max(t_back) - t_body)
            self.launches.append({"launch": launch, "t_launch_ns": t0, "t_barrier_ns": t_barrier,
                                  "t_body_end_ns": t_body, "t_done_ns": env.now})


def _elaborate(sim: Sim) -> list[tuple[str, Any]]:
    """Host copies and launches in ``op_id`` order (a launch at its first op; its programs
    are fed from the source as they run), and each recv's matching send."""
    src = sim.source
    launches: dict[int, list[int]] = defaultdict(list)
    for lid, prog in src.progs:
        launches[lid].append(prog)
    items: list[tuple[int, str, Any]] = [(o.op_id, "copy", o) for o in src.host]
    items += [(src.first[lid], "launch", (lid, progs)) for lid, progs in launches.items()]
    items.sort(key=lambda t: t[0])
    for oid, lid, prog, peer, iseq, sid, seq in src.recvs:
        if sid is None:
            sid = src.sends.get((lid, peer, prog, iseq))
        if sid is None or not 0 <= sid < src.n or src.kind(sid) != "send":
            raise ReplayError(f"op {oid} (recv, program {prog}, seq {seq}) has no "
                              f"matching send in the trace; re-capture the workload")
        sim._match[oid] = sid
    return [(what, it) for _, what, it in items]


def _default_dir(trace_path: Path | None, meta: dict[str, Any], topo: Any, fid: str) -> Path:
    """``data/runs/<workload>[-<params>]-<topology>[-<overrides>]-<fidelity>`` (kbtrace._names):
    the trace's non-default workload parameters and the topology's ``--set`` overrides are
    in the name, so replays of different inputs never share a directory."""
    name = meta.get("workload") or (trace_path.name if trace_path else "trace")
    varied = meta.get("param_overrides")
    return Path("data") / "runs" / variant(
        str(name), tag(varied if isinstance(varied, dict) else None), topo.params.name,
        tag(getattr(topo, "overrides", None)), fid)


def _step_all(env: simpy.Environment, progress: Callable[[Progress], Any] | None,
              sim: Sim, t_wall: float) -> int:
    """Step ``env`` to exhaustion; the number of events. With ``progress``, report every
    ``PROGRESS_EVERY`` events and at the end (a separate loop: the plain one stays tight)."""
    events = 0
    step = env.step
    try:
        if progress is None:
            while True:
                step()
                events += 1
        while True:
            step()
            events += 1
            if not events % PROGRESS_EVERY:
                progress(sim.progress(events, t_wall))
    except simpy.core.EmptySchedule:
        pass
    if progress is not None:
        progress(sim.progress(events, t_wall))
    return events


def replay(trace: Any, topology: Any, options: ReplayOptions | None = None,
           progress: Callable[[Progress], Any] | None = None) -> Run:
    """Replay a trace (directory or ``Trace``) on a ``Topology`` (or YAML path); return the Run.

    ``progress``: called with a ``Progress`` every ``PROGRESS_EVERY`` SimPy events while the
    simulation runs and once when it ends (the CLI prints a status line from it)."""
    opts = options or ReplayOptions()
    phase = "build"
    t_wall = time.perf_counter()
    gc_threshold = gc.get_threshold()
    # The run allocates many short-lived objects (events, hop tuples) that refcounting frees;
    # collect cyclic garbage less often while it runs (memory stays bounded: gemm M=832,
    # 87k hops, peaks at the same RSS with 50k or 1M), restore after. 1M vs 50k: -9% wall.
    gc.set_threshold(max(gc_threshold[0], GC_GEN0_THRESHOLD), *gc_threshold[1:])
    sim: Sim | None = None
    source: OpSource | None = None
    ok = False
    try:
        if isinstance(topology, (str, Path)):
            from kbtrace.topology import compile_topology
            topology = compile_topology(topology)
        # read once in batches, validated (the trace fits this topology, or one line)
        trace_path, meta, source = _open(trace, topology)
        out = Path(opts.out_dir) if opts.out_dir else _default_dir(trace_path, meta, topology,
                                                                     opts.fidelity)
        t_hash = trace_hash(meta, trace_path)
        # the run is built beside OUT and swapped in whole: an earlier run there (and a
        # report written into it) is replaced at once, never mixed with this one
        with atomic_dir(out, "run", inputs=(trace_path, getattr(topology, "source", None))
                        ) as stage:
            sim = Sim(topology, source, opts, stage)
            phase = "elaborate"
            items = _elaborate(sim)
            sim.env.process(sim.host_program(items))
            phase = "run"
            env = sim.env
            events = _step_all(env, progress, sim, t_wall)
            phase = "finalize"
            unfinished = np.flatnonzero(np.frombuffer(sim._done, dtype=np.uint8) == 0)
            if len(unfinished):
                msg = ipcq.diagnose(sim, unfinished)
                if msg:
                    raise ReplayError(msg)
                o = source.fetch([int(unfinished[0])])[int(unfinished[0])]
                raise ReplayError(f"{len(unfinished)} op(s) never completed (deadlock); first: "
                                  f"op {o.op_id} ({o.kind}, launch {o.launch}, program "
                                  f"{o.program}, seq {o.seq}); check its deps / IPCQ peer")
            rec = sim.rec
            makespan = float(env.now)
            rec.flush()
            if opts.check_invariants:
                invariants.check(sim, makespan)
            rec.close()
            wall = time.perf_counter() - t_wall
            rec.write_op_timing(stage / "op_timing.parquet", source.scan(list(_OT_COLUMNS)))
            write_table(stage / "nodes.parquet", topology.nodes_table())
            write_table(stage / "links.parquet", topology.links_table())
            files: tuple[str, ...] = RUN_FILES
            if opts.hbm_pcs:     # the pseudo-channel log, asked for
                files += ("hbm_pcs.parquet",)
                write_table(stage / files[-1], pc_table(sim.hbm.values()))
            run_id = stable_hash(t_hash, topology.content_hash, opts.key(), __version__)
            write_json(stage / "run.json", {
                "files": digests(stage, files),      # checked by every reader
                "run_id": run_id, "kbtrace_version": __version__,
                "schema_version": schema.SCHEMA_VERSION, "fidelity": opts.fidelity,
                "options": opts.key(), "makespan_ns": makespan, "events": events,
                "ops": source.n, "hops": rec.n_hops, "wall_s": round(wall, 3),
                "trace": {"path": str(Path(trace_path).resolve()) if trace_path else None,
                          "path_from_run": (os.path.relpath(Path(trace_path).resolve(),
                                                            out.resolve())
                                            if trace_path else None),
                          "hash": t_hash,
                          "workload": meta.get("workload"),
                          "workload_file": meta.get("workload_file"),
                          "topology_path": (meta.get("topology") or {}).get("path")},
                "topology": {"path": getattr(topology, "source", None),
                             "name": topology.params.name, "hash": topology.content_hash,
                             "overrides": dict(getattr(topology, "overrides", {}))},
                # everything that was varied from the defaults to make this run: the
                # workload parameters the trace was captured with (and the topology
                # overrides it was captured on), the topology overrides of the replay
                "overrides": {"params": meta.get("param_overrides") or {},
                              "capture_topology": (meta.get("topology") or {}).get("overrides")
                              or {},
                              "topology": dict(getattr(topology, "overrides", {}))},
                "launches": sim.launches,
                "peaks": topology.peaks(),
            })
        ok = True
        return Run(out, run_id, opts.fidelity, makespan, source.n, rec.n_hops, events, wall)
    except KbtraceError as e:
        if str(e).startswith("replay "):
            raise
        raise type(e)(f"replay {phase}: {e}") from None
    except Exception as e:
        e.add_note(f"kbtrace replay failed in phase {phase!r}")
        raise
    finally:
        gc.set_threshold(*gc_threshold)
        if sim is not None and not ok:
            sim.rec.hops.abort()
        if source is not None:
            source.close()

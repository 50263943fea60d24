"""PE_CPU (``pe`` describes the model and builds it; ``Cpu`` is its one instance per PE).

It issues each program's ops in program order: an op waits for its ``deps``, is dispatched
(metadata-only calls complete there at no cost), then either blocks the CPU (sync ops, until
they complete) or lets it issue the next op. Like the servers of ``stations`` it is its own
SimPy event (dispatch and ``cycles`` timers) and is otherwise driven by direct callbacks. It
reaches its PE (``pe.Pe``, typed ``Any`` here so the import runs one way) for its parameters,
stations and the simulation context.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import simpy
from simpy.events import NORMAL  # the priority of a Timeout

from kbtrace.replay.ops import METADATA_KINDS, Op, is_metadata
from kbtrace.replay.recorder import STAGE_CODE
from kbtrace.replay.stations import Program, Scheduler, command

__all__ = ["Cpu"]

DISPATCH, CYCLES = 0, 1
_CPU_KINDS = frozenset({"wait", "cycles", "send", "recv"})   # ops PE_CPU handles itself
_C_CPU = STAGE_CODE["pe_cpu"]


class Cpu:
    """PE_CPU: issues each program's ops in program order; programs run one after another.

    A state machine driven by its own timer (dispatch, ``cycles``) and by callbacks:
    deps completed, IPCQ credits granted, the blocking op completed, all ops of the
    program completed. It only registers a callback while it is blocked, so it is
    never re-entered.
    """
    __slots__ = ("pe", "sim", "env", "callbacks", "_cbl", "progs", "prog", "i", "issued", "op",
                 "t_issue", "t_ready", "t0", "phase", "n_wait", "_resume_cb", "_dep_cb", "_end_cb",
                 "_credit_cb", "queue", "done", "core", "x", "dispatch_ns", "sched",
                 "n_cpu", "cpu_name")
    _ok = True

    def __init__(self, pe: Any) -> None:
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
        self.queue = pe.env._queue          # (``env.schedule``: ``eventq``)
        self.done: bytearray = pe.sim._done     # per op: 1 once completed
        self.core = pe.sim.core             # (``opcore.OpCore``: plans, issues, completions)
        self.x = pe.sim.rec.hop_rows        # (``Recorder.hop`` by stage code: ``x.add``)
        self.dispatch_ns: float = pe.dispatch_ns
        self.sched = pe.sched               # the scheduler's station
        self.n_cpu, self.cpu_name = pe.n_cpu, pe.names["pe_cpu"]

    def submit(self, prog: Program) -> None:
        self.progs.append(prog)
        if self.prog is None:
            self.prog = self.progs.popleft()
            self._advance()

    def _timer(self, phase: int, delay: float) -> None:
        self.phase = phase
        self.callbacks = self._cbl
        self.queue.push(self.env._now + delay, NORMAL, self)

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
                self.core.issue(op.op_id, t)
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
        done = self.done
        pend = [o for o in op_ids if not done[o]]
        if not pend:
            return False
        self.n_wait = len(pend)
        for o in pend:
            self.core.on_done(o, cb)
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
        op = self.op
        kind = op.kind
        # a metadata-only call: no command, no cost (ADR-0046 D3, D6)
        if kind in METADATA_KINDS and is_metadata(op):
            self.core.complete(op, self.t_issue, now, self.cpu_name)
            return True
        d = self.dispatch_ns
        if d <= 0:
            return self._dispatched()
        idle = self.sched.idle
        if op.is_async or kind in _CPU_KINDS or not idle:
            self._timer(DISPATCH, d)
            return False
        t = now + d
        cmd = command(op, self.core.plan(op), self.t_issue)
        self.x.add(cmd.op_id, -1, _C_CPU, self.n_cpu, -1, self.t_issue, t, d, now - self.t_issue,
                   0)
        srv: Scheduler = idle.pop()        # (its only server)
        srv.book(cmd, t)
        self.core.on_done(cmd.op_id, self._resume_cb)
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
        self.x.add(op.op_id, -1, _C_CPU, self.n_cpu, -1, self.t_issue, now, self.dispatch_ns,
                   self.t_ready - self.t_issue, 0)
        kind = op.kind
        if kind == "wait":
            self.core.complete(op, self.t_issue, self.t_ready, self.cpu_name)
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
                ready.callbacks.append(partial(_deliver, pe.rx.submit, item))
        else:
            self.sched.submit(command(op, self.core.plan(op), self.t_issue))
        if self.done[op.op_id]:
            return True
        if op.is_async:
            self.issued.append(op.op_id)
            return True
        self.core.on_done(op.op_id, self._resume_cb)
        return False

    def _cycles_done(self) -> None:
        op, pe = self.op, self.pe
        now = self.env._now
        dur = (op.cycles or 0) / pe.cpu_clock
        self.sim.rec.hop(op.op_id, -1, "pe_cpu", pe.n_cpu, -1, self.t0, now, dur, 0.0, 0)
        self.core.complete(op, self.t_issue, self.t0, pe.names["pe_cpu"])

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


def _deliver(submit: Callable[[Any], None], item: tuple[Op, float, float], _ev: Any) -> None:
    """A recv's data is in its slots: hand it to the rx engine."""
    submit(item)

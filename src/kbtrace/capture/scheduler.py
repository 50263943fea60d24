"""Greenlet scheduler: runs one launch's program instances cooperatively and deterministically.

One greenlet per program; the scheduler greenlet (the caller) switches to
programs from a FIFO ready queue in program order. A program runs until its
kernel returns or it blocks (``tl.recv`` with nothing to receive, ``tl.wait``
on a recv future not yet matched); a send that completes a waiting receive puts
the receiver back on the queue. When the queue is empty while programs are
still blocked, capture fails with ``DeadlockError`` listing every blocked
program's call, direction and source line. At the end of the launch, sends
never received are a ``SanitizerError``.

IPCQ matching: program p sending on direction d reaches q = neighbors[p][d];
the message arrives on q's direction ``reverse_direction(q, p, d)`` (the
opposite direction if q points back that way, else the first direction of q
pointing at p, ADR-0025) and is matched in order on the channel
(sender, receiver, direction) by sequence number.

IPCQ credits: each channel is one rx buffer of ``n_slots`` slots (the launch's IPCQ
settings, else ``pe.ipcq`` of the topology); a message holds ``slots_for(nbytes)`` of
them from its send until its receive, and a send that finds too few free blocks its
program (``_ipcq``). A deadlock report names each blocked send with its buffer, the
slots it needs, the free ones and the sends holding the rest, and how to fix it.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import greenlet

from kbtrace.capture._ipcq import ipcq_json
from kbtrace.capture.handles import ACTIVE
from kbtrace.capture.program import _PKG_DIR, Program
from kbtrace.errors import CaptureError, DeadlockError, KbtraceError, SanitizerError

if TYPE_CHECKING:
    from kbtrace.capture.tracer import Tracer

__all__ = ["LaunchRun", "OPPOSITE", "tl_by_keyword"]

OPPOSITE = {"E": "W", "W": "E", "N": "S", "S": "N"}
for _p in ("intra_", "global_"):
    OPPOSITE.update({_p + a: _p + b for a, b in list(OPPOSITE.items())[:4]})


def tl_by_keyword(kernel: Callable[..., Any]) -> bool:
    """Whether ``kernel`` takes ``tl`` by keyword: it has a parameter named ``tl`` that is not
    its first (``def k(x_ptr, n, tl)``, the predecessor's convention, or keyword-only). A
    kernel whose first parameter is ``tl``, or with no parameter of that name, gets ``tl``
    first (``def k(tl, x_ptr, n)``)."""
    try:
        params = list(inspect.signature(kernel).parameters.values())
    except (TypeError, ValueError):     # a builtin or C callable: the positional convention
        return False
    names = [p.name for p in params]
    return "tl" in names and names[0] != "tl" and params[names.index("tl")].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class LaunchRun:
    """State of one launch while it runs: programs, IPCQ channels, the ready queue."""

    def __init__(self, tracer: Tracer, launch: int, kernel: Callable[..., Any],
                 grid: tuple[int, int], coords: list[tuple[int, int, int]],
                 args_for: Callable[[Program], tuple[tuple[Any, ...], dict[str, Any]]],
                 neighbors: Mapping[int, Mapping[str, int]] | None,
                 pids: list[tuple[int, int]] | None = None,
                 ipcq: Mapping[str, Any] | None = None) -> None:
        self.tracer, self.launch, self.kernel = tracer, launch, kernel
        base = tracer.params.pe.ipcq
        settings = dict(ipcq or {})
        self.n_slots = int(settings.get("n_slots", base.n_slots))
        self.slot_bytes = int(settings.get("slot_bytes", base.slot_bytes))
        #: extra_json of this launch's IPCQ ops (None: the topology's pe.ipcq applies)
        self.ipcq_json = ipcq_json(settings)
        self.slots: dict[tuple[int, int, str], int] = {}
        self.held: dict[tuple[int, int, str], deque[tuple[Any, int]]] = {}
        self.send_waiters: dict[tuple[int, int, str], Program] = {}
        self.kernel_name = getattr(kernel, "__name__", "kernel")
        self.grid = grid
        self.neighbors = {int(k): dict(v) for k, v in (neighbors or {}).items()}
        self.args_for = args_for
        self.programs: list[Program] = []
        for idx, coord in enumerate(coords):
            p0, p1 = pids[idx] if pids is not None else (idx % grid[0], idx // grid[0])
            self.programs.append(Program(self, idx, p0, p1, coord))
        self.channels: dict[tuple[int, str], deque[Any]] = {}
        self.parked: dict[tuple[int, str], deque[Any]] = {}
        self.where: dict[int, tuple[str | None, int | None]] = {}
        self.chan_seq: dict[tuple[int, int, str], int] = {}
        self.ready: deque[Program] = deque()
        self.sched: Any = None
        #: how the kernel takes ``tl``: first positional (kbtrace's convention) or by keyword
        self.tl_keyword = tl_by_keyword(kernel)

    # ------------------------------------------------------------------ IPCQ
    def peer(self, prog: Program, direction: str) -> int:
        if direction not in OPPOSITE:
            raise prog.fail(CaptureError, f"unknown IPCQ direction {direction!r}; use one of "
                                          f"{', '.join(OPPOSITE)}")
        peer = self.neighbors.get(prog.index, {}).get(direction)
        if peer is None or not 0 <= peer < len(self.programs):
            have = self.neighbors.get(prog.index, {})
            raise prog.fail(CaptureError, f"program {prog.index} has no neighbour in direction "
                                          f"{direction!r} (neighbours: {have or 'none'}); pass "
                                          f"neighbors=ring(...)/mesh(...) to Workload.launch")
        return peer

    def reverse_direction(self, me: int, peer: int, my_dir: str) -> str:
        nt = self.neighbors.get(peer, {})
        opp = OPPOSITE[my_dir]
        if nt.get(opp) == me:
            return opp
        for d in sorted(nt):
            if nt[d] == me:
                return d
        raise CaptureError(f"kernel {self.kernel_name!r}: program {me} sends {my_dir!r} to program "
                           f"{peer}, but program {peer} has no direction pointing back; make the "
                           f"neighbour table symmetric")

    def slots_for(self, nbytes: int) -> int:
        """Slots one message of ``nbytes`` holds: ceil(nbytes / slot_bytes), 1..n_slots."""
        return max(1, min(self.n_slots, -(-int(nbytes) // self.slot_bytes)))

    def free_slots(self, chan: tuple[int, int, str]) -> int:
        return self.slots.get(chan, self.n_slots)

    def take_slots(self, chan: tuple[int, int, str], k: int) -> None:
        self.slots[chan] = self.free_slots(chan) - k

    def release_slots(self, chan: tuple[int, int, str], k: int) -> None:
        self.slots[chan] = self.free_slots(chan) + k
        held = self.held.get(chan)
        if held:
            held.popleft()
        waiter = self.send_waiters.pop(chan, None)
        if waiter is not None:
            self.wake(waiter)

    def wake(self, prog: Program) -> None:
        if prog.blocked is not None and not prog.queued:
            prog.queued = True
            self.ready.append(prog)

    # ------------------------------------------------------------------ run
    def _body(self, prog: Program) -> None:
        ACTIVE.set(prog)
        from kbtrace.capture import tl
        args, kwargs = self.args_for(prog)
        try:
            if self.tl_keyword:
                if "tl" in kwargs:
                    raise prog.fail(CaptureError, f"kernel {self.kernel_name!r} takes tl by "
                                                  f"keyword; do not pass tl in kwargs")
                self.kernel(*args, tl=tl, **kwargs)
            else:
                self.kernel(tl, *args, **kwargs)
        except KbtraceError:
            raise
        except Exception as exc:
            frames = [f for f in traceback.extract_tb(exc.__traceback__)
                      if not f.filename.startswith(_PKG_DIR)]
            loc = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"
            raise CaptureError(f"{prog.describe()}, line {loc}: kernel raised "
                               f"{type(exc).__name__}: {exc}") from exc

    def run(self) -> None:
        self.sched = greenlet.getcurrent()
        for prog in self.programs:
            prog.glet = greenlet.greenlet(self._body, parent=self.sched)
            prog.queued = True
            self.ready.append(prog)
        started: set[int] = set()
        while self.ready:
            prog = self.ready.popleft()
            prog.queued = False
            if prog.index in started:
                prog.glet.switch()
            else:
                started.add(prog.index)
                prog.glet.switch(prog)
            if prog.glet.dead:
                prog.done = True
        live = [p for p in self.programs if not p.done]
        if live:
            lines = "; ".join(self._blocked_line(p) for p in live if p.blocked is not None)
            sends = [p.blocked_send for p in live if p.blocked_send is not None]
            fix = ("every recv needs a send from its neighbour issued before that neighbour "
                   "blocks")
            if sends:
                need = max(sum(-(-int(o.nbytes) // self.slot_bytes) for o, _ in
                               self.held.get(chan, ()))
                           + -(-nbytes // self.slot_bytes) for chan, _k, nbytes in sends)
                fix = (f"a send waits for IPCQ slots its receiver frees only at a later recv: "
                       f"post the peer's tl.recv / tl.recv_async before the next send, send "
                       f"smaller messages, or raise the buffer (--set pe.ipcq.n_slots={need}, "
                       f"now {self.n_slots} x pe.ipcq.slot_bytes={self.slot_bytes})")
            raise DeadlockError(f"deadlock in launch {self.launch} (kernel {self.kernel_name!r}): "
                                f"every live program is blocked: {lines}; {fix}")
        self._check_end()

    def _blocked_line(self, p: Program) -> str:
        assert p.blocked is not None
        call, direction, file, line = p.blocked
        s = (f"program {p.index} (sip{p.sip}.cube{p.cube}.pe{p.pe}) in {call}({direction!r}) "
             f"at {file}:{line}")
        if p.blocked_send is not None:
            chan, k, nbytes = p.blocked_send
            held = ", ".join(f"send op {o.op_id} at {o.src_file}:{o.src_line} ({k_} slots)"
                             for o, k_ in self.held.get(chan, ()))
            s += (f" needs {k} slot(s) for {nbytes} B on its {direction!r} buffer to program "
                  f"{chan[1]}: {self.free_slots(chan)} of {self.n_slots} free, held by "
                  f"{held or 'nothing'} not yet received")
        return s

    def _check_end(self) -> None:
        for (rx, rx_dir), q in sorted(self.channels.items()):
            if q:
                send = q[0][0]
                raise SanitizerError(
                    f"kernel {self.kernel_name!r}: send op {send.op_id} from program "
                    f"{send.program} ({send.direction} -> program {rx}, seq {send.ipcq_seq}) at "
                    f"{send.src_file}:{send.src_line} was never received ({len(q)} message(s) "
                    f"left on program {rx}'s {rx_dir!r} queue); add the matching tl.recv")
        for (_rx, rx_dir), q in sorted(self.parked.items()):
            if q:
                fut, prog = q[0]
                raise SanitizerError(
                    f"{prog.describe()}: tl.recv_async({rx_dir!r}) at line {fut.line} never "
                    f"received a message; add the matching tl.send on the neighbour")

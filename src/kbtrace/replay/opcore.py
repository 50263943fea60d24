"""The simulation's per-op work that the PE model asks for: plans, issues, completions, HBM reads.

For every op the PE model (``stations``' servers, ``cpu.Cpu``) gets its plan (``plan``,
memoised), records its issue (``issue``), waits on other ops (``on_done``), completes it
(``complete``: its completion record, its done flag, then the callbacks waiting on it in
the order they were registered) and, for a DMA read from HBM, reads the pseudo-channels and
books the data's way back (``hbm_read``). ``engine.Sim`` holds one ``OpCore`` and hands
these methods out as its own (``SimContext``).

Compiled: in fast mode with the compiled core (``fabric.core.op_core``) this runs as the
compiled twin ``_opcore_c``, typed by ``opcore.pxd``, which the compiled servers and PE_CPU
call as C methods (the same operations in the same order: byte-identical outputs,
``tests/test_replay_core.py``); this file is the reference, and what flit mode and
``KBTRACE_PURE_PYTHON=1`` run.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from kbtrace.replay.ops import Op, plan_for
from kbtrace.replay.recorder import STAGE_CODE

if TYPE_CHECKING:       # (a module: the compiled twin cimports the class by this name)
    from kbtrace.replay import hbm

__all__ = ["OpCore", "PLAN_CACHE"]

PLAN_CACHE = 1 << 14              # memoised tile plans (cleared when full)
_C_HBM = STAGE_CODE["hbm"]


@lru_cache(maxsize=256)
def _in_tcm(spaces: tuple[str | None, ...]) -> bool:
    """Every one of ``spaces`` is TCM (memoised: a kernel's ops repeat a few)."""
    return all(s == "tcm" for s in spaces)


class OpCore:
    """Plans, issues, completions and HBM reads of one replay (see the module docstring).

    ``done``: per op, 1 once completed; ``waiting``: op id -> the callbacks to call when it
    completes; ``fast`` / ``flows``: the fidelity is a fast one / ``fast`` (whose flows take
    an HBM read's per-burst ready times).
    """
    __slots__ = ("env", "params", "rec", "dones", "x", "iss", "done", "waiting",
                 "plans", "hbm", "fabric", "fast", "flows")

    def __init__(self, env: Any, params: Any, rec: Any, hbm: dict[int, Any], fabric: Any,
                 n_ops: int, fidelity: str) -> None:
        self.env = env
        self.params = params
        self.rec = rec
        self.dones = rec.dones              # the recorder's completions since its last flush
        self.x = rec.hop_rows               # ... and its explicit hop rows
        self.iss = rec.iss                  # ... and its issue log
        self.done = bytearray(n_ops)
        self.waiting: dict[int, list[Callable[[], Any]]] = {}
        self.plans: dict[tuple[Any, ...], Any] = {}
        self.hbm = hbm
        self.fabric = fabric
        self.fast = fidelity != "flit"
        self.flows = fidelity == "fast"

    def plan(self, op: Op) -> Any:
        """``plan_for(op)``, memoised (plans are immutable, and a kernel's ops repeat them):
        loads and stores by (address, size); dots and composites by everything their plan
        reads (shape, tiling, dtypes, epilogue, and the addresses of operands outside TCM), or
        for an op built from a template (``Op.tpl``) by that template's id and those
        addresses (the rest are the template's fields); at most ``PLAN_CACHE`` entries."""
        kind = op.kind
        key: tuple[Any, ...]
        if kind == "load":
            key = (op.src_addr, op.nbytes, 0)
        elif kind == "store":
            key = (op.dst_addr, op.nbytes, 1)
        elif kind == "dot" or kind == "composite":
            spaces = tuple(op.in_spaces or ())
            addrs = op.in_addrs or ()
            ext: Any        # the operands' addresses outside TCM
            if _in_tcm(spaces):     # (a kernel's dots mostly: how many, an int no tuple equals)
                ext = min(len(addrs), len(spaces))
            else:
                ext = tuple([a if s != "tcm" else None for a, s in zip(addrs, spaces,
                                                                        strict=False)])
            dst = op.dst_addr if kind == "composite" and op.dst_space != "tcm" else None
            tpl = op.tpl
            if tpl >= 0:    # the rest of what the plan reads is the op's template's
                key = (kind, tpl, ext, dst)
            else:
                key = (kind, op.name, op.m, op.n, op.k, op.extra_json, op.out_dtype,
                       (op.in_dtypes or ("f32",))[0], spaces, op.dst_space, ext, dst,
                       tuple(op.out_shape or ()))
        else:
            return plan_for(op, self.params)
        cache = self.plans
        pl = cache.get(key)
        if pl is None:
            if len(cache) >= PLAN_CACHE:
                cache.clear()
            pl = cache[key] = plan_for(op, self.params)
        return pl

    def issue(self, op_id: int, t_issue: float) -> None:
        """Op ``op_id`` was issued at ``t_issue`` (now), appended to the recorder's issue log:
        none of its rows starts earlier (the recorder's watermark)."""
        self.iss.add(t_issue, op_id)

    def on_done(self, op_id: int, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` when op ``op_id`` completes (it must not have completed yet)."""
        cbs = self.waiting.get(op_id)
        if cbs is None:
            self.waiting[op_id] = [fn]
        else:
            cbs.append(fn)

    def complete(self, op: Op, t_issue: float, t_start: float, engine: str) -> None:
        """Record op ``op``'s completion (now; ``Recorder.op_done``: a full batch is flushed)
        and run its ``on_done`` callbacks, in order."""
        op_id = op.op_id
        now = self.env._now
        if self.dones.add(op_id, t_issue, t_start, now, engine):
            self.rec.flush(now)
        self.done[op_id] = 1
        cbs = self.waiting.pop(op_id, None)
        if cbs is not None:
            for fn in cbs:
                fn()

    def hbm_read(self, op_id: int, tile: int, src: int, dst: int, addr: int,
                 nbytes: int) -> Any:
        """Read ``nbytes`` at ``addr`` from HBM controller ``src`` (now) and send them to node
        ``dst``: the pseudo-channels' burst finish times, the controller's hop row, and the
        fabric transfer (its event), its flits ready as the bursts finish."""
        h = self.hbm[src]
        t = self.env._now
        shape = 0
        group = 1
        bursts: hbm.Bursts | None
        ready: list[float] | None
        if self.fast and nbytes % h.burst and nbytes > h.burst:
            # a short last burst: the closed form needs to know where it falls in ready order
            # (flits leave in that order; ties keep burst order): head, middle or tail
            bursts, first, last = h.read_lazy(addr, nbytes, t, op_id)
            times = bursts.times()
            short, full = times[-1], times[:-1]
            shape = 1 if short < min(full) else 0 if short >= max(full) else 2
            group = times.count(last)       # ready together at the end: they queue
            ready = None
        elif self.flows and nbytes > h.burst:   # a flow: its bursts, how it reaches its first
            bursts, first, last = h.read_lazy(addr, nbytes, t, op_id)   # link (``fair``), when
            ready = None                                                # asked for
        elif self.fast:
            first, last = h.read_span(addr, nbytes, t, op_id)
            ready = bursts = None
        else:
            ready, first, last = h.read_bursts(addr, nbytes, t, op_id)
        self.x.add(op_id, tile, _C_HBM, src, -1, t, last, nbytes / (h.bw * h.n_pcs),
                   max(0.0, first - t - min(nbytes, h.burst) / h.bw), nbytes)
        if ready is None:       # (fast mode's send: addr, ready, at, ack, span, shape, group,
            return self.fabric.send(op_id, tile, src, dst, nbytes, addr,      # bursts)
                                    None, None, 0.0, (first, last), shape, group, bursts)
        return self.fabric.send(op_id, tile, src, dst, nbytes, addr, ready)

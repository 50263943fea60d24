"""A ``torch.distributed``-like facade over a workload (ADR-0024, ADR-0047): rank = SIP.

::

    dist = w.distributed()                    # or kbtrace.collectives.Distributed(w)
    dist.init_process_group(backend="kbtrace")
    def worker(rank):                         # one per rank, like torch.multiprocessing.spawn
        t = w.tensor(f"g{rank}", (4096,), "f16", init=..., pe=(rank, 0, 0))
        dist.all_reduce(t)                    # waits for every rank, then one collective
        dist.barrier()
    dist.spawn(worker)

``spawn`` runs ``worker(rank)`` for every rank in its own greenlet (one Python process,
as the predecessor did); ``get_rank()`` is the calling greenlet's rank (0 outside a
worker). A collective call parks its rank until every rank has made the same call (the
k-th collective of every rank must be the same kind), then runs once: ``all_reduce``
launches ``collectives.all_reduce`` over the tensors the ranks passed; ``barrier`` is an
ordering point (launches declared before it by any rank run before those declared after).
Outside ``spawn``, ``all_reduce(t)`` reduces a tensor that already has shards on every rank.
A worker that returns while others wait at a collective, or different collectives at the
same step, are one-line errors naming the ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import greenlet

from kbtrace.collectives.host import OPS, all_reduce
from kbtrace.errors import CaptureError

__all__ = ["Distributed", "BACKENDS"]

BACKENDS = ("kbtrace", "ahbm")


class Distributed:
    """The process group of one workload (see the module docstring)."""

    def __init__(self, w: Any) -> None:
        self.w = w
        self._init = False
        self._rank_of: dict[Any, int] = {}
        self._pending: dict[int, tuple[str, Any, dict[str, Any]]] = {}

    # ------------------------------------------------------------------ group
    def init_process_group(self, backend: str = "kbtrace", world_size: int | None = None,
                           rank: int | None = None, **_: Any) -> None:
        """Start the group; ``world_size`` / ``rank`` are accepted and ignored (rank = SIP)."""
        if backend not in BACKENDS:
            raise CaptureError(f"init_process_group: unsupported backend {backend!r}; use "
                               f"{' or '.join(repr(b) for b in BACKENDS)}")
        self._init = True

    def is_initialized(self) -> bool:
        return self._init

    def _ensure(self, what: str) -> None:
        if not self._init:
            raise CaptureError(f"{what}: the default process group is not initialized; call "
                               f"dist.init_process_group() first")

    def get_world_size(self) -> int:
        self._ensure("get_world_size")
        return int(self.w.topo.n_sips)

    def get_rank(self) -> int:
        self._ensure("get_rank")
        return self._rank_of.get(greenlet.getcurrent(), 0)

    def get_backend(self) -> str:
        self._ensure("get_backend")
        return "kbtrace"

    # ------------------------------------------------------------------ spawn
    def spawn(self, fn: Callable[[int], Any], nprocs: int | None = None) -> None:
        """Run ``fn(rank)`` for every rank cooperatively (``torch.multiprocessing.spawn``):
        each runs until it returns or parks at a collective; once every rank is parked at
        one, the collective runs and they all resume."""
        self._ensure("spawn")
        n = self.get_world_size()
        if nprocs is not None and int(nprocs) != n:
            raise CaptureError(f"spawn: nprocs={nprocs} but the topology has {n} SIP(s) (rank = "
                               f"SIP); pass nprocs={n} or --set system.sips.count={nprocs}")
        parent = greenlet.getcurrent()
        glets = [greenlet.greenlet(fn, parent=parent) for _ in range(n)]
        for r, g in enumerate(glets):
            self._rank_of[g] = r
        started: set[int] = set()
        done: set[int] = set()
        try:
            while len(done) < n:
                for r, g in enumerate(glets):
                    if r in done or r in self._pending:
                        continue
                    if r in started:
                        g.switch()
                    else:
                        started.add(r)
                        g.switch(r)
                    if g.dead:
                        done.add(r)
                if self._pending:
                    if done:
                        self._abandoned(min(done))
                    self._run(dict(sorted(self._pending.items())))
        finally:
            self._pending.clear()
            for g in glets:
                self._rank_of.pop(g, None)

    def _abandoned(self, rank: int) -> None:
        kinds = sorted({k for k, _, _ in self._pending.values()})
        raise CaptureError(f"{' / '.join(kinds)}: ranks {sorted(self._pending)} wait for rank "
                           f"{rank}, whose worker returned without calling it; every rank must "
                           f"make the same collective calls in the same order")

    def _collective(self, kind: str, arg: Any, opts: dict[str, Any]) -> None:
        """Park the calling worker until every rank made this call; outside spawn, run it."""
        g = greenlet.getcurrent()
        rank = self._rank_of.get(g)
        if rank is None:                                  # single driver
            if kind == "all_reduce":
                all_reduce(self.w, arg, **opts)
            return
        self._pending[rank] = (kind, arg, opts)
        g.parent.switch()

    def _run(self, pend: dict[int, tuple[str, Any, dict[str, Any]]]) -> None:
        self._pending.clear()
        kinds = {k for k, _, _ in pend.values()}
        if len(kinds) > 1:
            what = "; ".join(f"rank {r} in {k}" for r, (k, _, _) in pend.items())
            raise CaptureError(f"collective mismatch: {what}; every rank must make the same "
                               f"collective calls in the same order")
        if kinds.pop() == "barrier":
            return
        opts = [o for _, _, o in pend.values()]
        for r, (_, _, o) in pend.items():
            if o != opts[0]:
                raise CaptureError(f"all_reduce: rank {r} passed {o}, rank 0 {opts[0]}; pass the "
                                   f"same op, algorithm and IPCQ settings on every rank")
        all_reduce(self.w, [t for _, t, _ in pend.values()], **opts[0])

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, tensor: Any, op: str = "sum", *, algorithm: str = "lrab",
                   root: str = "centre", buffer_kind: str | None = None,
                   n_slots: int | None = None, slot_bytes: int | None = None) -> None:
        """Sum ``tensor`` over the ranks (every shard gets the total, in place)."""
        self._ensure("all_reduce")
        if op not in OPS:
            raise CaptureError(f"all_reduce: unsupported op {op!r}; supported: {', '.join(OPS)}")
        self._collective("all_reduce", tensor, {"op": op, "algorithm": algorithm, "root": root,
                                                "buffer_kind": buffer_kind, "n_slots": n_slots,
                                                "slot_bytes": slot_bytes})

    def barrier(self) -> None:
        """An ordering point between the ranks' declarations (no-op outside ``spawn``)."""
        self._ensure("barrier")
        if self._rank_of.get(greenlet.getcurrent()) is None:
            return
        self._collective("barrier", None, {})

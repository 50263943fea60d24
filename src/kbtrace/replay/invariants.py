"""Physical invariants checked at the end of every replay (InvariantError on violation).

1. No resource busy over 100 %: per resource (a link, or a node's engine
   channel), busy intervals ``[t_enter + queue, t_leave]`` are merged into
   connected windows; the busy time inside a window must not exceed
   ``capacity * window length`` (capacity = DMA channel count, else 1), and no
   single hop may be busier than its own interval.
2. Bytes conserved: every transfer delivers exactly the bytes it sent (checked
   per transfer by the fabric at the destination; flit mode counts flits).
3. Per-resource timestamps monotone: each link/node server checks service starts
   never go back (flit mode), reservations are monotone by construction (fast).
4. Every IPCQ send was consumed by its matching recv.
5. Analytical lower bounds: each load/store/h2d/d2h lasts at least the route's
   ``lower_bound_ns`` (request leg + data leg), and the makespan is at least the
   largest ``t_issue + lower bound`` and the last launch barrier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kbtrace.errors import InvariantError

if TYPE_CHECKING:  # pragma: no cover
    from kbtrace.replay.engine import Sim

__all__ = ["check", "EPS_NS"]

EPS_NS = 1e-6


def _res_name(sim: Sim, rid: int) -> tuple[str, int]:
    topo, rec = sim.topo, sim.rec
    if rid < rec.n_links:
        lk = topo.links[rid]
        return f"link {topo.nodes[lk.src].id}->{topo.nodes[lk.dst].id}", 1
    node, stage = rec.res_names[rid - rec.n_links]
    dma = sim.params.pe.dma
    cap = dma.read_channels if stage == "dma_read" else dma.write_channels \
        if stage == "dma_write" else 1
    return f"{topo.nodes[node].id} ({stage})", cap


def _cap(sim: Sim, rid: int) -> int:
    rec = sim.rec
    if rid < rec.n_links:
        return 1
    stage = rec.res_names[rid - rec.n_links][1]
    dma = sim.params.pe.dma
    return dma.read_channels if stage == "dma_read" else dma.write_channels \
        if stage == "dma_write" else 1


def check_busy(sim: Sim) -> float:
    """Check invariant 1; return the highest per-window utilisation seen (0..1).

    One vectorised sweep over all resources: intervals sorted by (resource,
    start); a new window opens at a resource's first interval or where the start
    lies beyond the running maximum end of the resource (a per-resource running
    max done exactly on integer keys ``group * n + rank(end)``).
    """
    res, s, e, b = sim.rec.intervals()
    n = len(res)
    if not n:
        return 0.0
    bad = np.nonzero(b > (e - s) + EPS_NS)[0]
    if bad.size:
        i = int(bad[0])
        name, _ = _res_name(sim, int(res[i]))
        raise InvariantError(f"{name}: busy {b[i]:.3f} ns inside a {e[i] - s[i]:.3f} ns interval "
                             f"[{s[i]:.3f}, {e[i]:.3f}] ns (over 100%)")
    order = np.lexsort((s, res))
    res, s, e, b = res[order], s[order], e[order], b[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(res[1:], res[:-1], out=first[1:])
    grp = np.cumsum(first) - 1
    by_end = np.argsort(e, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_end] = np.arange(n)
    base = grp * n
    run_max = e[by_end[np.maximum.accumulate(base + rank) - base]]   # per-resource running max end
    new = first.copy()
    new[1:] |= s[1:] > run_max[:-1] + EPS_NS
    cidx = np.flatnonzero(new)
    w_start = s[cidx]
    w_end = np.maximum.reduceat(e, cidx)
    w_busy = np.add.reduceat(b, cidx)
    g_first = np.flatnonzero(first)
    g_size = np.diff(np.append(g_first, n))
    g_cap = np.array([_cap(sim, int(r)) for r in res[g_first].tolist()], dtype=np.float64)
    w_grp = grp[cidx]
    cap = g_cap[w_grp]
    span = w_end - w_start
    over = np.nonzero(w_busy > cap * span + EPS_NS * g_size[w_grp])[0]
    if over.size:
        j = int(over[0])
        name, c = _res_name(sim, int(res[cidx[j]]))
        raise InvariantError(
            f"{name}: busy {w_busy[j]:.3f} ns in window [{w_start[j]:.3f}, {w_end[j]:.3f}] ns "
            f"of {span[j]:.3f} ns with capacity {c} (over 100%)")
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(span > 0, w_busy / (cap * span), 0.0)
    return float(u.max(initial=0.0))


def check(sim: Sim, makespan: float) -> None:
    check_busy(sim)
    for sid, ev in sorted(sim._ready.items()):
        if not ev.processed and sim.ops[sid].kind == "send":
            raise InvariantError(f"IPCQ send op {sid} was never delivered")
    consumed = set(sim._match.values())
    for o in sim.ops:
        if o.kind == "send" and o.op_id not in consumed:
            raise InvariantError(f"IPCQ send op {o.op_id} (program {o.program}, seq {o.seq}) has "
                                 f"no matching recv (unmatched send)")
    rec, topo, fab = sim.rec, sim.topo, sim.fabric
    lb_end = max((ln["t_barrier_ns"] for ln in sim.launches), default=0.0)
    bounds: dict[tuple, float] = {}
    dmas: dict[tuple[int, int, int], int] = {}
    host = sim.host
    for o in sim.ops:
        kind = o.kind
        if kind not in ("load", "store", "h2d", "d2h"):
            continue
        nb = int(o.nbytes)
        if kind == "load" or kind == "store":
            dma = dmas.get((o.sip, o.cube, o.pe))
            if dma is None:
                dma = dmas[(o.sip, o.cube, o.pe)] = topo.pe_node(_coord(o), "dma").idx
            key = (kind, dma, sim.resolve(o.src_addr if kind == "load" else o.dst_addr), nb)
        else:
            key = (kind, host, sim.resolve(o.dst_addr if kind == "h2d" else o.src_addr), nb)
        lb = bounds.get(key)
        if lb is None:
            lb = bounds[key] = _lower_bound(topo, *key)
        dur = rec.t_end[o.op_id] - rec.t_issue[o.op_id]
        if dur + 1e-6 < lb:
            raise InvariantError(f"op {o.op_id} ({kind}, {nb} B) took {dur:.3f} ns, below its "
                                 f"analytical lower bound {lb:.3f} ns ({fab.fidelity} mode)")
        lb_end = max(lb_end, rec.t_issue[o.op_id] + lb)
    if makespan + 1e-6 < lb_end:
        raise InvariantError(f"makespan {makespan:.3f} ns is below the analytical lower bound "
                             f"{lb_end:.3f} ns")


def _lower_bound(topo, kind: str, a: int, mem: int, nb: int) -> float:
    """Route lower bound of one memory op: ``a`` is the DMA (load/store) or the host."""
    if kind == "load":
        return topo.route(a, mem).lower_bound_ns(0) + topo.route(mem, a).lower_bound_ns(nb)
    if kind == "store":
        return topo.route(a, mem).lower_bound_ns(nb) + topo.route(mem, a).lower_bound_ns(0)
    if kind == "h2d":
        return topo.route(a, mem).lower_bound_ns(nb)
    return topo.route(mem, a).lower_bound_ns(nb)


def _coord(o):
    from kbtrace.topology.model import PeCoord
    return PeCoord(o.sip, o.cube, o.pe)

"""The re-timing engine behind ``whatif`` (the model is described in ``whatif``'s docstring).

``Retimer(base)`` reads a run once and prepares everything that does not depend on the
parameters: segments in op order, critical positions, the binder of every recorded wait,
the recorded service order of contended resources, program-order predecessors, the event
order. ``Retimer.retime(topology)`` then prices the hops on a new compiled topology and
runs one pass over the events; it can be called many times (``attribute`` re-times one run
on many machines).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow.parquet as pq

from kbtrace.insight.base import BaseRun
from kbtrace.insight.credits import Credits
from kbtrace.insight.pricing import Pricer

__all__ = ["Retimer", "Estimate"]

_EPS = 1e-6
_EXCLUSIVE_STAGES = ("hbm", "gemm", "math")


class Estimate:
    """What one pass found: the new makespan and the order checks."""
    __slots__ = ("makespan_ns", "flips", "new_overlaps", "error_bound_ns", "hot", "late",
                 "ends", "issues")

    def __init__(self, makespan_ns: float) -> None:
        self.makespan_ns = makespan_ns
        self.ends = self.issues = np.zeros(0)       # per op row: new end and issue
        self.flips = self.new_overlaps = self.late = 0
        self.error_bound_ns = 0.0
        self.hot: list[tuple[str, int]] = []


class Retimer:
    """A recorded run prepared for re-timing (see the module docstring)."""

    def __init__(self, base: BaseRun) -> None:
        self.base = base
        d = base.run_dir
        ot = pq.read_table(d / "op_timing.parquet", columns=[
            "op_id", "launch", "program", "seq", "t_issue_ns", "t_end_ns"])
        hp = pq.read_table(d / "hops.parquet", columns=[
            "op_id", "hop", "tile", "stage", "node_idx", "link_idx", "t_enter_ns", "t_leave_ns",
            "busy_ns", "queue_ns", "crit_ns", "nbytes"])
        ops = pq.read_table(base.trace_dir / "ops.parquet", columns=[
            "op_id", "kind", "name", "out_shape", "deps", "match_op_id", "launch", "program",
            "peer_program", "direction", "nbytes", "extra_json"])
        self.composite = int(np.sum(ops.column("kind").combine_chunks().dictionary_decode()
                                    .to_numpy(zero_copy_only=False) == "composite"))
        ot_c = {c: ot.column(c).to_numpy() for c in ot.column_names}
        pl = pq.read_table(d / "op_timing.parquet", columns=["sip", "cube", "pe"])
        self.place = list(zip(*(pl.column(c).to_numpy().tolist() for c in ("sip", "cube", "pe")),
                              strict=True))
        self.launches = {int(ln["launch"]): ln for ln in base.info.get("launches") or []
                         if isinstance(ln, dict) and "launch" in ln}
        h = {c: hp.column(c).to_numpy() for c in hp.column_names if c != "stage"}
        h["stage"] = (hp.column("stage").combine_chunks().dictionary_decode()
                      .to_numpy(zero_copy_only=False))
        deps_all = ops.column("deps").to_pylist()
        match_all = ops.column("match_op_id").to_pylist()
        ids = ops.column("op_id").to_numpy()
        n_ops = len(ot_c["op_id"])
        size = int(max(ids.max() if len(ids) else 0, ot_c["op_id"].max() if n_ops else 0)) + 1
        op_row = np.full(size, -1, dtype=np.int64)
        op_row[ot_c["op_id"]] = np.arange(n_ops)
        self.n_ops = n_ops
        # dependencies and IPCQ matches by op row
        by_id = dict(zip(ids.tolist(), range(len(ids)), strict=True))
        self.deps = [[int(op_row[d]) for d in (deps_all[by_id[i]] or ()) if 0 <= d < size
                      and op_row[d] >= 0] for i in ot_c["op_id"].tolist()]
        self.match = [match_all[by_id[i]] for i in ot_c["op_id"].tolist()]
        self._ops_math = (by_id, ops.column("name").to_pylist(), ops.column("out_shape"))
        order = np.lexsort((h["hop"], op_row[h["op_id"]]))
        if not np.array_equal(order, np.arange(len(order))):
            h = {k: v[order] for k, v in h.items()}
        self.h = h
        self.seg_op = seg_op = op_row[h["op_id"]]
        self.op_ids = ot_c["op_id"]
        crit, q = h["crit_ns"], h["queue_ns"]
        self.cq = cq = np.minimum(q, crit)
        rows = np.arange(n_ops)
        self.first = first = np.searchsorted(seg_op, rows, side="left")
        self.last = last = np.searchsorted(seg_op, rows, side="right")
        self.has = last > first
        self.issue, self.end = ot_c["t_issue_ns"], ot_c["t_end_ns"]
        issue = self.issue
        self.fs = fs = first[seg_op]
        cum = np.cumsum(crit) - crit
        self.A = issue[seg_op] + cum - cum[fs]                        # critical positions
        cqc = np.cumsum(cq) - cq
        self.cqp = cqc - cqc[fs]                                      # recorded waits before
        self.off = h["t_enter_ns"] - self.A
        self.S = h["t_enter_ns"] + q                                   # recorded service start
        self.res = np.where(h["link_idx"] >= 0, h["link_idx"], -1 - h["node_idx"])
        queued = np.flatnonzero(q > _EPS)
        self.binder, hot = self._binders(queued)
        self.unexplained = len(queued) - len(self.binder)
        lone = [k for k in queued.tolist() if k not in self.binder]
        #: the critical part of the waits kept as recorded (their cause was not found)
        self.unexplained_ns = float(cq[lone].sum()) if lone else 0.0
        self.pred, chained = self._chain(hot)
        cols = {c: ops.column(c).to_pylist() for c in ("op_id", "kind", "match_op_id",
                                                     "launch", "program", "peer_program",
                                                     "direction", "nbytes", "extra_json")}
        self.credits = Credits(cols, op_row, seg_op, first, last, h["stage"],
                               base.topology.params)
        events = np.union1d(np.union1d(queued, chained), self.credits.rows)
        self.prev = self._prev_rows(ot_c)
        self.launch_of = ot_c["launch"].tolist()
        self._prepare_launch()
        kind_row = np.full(n_ops, "", dtype=object)      # op kind by op row
        row_of = op_row[ids]
        kind_row[row_of[row_of >= 0]] = np.array(cols["kind"], dtype=object)[row_of >= 0]
        credit_leg = ((kind_row[seg_op] == "recv") & (h["link_idx"] >= 0)
                      & (h["nbytes"] == int(base.topology.params.pe.ipcq.credit_bytes)))
        self.pricer = Pricer(self.h, self.seg_op, self.cq, self.op_ids, base.topology,
                             self._ops_math, credit_leg)
        self._prepare_order()
        ev_t = np.concatenate([issue, self.S[events]])
        ev_kind = np.concatenate([np.zeros(n_ops, np.int8), np.ones(len(events), np.int8)])
        ev_id = np.concatenate([rows, events])
        srt = np.lexsort((ev_id, ev_kind, ev_t))
        # the pass reads Python lists (scalar access to numpy arrays is ~10x slower)
        self.events = list(zip(ev_kind[srt].tolist(), ev_id[srt].tolist(), strict=True))
        self.L = {k: getattr(self, k).tolist() for k in
                  ("seg_op", "first", "last", "issue", "end", "A", "cqp", "off", "S", "cq")}
        self.L["crit"], self.L["q"] = crit.tolist(), q.tolist()
        self.L["nohop"] = (~self.has).tolist()
        self._prepare_events()

    def _prepare_events(self) -> None:
        """The events as tuples holding everything about them that does not depend on the
        new topology (the pass unpacks one tuple per event). An op issue: ``(0, op, t,
        predecessor, how it followed it (0 none, 1 after its end, 2 while it ran), its end,
        the dependencies that ended before ``t`` with their ends, the launch whose start
        barrier it waited for (-1), the launch completion it waited for (-1))``. A waiting
        segment or contended user: ``(1, seg, op, binder kind (0 a service end, 1 a tail
        leaving, 2 an op end, 3 an unknown cause, 4 none), binder, previous user (-1),
        recorded wait, critical wait, on the critical path, service start)``."""
        L = self.L
        issue, end, q, cq, crit, S = L["issue"], L["end"], L["q"], L["cq"], L["crit"], L["S"]
        seg_op, prev, deps, rec, launch_of = L["seg_op"], self.prev, self.deps, self.rec, self.launch_of
        ev: list[tuple[Any, ...]] = []
        credit_rows = set(self.credits.rows.tolist())
        for kind, x in self.events:
            if kind == 0:
                t = issue[x]
                p = prev[x]
                how = 0 if p < 0 else 1 if t >= end[p] - _EPS else 2
                dps = tuple((r, end[r]) for r in deps[x] if end[r] <= t + _EPS)
                ln = launch_of[x]
                first = ln if p < 0 and ln in rec else -1
                d = self.done_at.get(round(t, 6)) if ln not in rec else None
                ev.append((0, x, t, p, how, end[p] if how == 1 else self._warp_spec(p, t)
                           if how == 2 else 0.0, dps, first, -1 if d is None else d))
                continue
            b = self.binder.get(x)
            bk, j = b if b is not None else ((3, -1) if q[x] > _EPS else (4, -1))
            by: Any = self._warp_spec(seg_op[j], S[x]) if bk == 1 else j
            p = self.pred.get(x)
            ev.append((1, x, seg_op[x], bk, by, -1 if p is None else p, q[x], cq[x],
                       crit[x] > _EPS or x in credit_rows, S[x]))   # a send waits in line
        self.ev = ev
        self.ev_at = {e[1]: i for i, e in enumerate(ev) if e[0]}   # segment -> its event

    def _warp_spec(self, o: int, t: float) -> tuple[Any, ...]:
        """How recorded time ``t`` of op row ``o`` maps to the new timeline (the pass's
        ``warp``): ``(0, o, t - end)`` after its end, ``(1, o, t, t - issue)`` before its
        first segment, else ``(2, k, fraction)``: that far into segment ``k``'s wait and
        service (piecewise linear over the op's critical segments)."""
        L = self.L
        end, issue, first, last, A, crit = (L["end"], L["issue"], L["first"], L["last"],
                                            L["A"], L["crit"])
        if t >= end[o] - _EPS:
            return (0, o, t - end[o])
        f, la = first[o], last[o]
        if f == la or t <= issue[o] + _EPS:
            return (1, o, t, t - issue[o])
        k = max(f, f + int(np.searchsorted(self.A[f:la], t, side="right")) - 1)
        c = crit[k]
        return (2, k, min(t - A[k], c) / c if c > _EPS else 0.0)

    # -- preparation (parameter-independent)
    @staticmethod
    def _prev_rows(ot: dict[str, np.ndarray]) -> list[int]:
        """Row of each op's program-order predecessor (-1 for a program's first op)."""
        order = np.lexsort((ot["seq"], ot["program"], ot["launch"]))
        prev = np.full(len(order), -1, dtype=np.int64)
        same = ((ot["launch"][order][1:] == ot["launch"][order][:-1])
                & (ot["program"][order][1:] == ot["program"][order][:-1]))
        prev[order[1:][same]] = order[:-1][same]
        return prev.tolist()

    def _exclusive(self) -> tuple[np.ndarray, np.ndarray]:
        """Segments on exclusive resources (links; HBM, GEMM, MATH engines) that were busy,
        and their resource keys (link index, or -1 - node index)."""
        h = self.h
        excl = (h["link_idx"] >= 0) | np.isin(h["stage"], _EXCLUSIVE_STAGES)
        idx = np.flatnonzero(excl & (h["busy_ns"] > 0))
        return idx, self.res[idx]

    def _chain(self, hot: set[int]) -> tuple[dict[int, int], np.ndarray]:
        """On each exclusive resource that made a user wait in the recording (``hot``), each
        user's previous user in recorded service order, where the two did not overlap
        (overlapping users were served side by side: pseudo-channels, shared link rate).
        Returns that map and every user of those resources (their service ends are kept)."""
        idx, key = self._exclusive()
        sel = np.isin(key, np.fromiter(hot, dtype=np.int64, count=len(hot)))
        idx, key = idx[sel], key[sel]
        s_old = self.S[idx]
        e_old = s_old + self.h["busy_ns"][idx]
        o = np.lexsort((idx, s_old, key))
        ok = (key[o][1:] == key[o][:-1]) & (s_old[o][1:] >= e_old[o][:-1] - _EPS)
        a, b = idx[o[:-1][ok]], idx[o[1:][ok]]
        return dict(zip(b.tolist(), a.tolist(), strict=True)), idx

    def _binders(self, queued: np.ndarray) -> tuple[dict[int, tuple[int, int]], set[int]]:
        """For each waiting segment, the recorded event its wait ended at:
        (0, j) the service end of segment j, (1, j) the tail of segment j leaving,
        (2, r) the end of op row r. Preference: same resource, a related op (IPCQ match,
        dependency), an earlier segment of the same op, anything else. Also returns the
        resources whose users waited for each other (contended)."""
        h = self.h
        n = len(self.seg_op)
        t = np.concatenate([self.S + h["busy_ns"], h["t_leave_ns"], self.end])
        kind = np.concatenate([np.zeros(n, np.int8), np.ones(n, np.int8),
                               np.full(len(self.end), 2, np.int8)])
        ref = np.concatenate([np.arange(n), np.arange(n), np.arange(len(self.end))])
        srt = np.argsort(t, kind="stable")
        t, kind, ref = t[srt], kind[srt], ref[srt]
        lo = np.searchsorted(t, self.S[queued] - _EPS).tolist()
        hi = np.searchsorted(t, self.S[queued] + _EPS, side="right").tolist()
        kind_l, ref_l = kind.tolist(), ref.tolist()
        seg_op, res_l = self.seg_op.tolist(), self.res.tolist()
        op_ids = self.op_ids.tolist()
        out: dict[int, tuple[int, int]] = {}
        hot: set[int] = set()
        for s, a, b in zip(queued.tolist(), lo, hi, strict=True):
            o = seg_op[s]
            rel = set(self.deps[o])
            m = self.match[o]
            best, score = None, 9
            for i in range(a, b):
                k, r = kind_l[i], ref_l[i]
                if k == 2:
                    sc = 3 if r in rel or op_ids[r] == m else 5
                else:
                    if r == s:
                        continue
                    ro = seg_op[r]
                    if ro == o and r > s:
                        continue
                    same = res_l[r] == res_l[s]
                    sc = (0 if same and k == 0 else 1 if same else
                          2 if ro in rel or op_ids[ro] == m else 4 if ro == o else 6)
                if sc < score:
                    best, score = (k, r), sc
            if best is not None:
                out[s] = best
                if score <= 1:
                    hot.add(res_l[s])
        return out, hot

    def _prepare_launch(self) -> None:
        """Per launch, the PEs it runs on; the programs' first ops (issued at the barrier)
        and last ops (whose completions travel back to the host)."""
        pes: dict[int, set[tuple[int, int, int]]] = {}
        last: dict[tuple[int, int, int, int], int] = {}
        host_end: dict[float, int] = {}          # host-program ops (copies) by their end
        for r, (ln, pc) in enumerate(zip(self.launch_of, self.place, strict=True)):
            if ln not in self.launches:
                host_end[round(float(self.end[r]), 6)] = r
                continue
            pes.setdefault(ln, set()).add(pc)
            k = (ln, *pc)
            if k not in last or self.end[r] >= self.end[last[k]]:
                last[k] = r
        self.launch_pes = {ln: sorted(v) for ln, v in pes.items()}
        self.last_ops = last
        self.by_launch: dict[int, list[tuple[tuple[int, ...], int]]] = {}
        for k, r in last.items():
            self.by_launch.setdefault(k[0], []).append((k, r))
        self.host_end = host_end
        self.launch_order = sorted(self.launch_pes)
        self.rec = {ln: (float(self.launches[ln].get("t_launch_ns", 0.0)),
                         float(self.launches[ln].get("t_barrier_ns", 0.0)),
                         float(self.launches[ln].get("t_done_ns", 0.0)))
                    for ln in self.launch_order}
        self.done_at = {round(v[2], 6): ln for ln, v in self.rec.items()}
        self._launch_routes(self.base.topology)
        self.down_o, self.up_o = self._launch_paths(self.base.topology)

    def _launch_routes(self, topo: Any) -> None:
        """The routes of every launch's fan-out (host -> IO_CPU -> M_CPU -> PE_CPU) and of
        every PE's completion back, as node and link indices per path (path ``2 i`` down
        and ``2 i + 1`` up for (launch, PE) ``i``): the graph, and so the routes, are the
        same on every topology the run is re-timed on."""
        from kbtrace.topology.model import PeCoord

        self.lp_keys = [(ln, *pe) for ln, pes in self.launch_pes.items() for pe in pes]
        nodes: list[int] = []
        links: list[int] = []
        n_path: list[int] = []
        l_path: list[int] = []
        try:
            host = topo.host
            for i, (_ln, s, c, p) in enumerate(self.lp_keys):
                io, m = topo.io_cpu(s), topo.m_cpu(s, c)
                cpu = topo.pe_node(PeCoord(s, c, p), "pe_cpu")
                for k, legs in enumerate((((host, io), (io, m), (m, cpu)),
                                          ((cpu, m), (m, io), (io, host)))):
                    for a, b in legs:
                        r = topo.route(a, b)
                        nodes += r.nodes[1:]
                        links += r.links
                        n_path += [2 * i + k] * (len(r.nodes) - 1)
                        l_path += [2 * i + k] * len(r.links)
        except Exception:   # noqa: BLE001 - no launch path: the recorded one is kept
            self.lp_keys = []
            nodes, links, n_path, l_path = [], [], [], []
        self.lp_idx = (np.array(nodes, np.int64), np.array(links, np.int64),
                       np.array(n_path, np.int64), np.array(l_path, np.int64))

    def _launch_paths(self, topo: Any) -> tuple[dict[int, float], dict[tuple[int, ...], float]]:
        """(per launch: fan-out latency, max over its PEs; per (launch, PE): the
        completion's way back) on ``topo``, as replay's ``_launch_ns`` computes them:
        propagation plus the overheads of every node but the source, along the routes of
        ``_launch_routes``."""
        from kbtrace.insight.pricing import topo_cols

        nodes, links, n_path, l_path = self.lp_idx
        ov, lat, _bw = topo_cols(topo)
        n = 2 * len(self.lp_keys)
        tot = (np.bincount(n_path, weights=ov[nodes], minlength=n)
               + np.bincount(l_path, weights=lat[links], minlength=n)).tolist()
        down: dict[int, float] = {}
        up: dict[tuple[int, ...], float] = {}
        for i, k in enumerate(self.lp_keys):
            down[k[0]] = max(down.get(k[0], 0.0), tot[2 * i])
            up[k] = tot[2 * i + 1]
        return down, up

    # -- the pass
    def retime(self, new: Any) -> Estimate:
        """Re-time the prepared run on compiled topology ``new``."""
        serv_n, busy_n = self.pricer.service(new)
        cumn = np.cumsum(serv_n) - serv_n
        Pn_a = cumn - cumn[self.fs]
        Pn = Pn_a.tolist()
        tot = np.zeros(self.n_ops)
        if self.has.any():
            tot[self.has] = np.add.reduceat(serv_n + self.cq, self.first[self.has])
        L = self.L
        seg_op, issue, end = L["seg_op"], L["issue"], L["end"]
        A, cqp, off, cq, q = L["A"], L["cqp"], L["off"], L["cq"], L["q"]
        nohop = L["nohop"]
        busy_l, serv_l, tot_l = busy_n.tolist(), serv_n.tolist(), tot.tolist()
        n = len(seg_op)
        cqn: dict[int, float] = {}              # new critical wait / wait, by segment,
        qn: dict[int, float] = {}               # where they were re-derived
        send: list[float | None] = [None] * n
        dq = [0.0] * self.n_ops
        nan = float("nan")
        issue_n = [nan] * self.n_ops            # NaN until the op's issue is re-timed
        end_fix: dict[int, float] = {}
        late = 0
        deps = self.deps
        down_n, up_n = self._launch_paths(new)
        rec, order = self.rec, self.launch_order
        by_launch = self.by_launch
        done_new: dict[int, float] = {}
        barrier_new: dict[int, float] = {}

        def launch_done(ln: int) -> float:
            """New completion of launch ``ln``: its last PE's completion at the host."""
            v = done_new.get(ln)
            if v is None:
                v = max(end_new(r) + up_n.get(k, self.up_o.get(k, 0.0))
                        for k, r in by_launch[ln])
                done_new[ln] = v
            return v

        def launch_barrier(ln: int) -> float:
            """New start barrier of launch ``ln``: it starts when the host program reaches
            it (the previous launch's completion, or a host copy's end), plus the fan-out."""
            v = barrier_new.get(ln)
            if v is None:
                t_launch = rec[ln][0]
                i = order.index(ln)
                if i and abs(t_launch - rec[order[i - 1]][2]) <= _EPS:
                    start = launch_done(order[i - 1])
                else:
                    r = self.host_end.get(round(t_launch, 6))
                    start = end_new(r) if r is not None else t_launch
                v = barrier_new[ln] = start + down_n.get(ln, self.down_o.get(ln, 0.0))
            return v

        def a_new(k: int) -> float:
            nonlocal late
            o = seg_op[k]
            i = issue_n[o]
            if i != i:
                late += 1
                return A[k]
            return i + Pn[k] + cqp[k] + dq[o]

        def end_new(o: int) -> float:
            nonlocal late
            i = issue_n[o]
            if i != i:
                late += 1
                return end[o]
            if nohop[o]:
                return end_fix.get(o, i + end[o] - issue[o])
            return i + tot_l[o] + dq[o]

        def warp(w: tuple[Any, ...]) -> float:
            """A recorded time inside an op on the new timeline (``_warp_spec``)."""
            if w[0] == 2:
                k = w[1]
                return a_new(k) + w[2] * (serv_l[k] + cqn.get(k, cq[k]))
            if w[0] == 0:
                return end_new(w[1]) + w[2]
            i = issue_n[w[1]]
            return (w[2] if i != i else i) + w[3]

        def svc_end(j: int) -> float:
            v = send[j]
            return v if v is not None else a_new(j) + off[j] + qn.get(j, q[j]) + busy_l[j]

        evs, stale = self.credits.events(self.ev, self.ev_at, self.L["end"], self.L["S"],
                                         new.params)
        for ev in evs:
            if ev[0]:                           # a waiting segment / a contended user
                _k, s, o, bk, j, p, qs, cqs, on_crit, s_rec = ev
                i = issue_n[o]
                if i != i:
                    late += 1
                    arr = A[s] + off[s]
                else:
                    arr = i + Pn[s] + cqp[s] + dq[o] + off[s]
                if bk == 0:
                    t_b = send[j]
                    if t_b is None:
                        t_b = svc_end(j)
                elif bk == 1:
                    t_b = warp(j)
                elif bk == 2:
                    t_b = end_new(j)
                elif bk == 3:                   # a wait of unknown cause: at least as long
                    t_b = arr + qs
                else:
                    t_b = None
                if p >= 0:                      # the previous user, in recorded order
                    e = send[p]
                    if e is None:
                        e = svc_end(p)
                    if t_b is None or e > t_b:
                        t_b = e
                w = 0.0 if t_b is None or t_b <= arr else t_b - arr
                qn[s] = w
                # a wait adds to the op's latency only on a segment of its critical path
                if on_crit:
                    c = cqs + w - qs
                    if c < 0.0:
                        c = 0.0
                else:
                    c = 0.0
                dq[o] += c - cqs
                cqn[s] = c
                send[s] = arr + w + busy_l[s]
                continue
            _k, x, t, p, how, end_p, dps, first_ln, done_ln = ev   # an op issue
            if how == 1:                        # after its predecessor's end
                ip = issue_n[p]
                if ip != ip:
                    late += 1
                    best = end_p
                elif nohop[p]:
                    best = end_fix.get(p, ip + end_p - issue[p])
                else:
                    best = ip + tot_l[p] + dq[p]
                latest = end_p
            elif how == 2:                      # the predecessor let the program go on
                best, latest = warp(end_p), t
            else:
                best = latest = None
            for r, end_r in dps:
                ir = issue_n[r]                 # end_new(r), inline (ops wait on many)
                e = end_new(r) if ir != ir or nohop[r] else ir + tot_l[r] + dq[r]
                if best is None or e > best:
                    best = e
                if latest is None or end_r > latest:
                    latest = end_r
            if first_ln >= 0:                   # a program's first op: the start barrier
                b = launch_barrier(first_ln) + (t - rec[first_ln][1])
                best = b if best is None else max(best, b)
                latest = t if latest is None else max(latest, t)
            elif done_ln >= 0:                  # the host program waits for launches
                e = launch_done(done_ln)
                best = e if best is None else max(best, e)
                latest = t if latest is None else max(latest, t)
            if best is None:
                issue_n[x] = t
            else:
                issue_n[x] = best + (t - latest if t > latest else 0.0)
            if nohop[x]:                        # fill / wait: an end bound to a dep's end
                e = end[x]
                fix = issue_n[x] + e - t
                if e > t + _EPS:
                    for r in deps[x]:
                        if abs(end[r] - e) <= _EPS:
                            fix = max(issue_n[x], end_new(r))
                end_fix[x] = fix
        issue_a = np.array(issue_n)
        ends = issue_a + np.where(self.has, tot + np.array(dq), self.end - self.issue)
        for o, v in end_fix.items():
            ends[o] = v
        mk = self._makespan(ends, launch_done)
        est = Estimate(mk)
        est.late = late
        est.ends, est.issues = ends, issue_a
        cqn_a, qn_a = self.cq.copy(), self.h["queue_ns"].copy()
        if qn:
            k_ = np.fromiter(qn.keys(), np.int64, len(qn))
            qn_a[k_] = np.fromiter(qn.values(), float, len(qn))
            cqn_a[k_] = np.fromiter(cqn.values(), float, len(cqn))
        d = cqn_a - self.cq
        dc = np.cumsum(d) - d
        a_all = issue_a[self.seg_op] + Pn_a + self.cqp + dc - dc[self.fs]
        self._order_check(est, a_all, qn_a, busy_n)
        if stale:       # credit waits bound to receives the pass had not re-timed yet
            est.flips += len(stale)
            est.error_bound_ns += float(sum(abs(ends[r] - self.end[r]) + qn[s]
                                            for s, r in stale))
            est.hot = [("IPCQ credits", len(stale)), *est.hot]
        if est.flips or est.new_overlaps:   # where the order moves, so may the waits kept
            est.error_bound_ns += self.unexplained_ns       # as recorded: up to their length
        return est

    def _prepare_order(self) -> None:
        """Consecutive users of each exclusive resource in recorded service order."""
        idx, key = self._exclusive()
        s_old = self.S[idx]
        e_old = s_old + self.h["busy_ns"][idx]
        o = np.lexsort((s_old, key))
        same = key[o][1:] == key[o][:-1]
        a, b = o[:-1][same], o[1:][same]
        self.order = (idx, key, a, b, s_old[b] >= e_old[a] - _EPS)

    def _makespan(self, ends: np.ndarray, launch_done: Any) -> float:
        """The later of the last launch's completion at the host and the last op's end (host
        copies after it); a run without recorded launches keeps its recorded tail."""
        if not self.n_ops:
            return self.base.makespan_ns
        last_end = float(np.nanmax(ends))
        if not self.launch_order:
            return last_end + self.base.makespan_ns - float(self.end.max())
        lastl = self.launch_order[-1]
        rec_end = max(self.rec[lastl][2], float(self.end.max()))
        return max(launch_done(lastl), last_end) + max(0.0, self.base.makespan_ns - rec_end)

    def _order_check(self, est: Estimate, a_all: np.ndarray, qn: np.ndarray,
                     busy_n: np.ndarray) -> None:
        """Count exclusive-resource users whose new order or overlap differs from the
        recording (the places the recorded service order could flip)."""
        idx, key, a, b, was_free = self.order
        if not len(a):
            return
        s_new = a_all[idx] + self.off[idx] + qn[idx]
        e_new = s_new + busy_n[idx]
        flip = s_new[b] < s_new[a] - _EPS
        over = was_free & (s_new[b] < e_new[a] - _EPS)
        est.flips = int(flip.sum())
        est.new_overlaps = int(over.sum())
        bad = over | flip
        est.error_bound_ns = float(np.sum(np.maximum(0.0, e_new[a] - s_new[b])[bad]))
        if bad.any():
            topo = self.base.topology
            ns, ls = topo.nodes, topo.links
            ks, counts = np.unique(key[b][bad], return_counts=True)
            top = sorted(zip(counts.tolist(), ks.tolist(), strict=True), reverse=True)[:5]
            est.hot = [(f"{ns[ls[k].src].id}->{ns[ls[k].dst].id}" if k >= 0 else ns[-1 - k].id,
                        c) for c, k in top]

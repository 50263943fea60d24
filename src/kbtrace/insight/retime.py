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
            "op_id", "kind", "name", "out_shape", "deps", "match_op_id"])
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
        self.pred, chained = self._chain(hot)
        events = np.union1d(queued, chained)
        self.prev = self._prev_rows(ot_c)
        self.launch_of = ot_c["launch"].tolist()
        self._prepare_launch()
        self.pricer = Pricer(self.h, self.seg_op, self.cq, self.op_ids, base.topology,
                             self._ops_math)
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
        self.host_end = host_end
        self.launch_order = sorted(self.launch_pes)
        self.rec = {ln: (float(self.launches[ln].get("t_launch_ns", 0.0)),
                         float(self.launches[ln].get("t_barrier_ns", 0.0)),
                         float(self.launches[ln].get("t_done_ns", 0.0)))
                    for ln in self.launch_order}
        self.done_at = {round(v[2], 6): ln for ln, v in self.rec.items()}
        self.down_o, self.up_o = self._launch_paths(self.base.topology)

    def _launch_paths(self, topo: Any) -> tuple[dict[int, float], dict[tuple[int, ...], float]]:
        """(per launch: fan-out latency host -> IO_CPU -> M_CPU -> PE_CPU, max over its PEs;
        per (launch, PE): the completion's way back), as replay's ``_launch_ns`` computes
        them: propagation plus the overheads of every node but the source."""
        from kbtrace.topology.model import PeCoord

        def cmd(a: Any, b: Any) -> float:
            r = topo.route(a, b)
            return r.overhead_ns + r.wire_ns
        host = topo.host
        down: dict[int, float] = {}
        up: dict[tuple[int, ...], float] = {}
        for ln, pes in self.launch_pes.items():
            d = 0.0
            for s, c, p in pes:
                io, m = topo.io_cpu(s), topo.m_cpu(s, c)
                cpu = topo.pe_node(PeCoord(s, c, p), "pe_cpu")
                d = max(d, cmd(host, io) + cmd(io, m) + cmd(m, cpu))
                up[(ln, s, c, p)] = cmd(cpu, m) + cmd(m, io) + cmd(io, host)
            down[ln] = d
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
        seg_op, first, last, issue, end = L["seg_op"], L["first"], L["last"], L["issue"], L["end"]
        A, cqp, off, S, cq, crit, q = L["A"], L["cqp"], L["off"], L["S"], L["cq"], L["crit"], L["q"]
        nohop = L["nohop"]
        busy_l, serv_l, tot_l = busy_n.tolist(), serv_n.tolist(), tot.tolist()
        n = len(seg_op)
        cqn, qn = list(cq), list(q)
        send: list[float | None] = [None] * n
        dq = [0.0] * self.n_ops
        nan = float("nan")
        issue_n = [nan] * self.n_ops            # NaN until the op's issue is re-timed
        end_fix: dict[int, float] = {}
        late = 0
        binder, pred, deps, prev = self.binder, self.pred, self.deps, self.prev
        A_np = self.A
        try:
            down_n, up_n = self._launch_paths(new)
        except Exception:            # noqa: BLE001 - no launch path: keep the recorded one
            down_n, up_n = self.down_o, self.up_o
        launch_of, rec, order = self.launch_of, self.rec, self.launch_order
        by_launch: dict[int, list[tuple[tuple[int, ...], int]]] = {}
        for k, r in self.last_ops.items():
            by_launch.setdefault(k[0], []).append((k, r))
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

        def warp(o: int, t: float) -> float:
            if t >= end[o] - _EPS:
                return end_new(o) + (t - end[o])
            i = issue_n[o]
            f, la = first[o], last[o]
            if f == la or t <= issue[o] + _EPS:
                return (t if i != i else i) + (t - issue[o])
            k = max(f, f + int(np.searchsorted(A_np[f:la], t, side="right")) - 1)
            c = crit[k]
            frac = min(t - A[k], c) / c if c > _EPS else 0.0
            return a_new(k) + frac * (serv_l[k] + cqn[k])

        def svc_end(j: int) -> float:
            v = send[j]
            return v if v is not None else a_new(j) + off[j] + qn[j] + busy_l[j]

        for kind, x in self.events:
            if kind == 0:                       # op issue
                t = issue[x]
                best = latest = None
                p = prev[x]
                if p >= 0:
                    if t >= end[p] - _EPS:
                        best, latest = end_new(p), end[p]
                    else:                       # the predecessor let the program go on
                        best, latest = warp(p, t), t
                for r in deps[x]:
                    if end[r] <= t + _EPS:
                        e = end_new(r)
                        if best is None or e > best:
                            best = e
                        if latest is None or end[r] > latest:
                            latest = end[r]
                ln = launch_of[x]
                if p < 0 and ln in rec:         # a program's first op: the start barrier
                    b = launch_barrier(ln) + (t - rec[ln][1])
                    best = b if best is None else max(best, b)
                    latest = t if latest is None else max(latest, t)
                elif ln not in rec:             # the host program waits for launches
                    d = self.done_at.get(round(t, 6))
                    if d is not None:
                        e = launch_done(d)
                        best = e if best is None else max(best, e)
                        latest = t if latest is None else max(latest, t)
                issue_n[x] = t if best is None else best + max(0.0, t - latest)
                if nohop[x]:                    # fill / wait: an end bound to a dep's end
                    e = end[x]
                    fix = issue_n[x] + e - t
                    if e > t + _EPS:
                        for r in deps[x]:
                            if abs(end[r] - e) <= _EPS:
                                fix = max(issue_n[x], end_new(r))
                    end_fix[x] = fix
                continue
            s = x                               # a waiting segment / a contended user
            o = seg_op[s]
            arr = a_new(s) + off[s]
            t_b = None
            b = binder.get(s)
            if b is not None:
                bk, j = b
                t_b = (svc_end(j) if bk == 0 else warp(seg_op[j], S[s]) if bk == 1
                       else end_new(j))
            elif q[s] > _EPS:                   # a wait of unknown cause: at least as long
                t_b = arr + q[s]
            p = pred.get(s)
            if p is not None:                   # the previous user, in recorded order
                e = svc_end(p)
                t_b = e if t_b is None or e > t_b else t_b
            w = 0.0 if t_b is None else max(0.0, t_b - arr)
            qn[s] = w
            # a wait adds to the op's latency only on a segment of its critical path
            c = max(0.0, cq[s] + w - q[s]) if crit[s] > _EPS else 0.0
            dq[o] += c - cq[s]
            cqn[s] = c
            send[s] = arr + w + busy_l[s]
        issue_a = np.array(issue_n)
        ends = issue_a + np.where(self.has, tot + np.array(dq), self.end - self.issue)
        for o, v in end_fix.items():
            ends[o] = v
        mk = self._makespan(ends, launch_done)
        est = Estimate(mk)
        est.late = late
        est.ends, est.issues = ends, issue_a
        cqn_a, qn_a = np.array(cqn), np.array(qn)
        d = cqn_a - self.cq
        dc = np.cumsum(d) - d
        a_all = issue_a[self.seg_op] + Pn_a + self.cqp + dc - dc[self.fs]
        self._order_check(est, a_all, qn_a, busy_n)
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

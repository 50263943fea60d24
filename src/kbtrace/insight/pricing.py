"""Pricing for the re-timing (``retime``): each recorded hop's service part and busy time
on a new compiled topology, from the recorded ones.

Rates scale what they serve (HBM pseudo-channels x efficiency, GEMM clock, fetch/store
and IPCQ tiers); node overheads and link propagation add their differences; a MATH op is
``max(overhead, compute / clock)`` with its compute from its shape (``replay.stations``).
Link hops: a transfer (a run of link rows of one op and tile) that crossed its path
unqueued is re-priced with fast mode's free-path closed form (``_free_path``, the
arithmetic of ``replay.fabric.routes.walk``), so a slower link moves the transfer's
bottleneck as the replay would; queued transfers scale their serialisation by the rate
ratio. Everything that does not depend on the new topology is prepared once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kbtrace.insight.resources import get_param

__all__ = ["Pricer"]

_EPS = 1e-6


def _ratio(old: np.ndarray | float, new: np.ndarray | float) -> Any:
    """Service-time factor of a rate going from ``old`` to ``new`` (no rate: 1)."""
    old, new = np.asarray(old, float), np.asarray(new, float)
    ok = (old > 0) & (new > 0)
    return np.where(ok, old / np.where(ok, new, 1.0), 1.0)


def topo_cols(topo: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node overhead, link latency, link bandwidth) of a compiled topology as arrays: the
    per-topology constants ``Topology.route`` sums (kept as lists when it is compiled), or
    read from its node and link objects. Memoised for the last few topologies."""
    hit = _COLS.get(id(topo))
    if hit is not None and hit[0] is topo:
        return hit[1]
    c = getattr(topo, "_rt_consts", None)
    if c is not None:
        cols = (np.array(c[0], float), np.array(c[1], float), np.array(c[2], float))
    else:
        ns, ls = topo.nodes, topo.links
        cols = (np.fromiter((n.overhead_ns for n in ns), float, len(ns)),
                np.fromiter((ln.latency_ns for ln in ls), float, len(ls)),
                np.fromiter((ln.bw_gbps for ln in ls), float, len(ls)))
    if len(_COLS) >= 8:
        _COLS.clear()
    _COLS[id(topo)] = (topo, cols)
    return cols


_COLS: dict[int, tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}


class Pricer:
    """The hops of a recorded run, prepared for pricing on other topologies."""

    @staticmethod
    def _node_ovh(topo: Any) -> np.ndarray:
        return topo_cols(topo)[0]

    @staticmethod
    def _link_cols(topo: Any) -> tuple[np.ndarray, np.ndarray]:
        _ov, lat, bw = topo_cols(topo)
        return bw, lat

    def __init__(self, h: dict[str, np.ndarray], seg_op: np.ndarray, cq: np.ndarray,
                 op_ids: np.ndarray, topo: Any, ops_math: tuple[Any, ...],
                 credit_leg: np.ndarray | None = None) -> None:
        self.h, self.seg_op, self.cq, self.op_ids, self.topo = h, seg_op, cq, op_ids, topo
        #: link rows of a receive's credit return (their size is ``pe.ipcq.credit_bytes``)
        self.credit_leg = (credit_leg if credit_leg is not None
                           else np.zeros(len(seg_op), dtype=bool))
        self.n_ops = len(op_ids)
        self._ops_math = ops_math
        h, old = self.h, self.topo
        stage = h["stage"]
        self.is_link = h["link_idx"] >= 0
        self.li = h["link_idx"][self.is_link]
        nodal = ~self.is_link
        self.masks = {st: np.flatnonzero(nodal & (stage == st))
                      for st in ("hbm", "gemm", "fetch", "store", "ipcq", "math")}
        self.masks["dispatch"] = np.flatnonzero(nodal & np.isin(stage, ("pe_cpu", "scheduler")))
        self.serv = h["crit_ns"] - self.cq
        self.masks["head"] = np.flatnonzero(nodal & (stage == "fabric") & (self.serv > 0))
        self.ovh_o = self._node_ovh(old)[h["node_idx"]]
        ls = old.links                      # the graph is the same on every new topology
        self.link_src = np.fromiter((ln.src for ln in ls), np.int64, len(ls))
        self._fp_static: dict[tuple[int, int, int], tuple[Any, ...]] = {}
        self.math_cyc = self._math_cycles()
        self._prepare_transfers()
        bw, lat = self._link_cols(old)
        self.bw_o, self.lat_o = bw[self.li], lat[self.li]

    def _prepare_transfers(self) -> None:
        """Link rows grouped into transfers (runs of link rows of one op and tile, in hop
        order); the transfers that crossed their path unqueued, with the tail times and
        critical advances fast mode's closed form gives (``_free_path``), are re-priced by
        that closed form on the new topology (``xfer``), the others by rate ratios."""
        h = self.h
        o = np.lexsort((h["hop"], h["tile"], self.seg_op))
        lk = self.is_link[o]
        so, tl = self.seg_op[o], h["tile"][o]
        cont = np.r_[False, (so[1:] == so[:-1]) & (tl[1:] == tl[:-1]) & lk[1:] & lk[:-1]]
        rows = o[lk]
        start = ~cont[lk]
        first = np.flatnonzero(start)
        tid = np.cumsum(start) - 1
        self.xfer = None
        self.setup_priced = np.zeros(self.n_ops, dtype=bool)
        if not len(rows):
            return
        pos = np.arange(len(rows)) - first[tid]
        geo = (rows, start, tid, pos, first)
        c_old, b_old, multi = self._free_path(self.topo, geo)
        enter, leave = h["t_enter_ns"][rows], h["t_leave_ns"][rows]
        crit = h["crit_ns"][rows]
        tol = 1e-6 * np.maximum(1.0, np.abs(leave))
        # the tail's lag behind the head at the start (a read's last flit ready later),
        # found from the first row where its tail left after the free-path head bound
        lag = (leave - enter[first][tid] - c_old)[first]
        late = (leave - enter[first][tid] - b_old)[first] > tol[first]
        tau = np.where(late & multi[first], lag, -np.inf)
        # what put the head start where it was: an HBM read's data leg starts with its
        # first burst and its tail is ready with the last, at the HBM row's end (the front)
        fr = rows[first]
        prev = np.where(fr > 0, fr - 1, 0)
        after_hbm = (self.seg_op[prev] == self.seg_op[fr]) & (h["stage"][prev] == "hbm") & (fr > 0)
        head_gap = (h["t_leave_ns"][prev] - enter[first])
        tau = np.where(after_hbm & multi[first], np.maximum(tau, head_gap), tau)
        rel = np.maximum(tau[tid] + c_old, b_old)
        ok = (np.abs(leave - (enter[first][tid] + rel)) <= tol) & (h["queue_ns"][rows] <= _EPS)
        adv = leave - np.r_[0.0, leave[:-1]]
        ok &= np.where(start, crit > tol, np.abs(crit - adv) <= tol)
        good = np.bincount(tid, weights=~ok, minlength=len(first)) == 0
        keep = good[tid]
        if not keep.any():
            return
        sel = np.flatnonzero(keep)
        _u, tid2 = np.unique(tid[sel], return_inverse=True)
        st2 = start[sel]
        geo2 = (rows[sel], st2, tid2, pos[sel], np.flatnonzero(st2))
        # the first row's tail advanced the op's front by crit: the front stood at
        # ``crit - rel`` before the head start (the DMA set-up, or a read's data tail)
        off = (crit - rel)[first]
        dma = self.topo.params.pe.dma.overhead_ns
        how = np.where(after_hbm, 1, np.where(np.abs(off - dma) <= 1e-6, 2, 0))[tid]
        self.xfer = (geo2, tau[tid[sel]], off[tid][sel], how[sel])
        self.setup_priced[self.seg_op[rows[sel][(how[sel] == 2) & st2]]] = True

    @staticmethod
    def _advance(f: np.ndarray, start: np.ndarray) -> np.ndarray:
        """Per row, how far ``f`` advances past the previous row's (the first row: past 0)."""
        return f - np.where(start, 0.0, np.r_[0.0, f[:-1]])

    def _free_path(self, topo: Any, geo: tuple[np.ndarray, ...]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fast mode's free-path closed form (``replay.fabric.routes.walk`` with every
        resource free), per link row, relative to the transfer's head start ``h``: the tail
        leaves at ``max(t + C_j, h + B_j)`` (``t``: the tail ready). Head ``Hs_j`` = the
        sums of overheads (a link's source node's, but not the route's first), head-flit
        times and propagations before it; ``B_j = C_j + max_{i<=j}(Hs_i + body_i -
        C_{i-1})`` with ``C_j`` the sum of last-flit times and propagations up to ``j``.
        Returns ``(C, B, multi-flit)``."""
        rows, start, tid, pos, first = geo
        fb = int(topo.params.cube.hbm.burst_bytes)
        credit = int(topo.params.pe.ipcq.credit_bytes)
        key = (id(rows), fb, credit)
        st = self._fp_static.get(key)
        if st is None or st[0] is not rows:        # what does not depend on the rates
            li = self.h["link_idx"][rows]
            nb = np.where(self.credit_leg[rows], credit,
                          self.h["nbytes"][rows]).astype(np.int64)
            nfl = np.maximum(1, -(-nb // fb))
            last = np.where(nb > 0, nb - (nfl - 1) * fb, 0)
            ats = [np.flatnonzero(pos == k) for k in range(1, int(pos.max()) + 1 if len(pos)
                                                           else 0)]
            st = self._fp_static[key] = (rows, li, self.link_src[li], nb, nfl, last,
                                         np.where(nfl > 1, fb, last), ats)
        _r, li, src, nb, nfl, last, head, ats = st
        node_ov, lat, bw_all = topo_cols(topo)
        bw, prop = bw_all[li], lat[li]
        ov = np.where(start, 0.0, node_ov[src])
        on = (bw > 0) & (nb > 0)
        bws = np.where(on, bw, 1.0)
        hd = np.where(on, head / bws, 0.0)
        multi = on & (nfl > 1)
        body = np.where(multi, (nb - last) / bws, 0.0)
        lastd = np.where(multi, last / bws, hd)          # one flit: its head is its tail
        step = ov + hd + prop
        cs = np.cumsum(step)
        hs = cs - step + ov                                # global prefix
        hs -= (cs - step)[first][tid]                      # ... made per transfer
        cl = np.cumsum(lastd + prop)
        c = cl - (cl - lastd - prop)[first][tid]
        x = hs + body - (c - lastd - prop)
        m = x.copy()
        for at in ats:                  # the running max within each transfer
            m[at] = np.maximum(m[at], m[at - 1])
        return c, c + m, multi

    def _math_cycles(self) -> np.ndarray:
        """Per MATH row: its compute cycles, ``ceil(elems / lanes) * cycles per element`` as
        replay's ``Compute.serve`` prices them, where that reproduces the recorded busy
        (``max(overhead, cycles / clock)``); NaN elsewhere (priced from the recorded busy)."""
        m = self.masks["math"]
        out = np.full(len(m), np.nan)
        if not len(m):
            return out
        from kbtrace.replay.ops import TRANSCENDENTAL

        by_id, names, shapes = self._ops_math
        mp = self.topo.params.pe.math
        ids = self.op_ids[self.seg_op[m]].tolist()
        for i, oid in enumerate(ids):
            r = by_id.get(oid)
            if r is None:
                continue
            shape = shapes[r].as_py() or [1]
            elems = int(np.prod(shape)) if shape else 1
            cpe = mp.transcendental_cycles if names[r] in TRANSCENDENTAL else 1
            out[i] = -(-elems // mp.simd_lanes) * cpe
        ok = np.abs(np.maximum(mp.overhead_ns, out / mp.clock_ghz) - self.h["busy_ns"][m]) <= 1e-6
        out[~ok] = np.nan
        return out

    def service(self, new: Any) -> tuple[np.ndarray, np.ndarray]:
        """(new service part, new busy) per hop, from the recorded ones. What the change
        leaves alone (links, node overheads, a stage's rate) is not re-priced."""
        h, old = self.h, self.topo
        po, pn = old.params, new.params
        busy = h["busy_ns"]
        serv = self.serv
        ovh_o = self.ovh_o
        ov_o, lat_o_all, bw_o_all = topo_cols(old)
        ov_n, lat_n, bw_n = topo_cols(new)
        nodes_same = np.array_equal(ov_o, ov_n)
        links_same = np.array_equal(lat_o_all, lat_n) and np.array_equal(bw_o_all, bw_n)
        d_ovh = np.zeros(len(serv)) if nodes_same else ov_n[h["node_idx"]] - ovh_o
        serv_n, busy_n = serv.copy(), busy.copy()
        is_link = self.is_link
        lat_d = None
        if len(self.li) and not (links_same and nodes_same):
            lat_d = np.zeros(len(serv))
            bw_r = _ratio(self.bw_o, bw_n[self.li])
            lat_o = self.lat_o
            lat_d[is_link] = lat_n[self.li] - lat_o
            s = serv[is_link]
            extra = np.maximum(s - lat_o - ovh_o[is_link], 0.0)
            serv_n[is_link] = s + lat_d[is_link] + d_ovh[is_link] + extra * (bw_r - 1.0)
            busy_n[is_link] = busy[is_link] * bw_r
            lat_d[is_link] += d_ovh[is_link]
        kind = po.pe.ipcq.buffer_kind
        rate = {  # node-only stages whose service scales with one rate
            "hbm": _ratio(po.cube.hbm.pc_bw_gbps * po.cube.hbm.efficiency,
                          pn.cube.hbm.pc_bw_gbps * pn.cube.hbm.efficiency),
            "gemm": _ratio(po.pe.gemm.clock_ghz, pn.pe.gemm.clock_ghz),
            "fetch": _ratio(po.pe.fetch_store.bw_gbps, pn.pe.fetch_store.bw_gbps),
            "store": _ratio(po.pe.fetch_store.bw_gbps, pn.pe.fetch_store.bw_gbps),
            "ipcq": _ratio(get_param(po, f"pe.ipcq.{kind}.bw_gbps"),
                           get_param(pn, f"pe.ipcq.{kind}.bw_gbps")),
        }
        for st, r in rate.items():
            m = self.masks[st]
            if len(m) and (r != 1.0 or (not nodes_same and d_ovh[m].any())):
                s = serv[m]
                serv_n[m] = s + d_ovh[m] + np.maximum(s - ovh_o[m], 0.0) * (r - 1.0)
                busy_n[m] = busy[m] * r
        hb = rate["hbm"]
        d_dma = pn.pe.dma.overhead_ns - po.pe.dma.overhead_ns
        if self.xfer is not None and (lat_d is not None or hb != 1.0 or d_dma
                                      or po.cube.hbm.burst_bytes != pn.cube.hbm.burst_bytes
                                      or po.pe.ipcq.credit_bytes != pn.pe.ipcq.credit_bytes):
            geo, tau, off, how = self.xfer    # unqueued transfers: fast mode's closed form;
            li0 = self.h["link_idx"][geo[0][geo[4]]][geo[2]]    # a tail that lagged on the
            r0 = _ratio(bw_o_all[li0], bw_n[li0])               # first link (shared) scales
            tau = np.where(how == 1, tau * hb, tau * r0)  # with it; a read's head start and
            #                                               tail lag
            off = np.where(how == 1, off * hb, np.where(  # scale with the HBM, a DMA's
                how == 2, off + d_dma, off))              # set-up moves the start
            c_n, b_n, _m = self._free_path(new, geo)
            rows, start = geo[0], geo[1]   # the op's front: max(its old place, new tails)
            f = np.maximum(0.0, off + np.maximum(tau + c_n, b_n))
            serv_n[rows] = self._advance(f, start)
        if not nodes_same:
            m = self.masks["dispatch"]
            serv_n[m] = serv[m] + d_ovh[m]
            busy_n[m] = busy[m] + d_ovh[m]
        m = self.masks["math"]
        pm_o, pm_n = po.pe.math, pn.pe.math
        if len(m) and (pm_o.clock_ghz, pm_o.overhead_ns) != (pm_n.clock_ghz, pm_n.overhead_ns):
            r = _ratio(pm_o.clock_ghz, pm_n.clock_ghz)   # max(overhead, compute / clock):
            cyc = self.math_cyc                          # compute from the op's shape where
            comp = np.where(np.isnan(cyc), busy[m] * r,  # it matches the record, else the
                            cyc / pm_n.clock_ghz)        # recorded busy
            new_b = np.maximum(pm_n.overhead_ns, comp)
            serv_n[m] = serv[m] - busy[m] + new_b
            busy_n[m] = new_b
        # the request head of a DMA (a node-only fabric hop): set-up, plus the overheads
        # and latencies of the op's link hops (the path back is the path there)
        m = self.masks["head"]
        if len(m) and (lat_d is not None or d_dma):
            add = (d_dma * ~self.setup_priced[self.seg_op[m]]   # (unless a transfer's head
                   if d_dma else 0.0)                            # start priced the set-up)
            if lat_d is not None:
                add = add + np.bincount(self.seg_op, weights=lat_d,
                                        minlength=self.n_ops)[self.seg_op[m]]
            serv_n[m] = serv[m] + add
        return serv_n, busy_n

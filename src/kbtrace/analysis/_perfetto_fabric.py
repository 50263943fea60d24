"""The timeline's fabric slices encoded as columns (``perfetto._stream``; issue 22, target 2).

Up to ``perfetto.MAX_FABRIC_SLICES`` link hops and HBM accesses, each an ``X`` event on its
link's or controller's track. Building a dict per slice and encoding it with ``json`` was
~2 CPU s of the report at a million ops; here the rows come from DuckDB as Arrow batches, the
tracks' names are made once per distinct (node, destination, link kind), each slice is placed
on its track by ``_Tracks.place`` in row order (as before: pids and tids are the same), and
the events' text is joined from columns by ``_perfetto_ops`` (byte for byte the json
encoder's). The counters' steps are added a track at a time, in the same amounts (their
order within a counter never mattered: ``_Steps.levels`` sorts them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace.analysis._perfetto_flows import Chains
from kbtrace.analysis._perfetto_ops import Encoded, _codes, _ints, _joined, json_floats, us_strings

__all__ = ["fabric_slices"]


def _labels(slot: Any, op_id: np.ndarray) -> pa.Array:
    """``slot.label`` of each op, as JSON string literals."""
    inside = (op_id >= 0) & (op_id < len(slot.has))
    inside[inside] = slot.has[op_id[inside]]
    li = np.full(len(op_id), -1, np.int64)
    li[inside] = slot.pt[op_id[inside], 2]
    uniq, inv = np.unique(li, return_inverse=True)
    text = [json.dumps(slot.labels[k]) if k >= 0 else "" for k in uniq.tolist()]
    out = pa.array(text, pa.string()).take(pa.array(inv.reshape(-1)))
    if not inside.all():        # ops without a slice: "op <id>"
        miss = np.flatnonzero(~inside)
        names = pa.array([json.dumps(f"op {o}") for o in op_id[miss].tolist()], pa.string())
        out = pc.replace_with_mask(out, pa.array(~inside), names)
    return out


def fabric_slices(batches: Iterator[pa.RecordBatch], tracks: Any, slot: Any,
                  split: Callable[[str], tuple[str, str]], steps: Any,
                  chains: Chains, link_track: dict[int, tuple[str, str]]) -> Iterator[Encoded | int]:
    """One ``Encoded`` per batch of fabric rows (op_id, tile, hop, link_idx, t_enter_ns,
    t_leave_ns, nbytes, queue_ns, busy_ns, node, dst_id, link_kind; in slice order); fills
    ``steps``, ``chains`` and ``link_track`` as it goes; yields the number of rows last."""
    n_rows = 0
    for b in batches:
        n = b.num_rows
        if not n:
            continue
        n_rows += n
        c = {name: b.column(i) for i, name in enumerate(b.schema.names)}
        op_id = c["op_id"].to_numpy().astype(np.int64)
        link = c["link_idx"].to_numpy().astype(np.int64)
        t0, t1 = c["t_enter_ns"].to_numpy(), c["t_leave_ns"].to_numpy()
        q, busy = c["queue_ns"].to_numpy(), c["busy_ns"].to_numpy()
        nb = c["nbytes"].to_numpy().astype(np.int64)
        s = np.rint(t0).astype(np.int64)            # round(): half to even, as Python's
        e = np.maximum(s, np.rint(t1).astype(np.int64))
        # each distinct (node, destination, link kind, is a link): its process and track
        node_i, nodes = _codes(c["node"])
        dst_i, dsts = _codes(c["dst_id"])
        kind_i, kinds = _codes(c["link_kind"])
        is_link = link >= 0
        combo = np.stack([node_i, np.where(is_link, dst_i, -1),
                          np.where(is_link, kind_i, -1), is_link.astype(np.int64)], axis=1)
        uniq, inv = np.unique(combo, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        procs, names = [], []
        for ni, di, ki, lk in uniq.tolist():
            cube, src_local = split(nodes[ni])
            procs.append(f"{cube} fabric" if cube else "fabric")
            if lk:
                dst = dsts[di]
                dst_local = split(dst)[1] if split(dst)[0] == cube else dst
                names.append(f"link {src_local} -> {dst_local} ({kinds[ki]})")
            else:
                names.append(src_local)
        # placed one by one, in row order (lanes and first-seen ids as before)
        pid = np.empty(n, np.int64)
        tid = np.empty(n, np.int64)
        place = tracks.place
        for i, (k, a, z) in enumerate(zip(inv.tolist(), s.tolist(), e.tolist(), strict=True)):
            pid[i], tid[i] = place(procs[k], names[k], a, z)
        chains.add(op_id[is_link], c["tile"].to_numpy()[is_link], c["hop"].to_numpy()[is_link],
                   pid[is_link], tid[is_link], s[is_link])
        inv_link = inv[is_link]
        for li, k in zip(*np.unique(link[is_link], return_index=True), strict=True):
            link_track[int(li)] = (procs[inv_link[k]], names[inv_link[k]])
        _add_steps(steps, procs, names, inv, is_link, s, e, nb, t0, t1, q, busy)
        yield Encoded(_joined([
            '{"ph":"X","pid":', _ints(pid), ',"tid":', _ints(tid), ',"ts":"', us_strings(s),
            '","dur":"', us_strings(e - s), '","name":', _labels(slot, op_id),
            ',"cat":"fabric","args":{"op_id":', _ints(op_id), ',"tile":',
            _ints(c["tile"].to_numpy()), ',"nbytes":', _ints(nb), ',"queue_ns":',
            json_floats(q), "}}"]), n)
    yield n_rows


def _add_steps(steps: Any, procs: list[str], names: list[str], inv: np.ndarray,
               is_link: np.ndarray, s: np.ndarray, e: np.ndarray, nb: np.ndarray,
               t0: np.ndarray, t1: np.ndarray, q: np.ndarray, busy: np.ndarray) -> None:
    """The counters' steps of a batch: bytes in flight on each link's track and its cube's
    "links"; an HBM controller's accesses waiting for a pseudo-channel and in service."""
    qe = np.minimum(np.maximum(np.rint(t0 + q).astype(np.int64), s), e)
    serve = np.maximum(qe, np.rint(t1 - busy).astype(np.int64))
    one = np.ones(len(s), np.int64)
    # each track's rows (in row order): a stable sort by track, not a mask per track (a
    # batch of 65,536 rows crosses thousands of links)
    order = np.argsort(inv, kind="stable")
    by = inv[order]
    cuts = np.flatnonzero(np.r_[True, by[1:] != by[:-1]]).tolist() + [len(by)]
    for a0, a1 in pairwise(cuts):
        at = order[a0:a1]
        k = int(by[a0])
        lk = is_link[at]
        if lk.all():
            a, z, d = s[at], e[at], nb[at]
            steps.add_many((procs[k], names[k], "bytes in flight"), a, d, z, -d)
            steps.add_many((procs[k], "links", "bytes in flight"), a, d, z, -d)
        else:
            a, w, v, z = s[at], qe[at], serve[at], e[at]
            steps.add_many((procs[k], names[k], "waiting"), a, one[at], w, -one[at])
            steps.add_many((procs[k], names[k], "in service"), v, one[at], z, -one[at])

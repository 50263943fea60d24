"""Where two runs of the same trace part (e.g. ``fast`` against the ``flit`` reference): the
ops over an error threshold per program position, and how long each op's head took on each
link in both runs (``benchmarks/bench_diverge.py`` prints them).

``compare.compare_runs`` says how far apart two runs are; these say where: ``over_by_seq``
counts the ops whose latency error is over a threshold per (seq, kind), so a phase of the
workload that parts shows as a run of program positions; ``head_delays`` compares, link by
link, the time an op's head took from reaching the link's source node to reaching the next
node (the node's overhead, the queue and the head flit's crossing), over a chosen set of ops,
with the links named without their SIP and cube (``sip0.cube3.r0c0`` -> ``r0c0``) so the
same link of every cube is one row; ``first_divergence`` gives an op's first hop whose head
arrival differs.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from kbtrace.replay.compare import latency_errors
from kbtrace.replay.options import Run

__all__ = ["LinkDelay", "op_errors", "over_by_seq", "head_delays", "first_divergence",
           "link_class"]

_PLACE = re.compile(r"^(sip\d+\.)?(cube\d+\.)?")


def link_class(src_id: str, dst_id: str) -> str:
    """A link's name without the SIP and cube of its ends: ``r0c0->ucie_w.conn0``."""
    return f"{_PLACE.sub('', src_id)}->{_PLACE.sub('', dst_id)}"


def op_errors(a: Run, ref: Run) -> np.ndarray:
    """Per op (in ``op_id`` order) the latency (``t_end - t_issue``) relative error of ``a``
    against ``ref``; 0 where ``ref``'s latency is 0 (``compare.compare_runs`` leaves those
    out)."""
    return latency_errors(a, ref)[0]


def over_by_seq(a: Run, ref: Run, threshold: float = 0.05) -> dict[tuple[int, str], int]:
    """How many ops are over ``threshold`` per ``(seq, kind)`` (of ``ref``), in seq order."""
    err = op_errors(a, ref)
    tr = ref.op_timing()
    seq = tr["seq"].to_numpy()
    kind = np.asarray(tr["kind"].to_pylist())
    over = err > threshold
    c = Counter(zip(seq[over].tolist(), kind[over].tolist(), strict=True))
    return dict(sorted(c.items()))


@dataclass(frozen=True, slots=True)
class LinkDelay:
    """Over ``n`` crossings of the links named ``link`` (``link_class``): the mean time the
    head took from the link's source node to the next node in run ``a`` and in ``ref``
    (``a_ns``, ``ref_ns``), and the distribution of the difference ``a - ref`` per crossing
    (mean, 5th and 95th percentile)."""
    link: str
    n: int
    a_ns: float
    ref_ns: float
    diff_mean_ns: float
    diff_p5_ns: float
    diff_p95_ns: float


def _head_times(run: Run, ops: np.ndarray, min_bytes: int) -> dict[tuple[int, int], tuple]:
    """``(op, hop) -> (link, head's time to the next node)`` for the link rows of ``ops``
    carrying at least ``min_bytes``."""
    t = pq.read_table(run.run_dir / "hops.parquet",
                      columns=["op_id", "hop", "link_idx", "t_enter_ns", "nbytes"])
    op = t["op_id"].to_numpy()
    hop = t["hop"].to_numpy()
    li = t["link_idx"].to_numpy()
    en = t["t_enter_ns"].to_numpy()
    nb = t["nbytes"].to_numpy()
    o = np.lexsort((hop, op))
    op, hop, li, en, nb = op[o], hop[o], li[o], en[o], nb[o]
    nxt = np.zeros(len(op), bool)
    nxt[:-1] = (op[1:] == op[:-1]) & (hop[1:] == hop[:-1] + 1)
    keep = nxt & (li >= 0) & (nb >= min_bytes) & np.isin(op, ops)
    idx = np.flatnonzero(keep)
    d = en[idx + 1] - en[idx]
    return {(int(op[i]), int(hop[i])): (int(li[i]), float(x))
            for i, x in zip(idx.tolist(), d.tolist(), strict=True)}


def head_delays(a: Run, ref: Run, ops: list[int] | np.ndarray, min_bytes: int = 0,
                tol_ns: float = 0.05) -> list[LinkDelay]:
    """Per link class (``link_class``), the head's time from the link's source node to the
    next node in both runs, over the crossings of ``ops`` (their link rows with at least
    ``min_bytes``) that both runs made on the same hop of the same op over the same link;
    the classes whose difference is over ``tol_ns`` somewhere, largest mean difference
    first."""
    sel = np.asarray(ops, dtype=np.int64)
    ha, hr = _head_times(a, sel, min_bytes), _head_times(ref, sel, min_bytes)
    lk = pq.read_table(ref.run_dir / "links.parquet", columns=["src_id", "dst_id"])
    names = [link_class(s, d) for s, d in zip(lk["src_id"].to_pylist(),
                                              lk["dst_id"].to_pylist(), strict=True)]
    per: dict[str, list[tuple[float, float]]] = {}
    for key, (li, x) in ha.items():
        y = hr.get(key)
        if y is None or y[0] != li:
            continue
        per.setdefault(names[li], []).append((x, y[1]))
    out = []
    for name, v in per.items():
        arr = np.asarray(v)
        diff = arr[:, 0] - arr[:, 1]
        if np.abs(diff).max() <= tol_ns:
            continue
        out.append(LinkDelay(name, len(v), float(arr[:, 0].mean()), float(arr[:, 1].mean()),
                             float(diff.mean()), float(np.percentile(diff, 5)),
                             float(np.percentile(diff, 95))))
    out.sort(key=lambda x: (-abs(x.diff_mean_ns), x.link))
    return out


def first_divergence(a: Run, ref: Run, op_id: int,
                     tol_ns: float = 0.05) -> tuple[int, str, str, float, float] | None:
    """Op ``op_id``'s first hop (in hop order) whose head arrival (``t_enter``) or, failing
    that, tail (``t_leave``; link rows only: an engine's row spans the op) differs by more than ``tol_ns`` between the runs: ``(hop, where,
    "head" or "tail", a's time, ref's time)`` (``where``: the link's class, or the node's id
    for a row without a link); None if no hop does."""
    rows = []
    for run in (a, ref):
        t = pq.read_table(run.run_dir / "hops.parquet",
                          columns=["op_id", "hop", "node_idx", "link_idx", "t_enter_ns",
                                   "t_leave_ns"],
                          filters=[("op_id", "=", op_id)])
        o = np.argsort(t["hop"].to_numpy(), kind="stable")
        rows.append([(int(t["hop"][i].as_py()), int(t["node_idx"][i].as_py()),
                      int(t["link_idx"][i].as_py()), float(t["t_enter_ns"][i].as_py()),
                      float(t["t_leave_ns"][i].as_py())) for i in o.tolist()])
    lk = pq.read_table(ref.run_dir / "links.parquet", columns=["src_id", "dst_id"])
    nodes = pq.read_table(ref.run_dir / "nodes.parquet", columns=["node_id"])["node_id"]
    for k in (3, 4):
        for x, y in zip(rows[0], rows[1], strict=False):
            if abs(x[k] - y[k]) > tol_ns and (k == 3 or x[2] >= 0):
                where = (link_class(lk["src_id"][x[2]].as_py(), lk["dst_id"][x[2]].as_py())
                         if x[2] >= 0 else str(nodes[x[1]].as_py()))
                return x[0], where, "head" if k == 3 else "tail", x[k], y[k]
    return None

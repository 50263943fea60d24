"""Compare two runs of the same trace (e.g. ``fast`` against the ``flit`` reference)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from kbtrace.replay.options import Run

__all__ = ["MATCH_GROUPS", "Agreement", "compare_runs", "latency_errors", "matched_op_errors"]


@dataclass(frozen=True, slots=True)
class Agreement:
    """``makespan_err``: |a - ref| / ref of the makespans (0 when both are 0);
    ``median_op_err`` / ``p90_op_err`` / ``p95_op_err`` / ``max_op_err``: of per-op latency
    (``t_end - t_issue``) relative errors; ``speedup``: ref wall / a wall."""
    makespan_err: float
    median_op_err: float
    p90_op_err: float
    speedup: float
    ops: int
    p95_op_err: float = 0.0
    max_op_err: float = 0.0


def latency_errors(a: Run, ref: Run) -> tuple[np.ndarray, np.ndarray]:
    """Per op (in ``op_id`` order) the latency (``t_end - t_issue``) relative error of ``a``
    against ``ref``, 0 where ``ref``'s latency is 0; and the mask of the ops whose ``ref``
    latency is over 0 (the ones ``compare_runs`` counts)."""
    ta, tr = a.op_timing(), ref.op_timing()
    la = ta["t_end_ns"].to_numpy() - ta["t_issue_ns"].to_numpy()
    lr = tr["t_end_ns"].to_numpy() - tr["t_issue_ns"].to_numpy()
    keep = lr > 0
    err = np.zeros(len(lr))
    err[keep] = np.abs(la[keep] - lr[keep]) / lr[keep]
    return err, keep


def compare_runs(a: Run, ref: Run) -> Agreement:
    every, keep = latency_errors(a, ref)
    err = every[keep]
    diff = abs(a.makespan_ns - ref.makespan_ns)
    q = (lambda p: float(np.percentile(err, p))) if err.size else (lambda p: 0.0)
    return Agreement(
        makespan_err=diff / ref.makespan_ns if ref.makespan_ns else (0.0 if not diff else
                                                                     float("inf")),
        median_op_err=q(50), p90_op_err=q(90),
        speedup=ref.wall_s / a.wall_s if a.wall_s > 0 else float("inf"),
        ops=int(keep.sum()), p95_op_err=q(95), max_op_err=q(100))


#: the groups of interchangeable ops ``matched_op_errors`` matches within (each also split by
#: the op's bytes): ``"program"``, one program's (PE's) ops of one kind and name in one
#: launch; ``"kind"``, every program's ops of one kind and name in one launch
MATCH_GROUPS = {"program": ("launch", "program", "kind", "name"),
                "kind": ("launch", "kind", "name")}


def _op_bytes(run: Run, n: int) -> np.ndarray:
    """Each op's bytes: the most any of its hops carried (0 for an op without hops)."""
    h = pq.read_table(run.run_dir / "hops.parquet", columns=["op_id", "nbytes"])
    out = np.zeros(n, np.int64)
    np.maximum.at(out, h["op_id"].to_numpy(), h["nbytes"].to_numpy())
    return out


def matched_op_errors(a: Run, ref: Run, group: str = "program") -> np.ndarray:
    """Per-op latency (``t_end - t_issue``) relative errors of ``a`` against ``ref`` with the
    ops matched rank by rank within groups of interchangeable ops (``MATCH_GROUPS[group]``,
    and the op's bytes in ``ref``): the k-th shortest latency of a group in ``a`` against the
    k-th shortest of the same group in ``ref``. Where two equal ops swap their latencies
    (which of them met a delay: an event order among equals) the error is 0, where the strict
    per-op error of ``compare_runs`` counts both; ops whose matched ``ref`` latency is 0 are
    left out, as there. Both runs must be of the same trace (ops in ``op_id`` order)."""
    cols = MATCH_GROUPS[group]
    ta, tr = a.op_timing(), ref.op_timing()
    la = ta["t_end_ns"].to_numpy() - ta["t_issue_ns"].to_numpy()
    lr = tr["t_end_ns"].to_numpy() - tr["t_issue_ns"].to_numpy()
    keys = [np.unique(np.asarray(tr[c].to_pylist()), return_inverse=True)[1] for c in cols]
    keys.append(_op_bytes(ref, len(lr)))
    code = np.unique(np.stack(keys), axis=1, return_inverse=True)[1].ravel()
    ra = np.lexsort((la, code))             # per group, by latency (stable: op_id breaks ties)
    rr = np.lexsort((lr, code))
    ma, mr = la[ra], lr[rr]                 # group g's k-th shortest at the same position
    keep = mr > 0
    return np.abs(ma[keep] - mr[keep]) / mr[keep]

"""Compare two runs of the same trace (e.g. ``fast`` against the ``flit`` reference)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbtrace.replay.options import Run

__all__ = ["Agreement", "compare_runs"]


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


def compare_runs(a: Run, ref: Run) -> Agreement:
    ta, tr = a.op_timing(), ref.op_timing()
    la = ta["t_end_ns"].to_numpy() - ta["t_issue_ns"].to_numpy()
    lr = tr["t_end_ns"].to_numpy() - tr["t_issue_ns"].to_numpy()
    keep = lr > 0
    err = np.abs(la[keep] - lr[keep]) / lr[keep]
    diff = abs(a.makespan_ns - ref.makespan_ns)
    q = (lambda p: float(np.percentile(err, p))) if err.size else (lambda p: 0.0)
    return Agreement(
        makespan_err=diff / ref.makespan_ns if ref.makespan_ns else (0.0 if not diff else
                                                                     float("inf")),
        median_op_err=q(50), p90_op_err=q(90),
        speedup=ref.wall_s / a.wall_s if a.wall_s > 0 else float("inf"),
        ops=int(keep.sum()), p95_op_err=q(95), max_op_err=q(100))

"""Compare two runs of the same trace (e.g. ``fast`` against the ``flit`` reference)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbtrace.replay.options import Run

__all__ = ["Agreement", "compare_runs"]


@dataclass(frozen=True, slots=True)
class Agreement:
    """``makespan_err``: |a - ref| / ref of the makespans; ``median_op_err`` / ``p90_op_err``:
    of per-op latency (``t_end - t_issue``) relative errors; ``speedup``: ref wall / a wall."""
    makespan_err: float
    median_op_err: float
    p90_op_err: float
    speedup: float
    ops: int


def compare_runs(a: Run, ref: Run) -> Agreement:
    ta, tr = a.op_timing(), ref.op_timing()
    la = ta["t_end_ns"].to_numpy() - ta["t_issue_ns"].to_numpy()
    lr = tr["t_end_ns"].to_numpy() - tr["t_issue_ns"].to_numpy()
    keep = lr > 0
    err = np.abs(la[keep] - lr[keep]) / lr[keep]
    return Agreement(
        makespan_err=abs(a.makespan_ns - ref.makespan_ns) / ref.makespan_ns,
        median_op_err=float(np.median(err)) if err.size else 0.0,
        p90_op_err=float(np.percentile(err, 90)) if err.size else 0.0,
        speedup=ref.wall_s / a.wall_s if a.wall_s > 0 else float("inf"),
        ops=int(keep.sum()))

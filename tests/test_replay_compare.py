"""``replay.compare``: the strict per-op error and the order-insensitive one (ops matched rank
by rank within groups of interchangeable ops), on hand-made run directories."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kbtrace.replay.compare import compare_runs, matched_op_errors
from kbtrace.replay.options import Run

#: (launch, program, kind, bytes) of each op, in op_id order: program 0 has two 2 KiB loads
#: and one 4 KiB load, program 1 one 2 KiB load and a math op (no hops)
OPS = [(0, 0, "load", 2048), (0, 0, "load", 2048), (0, 0, "load", 4096), (0, 1, "load", 2048),
       (0, 1, "math", 0)]


def _run(d: Path, lat_ns: list[float], makespan_ns: float = 100.0) -> Run:
    d.mkdir(parents=True)
    n = len(OPS)
    pq.write_table(pa.table({
        "op_id": pa.array(range(n), pa.int64()),
        "launch": pa.array([o[0] for o in OPS], pa.int32()),
        "program": pa.array([o[1] for o in OPS], pa.int32()),
        "kind": pa.array([o[2] for o in OPS]).dictionary_encode(),
        "name": pa.array([o[2] for o in OPS]).dictionary_encode(),
        "t_issue_ns": pa.array([10.0] * n),
        "t_end_ns": pa.array([10.0 + x for x in lat_ns])}), d / "op_timing.parquet")
    hop_ops = [i for i, o in enumerate(OPS) if o[3]]
    pq.write_table(pa.table({     # two hops per transfer, the second carrying its bytes
        "op_id": pa.array([i for i in hop_ops for _ in (0, 1)], pa.int64()),
        "nbytes": pa.array([b for i in hop_ops for b in (0, OPS[i][3])], pa.int64())}),
        d / "hops.parquet")
    return Run(d, d.name, "flit", makespan_ns, n, 2 * len(hop_ops), 0, 1.0)


def test_matched_errors_forgive_a_swap_among_equal_ops_only(tmp_path: Path) -> None:
    ref = _run(tmp_path / "ref", [10.0, 20.0, 40.0, 30.0, 5.0])
    # program 0's two 2 KiB loads swap their latencies; its 4 KiB load is 10% late; program
    # 1's load takes 20.0 (its only equal in its program is itself)
    a = _run(tmp_path / "a", [20.0, 10.0, 44.0, 20.0, 5.0])
    strict = compare_runs(a, ref)
    assert strict.max_op_err == pytest.approx(1.0)           # 10 -> 20
    e = matched_op_errors(a, ref, "program")
    # groups: (p0, 2 KiB) {10, 20} vs {20, 10} -> 0, 0; (p0, 4 KiB) 40 vs 44 -> 0.1;
    # (p1, 2 KiB) 30 vs 20 -> 1/3; (p1, math) 5 vs 5 -> 0
    assert np.sort(e) == pytest.approx([0.0, 0.0, 0.0, 0.1, 1.0 / 3.0])
    # every program's 2 KiB loads as one group: {10, 20, 30} vs {20, 10, 20} sorted
    # {10, 20, 20} -> 0, 0, 1/3; the 4 KiB load alone in its group, the math op too
    e = matched_op_errors(a, ref, "kind")
    assert np.sort(e) == pytest.approx([0.0, 0.0, 0.0, 0.1, 1.0 / 3.0])


def test_matched_errors_equal_strict_where_no_op_has_an_equal(tmp_path: Path) -> None:
    ref = _run(tmp_path / "ref", [10.0, 20.0, 40.0, 30.0, 5.0])
    # program 0's 2 KiB loads keep their order (12 < 22): matching changes nothing
    a = _run(tmp_path / "a", [12.0, 22.0, 40.0, 30.0, 5.0])
    e = matched_op_errors(a, ref, "program")
    strict = compare_runs(a, ref)
    assert np.sort(e) == pytest.approx([0.0, 0.0, 0.0, 0.1, 0.2])
    assert strict.max_op_err == pytest.approx(0.2)
    assert float(np.percentile(e, 95)) == pytest.approx(strict.p95_op_err)


def test_ops_of_zero_reference_latency_are_left_out(tmp_path: Path) -> None:
    ref = _run(tmp_path / "ref", [10.0, 20.0, 40.0, 30.0, 0.0])
    a = _run(tmp_path / "a", [10.0, 20.0, 40.0, 30.0, 3.0])
    assert matched_op_errors(a, ref, "program").tolist() == [0.0, 0.0, 0.0, 0.0]
    with pytest.raises(KeyError):
        matched_op_errors(a, ref, "pe")

"""A tiny hand-made run (1 SIP, 1 cube, 2 PEs, 9 ops) with known timing.

Used by the SQL golden tests and the docs: every number in it was chosen so the
expected view rows can be worked out by hand (see ``tests/test_analysis_sql.py``).
It exercises an HBM controller shared by both PEs (queueing), an async composite
overlapped with a prefetch (comm/compute overlap), an IPCQ send/recv pair
(``match_op_id``) and an idle gap. Makespan = 180 ns.

PE0 (program 0)                      PE1 (program 1)
  op0 load      [0, 40]               op5 load   [0, 60]  (queues 20 ns at HBM behind op0)
  op1 composite [40, 100] deps 0      op6 recv   [60, 120] match op4
  op2 load      [45, 85]              op7 math   [120, 150] deps 6
  op3 wait      [85, 100] deps 1      op8 store  [150, 180] deps 7
  op4 send      [100, 120] deps 1
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from kbtrace import __version__, schema
from kbtrace._io import write_json, write_table

__all__ = ["write_synthetic_run", "make_table", "SYNTH_MAKESPAN_NS"]

SYNTH_MAKESPAN_NS = 180.0

_P = "sip0.cube0."
# node_idx, node_id, kind, pe, x_mm, y_mm
_NODES = [
    (0, "pe0.dma", "dma", 0, 0.0, 0.0), (1, "pe0.fetch_store", "fetch_store", 0, 0.1, 0.0),
    (2, "pe0.gemm", "gemm", 0, 0.2, 0.0), (3, "pe0.math", "math", 0, 0.3, 0.0),
    (4, "pe0.ipcq", "ipcq", 0, 0.4, 0.0), (5, "pe1.dma", "dma", 1, 0.0, 1.0),
    (6, "pe1.fetch_store", "fetch_store", 1, 0.1, 1.0), (7, "pe1.gemm", "gemm", 1, 0.2, 1.0),
    (8, "pe1.math", "math", 1, 0.3, 1.0), (9, "pe1.ipcq", "ipcq", 1, 0.4, 1.0),
    (10, "r0", "router", None, 0.5, 0.5), (11, "hbm_ctrl.pe0", "hbm_ctrl", 0, 0.6, 0.5),
    (12, "pe0.pe_cpu", "pe_cpu", 0, 0.5, 0.0), (13, "pe1.pe_cpu", "pe_cpu", 1, 0.5, 1.0),
]
# link_idx, src, dst, kind, bw
_LINKS = [
    (0, 0, 10, "pe_to_router", 64.0), (1, 10, 11, "router_to_hbm", 256.0),
    (2, 11, 10, "router_to_hbm", 256.0), (3, 10, 0, "pe_to_router", 64.0),
    (4, 5, 10, "pe_to_router", 64.0), (5, 10, 5, "pe_to_router", 64.0),
    (6, 4, 9, "pe_internal", 32.0),
]
# op_id, program, seq, kind, name, is_async, deps, match, engine node, issue, start, end, queue
_OPS = [
    (0, 0, 0, "load", "load", False, [], None, 0, 0, 0, 40, 0),
    (1, 0, 1, "composite", "gemm", True, [0], None, 2, 40, 40, 100, 0),
    (2, 0, 2, "load", "load", False, [], None, 0, 45, 45, 85, 2),
    (3, 0, 3, "wait", "wait", False, [1], None, 12, 85, 85, 100, 0),
    (4, 0, 4, "send", "send", False, [1], 6, 4, 100, 100, 120, 0),
    (5, 1, 0, "load", "load", False, [], None, 5, 0, 0, 60, 20),
    (6, 1, 1, "recv", "recv", False, [], 4, 9, 60, 60, 120, 0),
    (7, 1, 2, "math", "exp", False, [6], None, 8, 120, 120, 150, 0),
    (8, 1, 3, "store", "store", False, [7], None, 5, 150, 150, 180, 5),
]
# op_id, hop, stage, node_idx, link_idx, enter, leave, busy, queue, crit, nbytes
_HOPS = [
    (0, 0, "dma_read", 0, 0, 0, 10, 10, 0, 10, 512),
    (0, 1, "hbm", 11, -1, 10, 30, 20, 0, 20, 512),
    (0, 2, "dma_read", 10, 3, 30, 40, 10, 0, 10, 512),
    (1, 0, "fetch", 1, -1, 40, 50, 10, 0, 10, 512),
    (1, 1, "gemm", 2, -1, 50, 100, 50, 0, 50, 512),
    (2, 0, "dma_read", 0, 0, 45, 55, 8, 2, 10, 512),
    (2, 1, "hbm", 11, -1, 55, 75, 20, 0, 20, 512),
    (2, 2, "dma_read", 10, 3, 75, 85, 10, 0, 10, 512),
    (4, 0, "ipcq", 4, 6, 105, 120, 15, 0, 20, 256),
    (5, 0, "dma_read", 5, 4, 0, 10, 10, 0, 10, 512),
    (5, 1, "hbm", 11, -1, 10, 50, 20, 20, 40, 512),
    (5, 2, "dma_read", 10, 5, 50, 60, 10, 0, 10, 512),
    (6, 0, "ipcq", 9, -1, 60, 120, 5, 0, 60, 256),
    (7, 0, "fetch", 6, -1, 120, 125, 5, 0, 5, 256),
    (7, 1, "math", 8, -1, 125, 150, 25, 0, 25, 256),
    (8, 0, "dma_write", 5, 4, 150, 160, 10, 0, 10, 256),
    (8, 1, "hbm", 11, -1, 160, 180, 15, 5, 20, 256),
]


def make_table(sch: pa.Schema, cols: dict[str, list[Any]]) -> pa.Table:
    """An Arrow table of ``sch`` from per-column lists; missing columns are null (lists empty)."""
    n = len(next(iter(cols.values())))
    arrays = []
    for fld in sch:
        default: list[Any] = [[] for _ in range(n)] if pa.types.is_list(fld.type) else [None] * n
        vals = cols.get(fld.name, default)
        if pa.types.is_dictionary(fld.type):
            arrays.append(pa.array(vals, type=pa.string()).dictionary_encode().cast(fld.type))
        else:
            arrays.append(pa.array(vals, type=fld.type))
    return pa.Table.from_arrays(arrays, schema=sch)


def _nodes() -> pa.Table:
    return make_table(schema.NODES, {
        "node_idx": [n[0] for n in _NODES], "node_id": [_P + n[1] for n in _NODES],
        "kind": [n[2] for n in _NODES], "sip": [0] * len(_NODES), "cube": [0] * len(_NODES),
        "pe": [None if n[2] in ("router", "hbm_ctrl") else n[3] for n in _NODES],
        "overhead_ns": [1.0] * len(_NODES), "x_mm": [n[4] for n in _NODES],
        "y_mm": [n[5] for n in _NODES]})


def _links() -> pa.Table:
    ids = {n[0]: _P + n[1] for n in _NODES}
    return make_table(schema.LINKS, {
        "link_idx": [lk[0] for lk in _LINKS], "src_idx": [lk[1] for lk in _LINKS],
        "dst_idx": [lk[2] for lk in _LINKS], "src_id": [ids[lk[1]] for lk in _LINKS],
        "dst_id": [ids[lk[2]] for lk in _LINKS], "kind": [lk[3] for lk in _LINKS],
        "bw_gbps": [lk[4] for lk in _LINKS], "distance_mm": [1.0] * len(_LINKS),
        "latency_ns": [1.0] * len(_LINKS)})


def _ops() -> pa.Table:
    n = len(_OPS)
    return make_table(schema.OPS, {
        "op_id": [o[0] for o in _OPS], "launch": [0] * n, "program": [o[1] for o in _OPS],
        "pid0": [o[1] for o in _OPS], "pid1": [0] * n, "sip": [0] * n, "cube": [0] * n,
        "pe": [o[1] for o in _OPS], "seq": [o[2] for o in _OPS], "kind": [o[3] for o in _OPS],
        "name": [o[4] for o in _OPS], "is_async": [o[5] for o in _OPS],
        "nbytes": [512] * n, "in_addrs": [[]] * n, "in_spaces": [[]] * n,
        "in_shapes": [[]] * n, "in_dtypes": [[]] * n, "scalars": [[]] * n,
        "out_shape": [[16, 8]] * n, "out_dtype": ["f32"] * n,
        "match_op_id": [o[7] for o in _OPS], "deps": [o[6] for o in _OPS],
        "src_file": ["synthetic.py"] * n, "src_line": [10 + o[0] for o in _OPS],
        "out_digest": [1000 + o[0] for o in _OPS]})


def _op_timing() -> pa.Table:
    ids = {n[0]: _P + n[1] for n in _NODES}
    n = len(_OPS)
    return make_table(schema.OP_TIMING, {
        "op_id": [o[0] for o in _OPS], "launch": [0] * n, "program": [o[1] for o in _OPS],
        "sip": [0] * n, "cube": [0] * n, "pe": [o[1] for o in _OPS], "seq": [o[2] for o in _OPS],
        "kind": [o[3] for o in _OPS], "name": [o[4] for o in _OPS],
        "engine": [ids[o[8]] for o in _OPS], "t_issue_ns": [float(o[9]) for o in _OPS],
        "t_start_ns": [float(o[10]) for o in _OPS], "t_end_ns": [float(o[11]) for o in _OPS],
        "queue_ns": [float(o[12]) for o in _OPS], "nbytes": [512] * n})


def _hops() -> pa.Table:
    cols = ("op_id", "hop", "stage", "node_idx", "link_idx", "t_enter_ns", "t_leave_ns",
            "busy_ns", "queue_ns", "crit_ns", "nbytes")
    data: dict[str, list[Any]] = {c: [h[i] for h in _HOPS] for i, c in enumerate(cols)}
    for c in ("t_enter_ns", "t_leave_ns", "busy_ns", "queue_ns", "crit_ns"):
        data[c] = [float(v) for v in data[c]]
    data["tile"] = [-1] * len(_HOPS)
    return make_table(schema.HOPS, data)


def write_synthetic_run(root: str | os.PathLike[str]) -> Path:
    """Write ``root/trace`` (ops.parquet, trace.json) and ``root/run`` (the run); return the run dir."""
    root = Path(root)
    trace, run = root / "trace", root / "run"
    write_table(trace / "ops.parquet", _ops())
    write_json(trace / "trace.json", {"workload": "synthetic", "schema_version": schema.SCHEMA_VERSION,
                                      "kbtrace_version": __version__, "content_hash": "synth"})
    write_table(run / "op_timing.parquet", _op_timing())
    write_table(run / "hops.parquet", _hops())
    write_table(run / "nodes.parquet", _nodes())
    write_table(run / "links.parquet", _links())
    write_json(run / "run.json", {
        "run_id": "synth0000", "trace_dir": "../trace", "trace_hash": "synth",
        "topology": "synthetic", "topology_hash": "synth", "options": {"fidelity": "fast"},
        "fidelity": "fast", "makespan_ns": SYNTH_MAKESPAN_NS, "events": 0, "ops": len(_OPS),
        "hops": len(_HOPS), "wall_s": 0.0, "schema_version": schema.SCHEMA_VERSION,
        "kbtrace_version": __version__})
    return run

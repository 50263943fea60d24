"""Phase-2 numeric verification: recompute the trace in the replay's timing order.

``verify(run)`` rebuilds the memory image from the trace's ``memory.parquet``, executes
every op with the capture stage's numpy executor (``kbtrace.capture.executor``: the one
definition of op semantics) in the order the replay timed them, and compares

* every declared output tensor with its reference (dtype tolerance table of
  ``kbtrace.capture.dtypes``: f32 1e-5, f16 1e-3, bf16 1e-2 as rtol = atol with
  ``|got - want| <= atol + rtol * |want|``; integers and bool exactly), and
* every op's result digest with ``ops.out_digest`` (the capture-order golden run); the
  first op in execution order whose digest differs is the *first diverging op*.

Execution order: ``op_timing.t_start_ns``, ties broken by dependency depth (an op
after everything it depends on: ``deps`` and, for a recv, its matching send), then
op_id. Because the order comes from the replay, a replay that runs a consumer before
its producer fails verification even when the kernel is right.
"""

from __future__ import annotations

import array
import contextlib
import gc
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace import schema
from kbtrace._integrity import check_trace_files
from kbtrace._io import read_parquet_lean, release_memory, trim_heap
from kbtrace.analysis._traceops import TraceOps
from kbtrace.errors import AnalysisError, KbtraceError, SchemaError

#: ops between two ``progress`` calls of ``verify``
PROGRESS_EVERY = 256
#: ops built as Python objects at a time (in execution order)
OP_BATCH = 8192
#: between two batches of ops, the young generation is collected once it holds this many
#: more container objects than at the last collection (as capture's drains do,
#: ``capture.tracer.GC_YOUNG``): the ops make no reference cycles, and collecting after
#: every batch cost ~2.5 of 21 CPU s at 1.0 M gemm ops, each pass walking the live batch
#: and read cache only to move them to an older generation
GC_YOUNG = 500_000
#: ops rows whose dependencies ``_order_violations`` checks at a time
_VIOLATION_ROWS = 1 << 17
#: the op_timing columns verify reads
_TIMED = ("op_id", "t_issue_ns", "t_start_ns", "t_end_ns")

__all__ = ["verify", "VerifyResult", "TensorCheck", "DivergingOp", "execution_order"]


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


@dataclass(frozen=True, slots=True)
class TensorCheck:
    """Comparison of one declared output with its reference."""

    tensor: str
    dtype: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    n_bad: int
    ok: bool


@dataclass(frozen=True, slots=True)
class DivergingOp:
    """The first op (in execution order) whose result differs from the capture run."""

    op_id: int
    kind: str
    name: str
    launch: int
    program: int
    seq: int
    src_file: str | None
    src_line: int | None
    position: int          # index in the execution order
    reason: str

    def describe(self) -> str:
        where = f"{self.src_file}:{self.src_line}" if self.src_file else "unknown source line"
        return (f"op {self.op_id} {self.kind}/{self.name} (launch {self.launch}, program "
                f"{self.program}, seq {self.seq}) at {where}, #{self.position} in replay order: "
                f"{self.reason}")


@dataclass
class VerifyResult:
    """Outcome of ``verify``; ``ok`` is the verdict, ``text()`` the human report."""

    run_dir: Path
    n_ops: int
    tensors: list[TensorCheck] = field(default_factory=list)
    first_divergence: DivergingOp | None = None
    order_violations: list[tuple[int, int]] = field(default_factory=list)  # (op, dep) pairs
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (self.error is None and self.first_divergence is None
                and all(t.ok for t in self.tensors))

    def frame(self) -> pl.DataFrame:
        """One row per output tensor: tensor, dtype, shape, max_abs, max_rel, rtol, atol,
        n_bad, ok."""
        return pl.DataFrame(
            {"tensor": [t.tensor for t in self.tensors], "dtype": [t.dtype for t in self.tensors],
             "shape": ["x".join(map(str, t.shape)) or "scalar" for t in self.tensors],
             "max_abs": [t.max_abs for t in self.tensors],
             "max_rel": [t.max_rel for t in self.tensors],
             "rtol": [t.rtol for t in self.tensors], "atol": [t.atol for t in self.tensors],
             "n_bad": [t.n_bad for t in self.tensors], "ok": [t.ok for t in self.tensors]},
            schema={"tensor": pl.String, "dtype": pl.String, "shape": pl.String,
                    "max_abs": pl.Float64, "max_rel": pl.Float64, "rtol": pl.Float64,
                    "atol": pl.Float64, "n_bad": pl.Int64, "ok": pl.Boolean})

    def to_dict(self) -> dict[str, Any]:
        """The whole result as JSON-ready values."""
        fd = self.first_divergence
        return {"ok": self.ok, "run_dir": str(self.run_dir), "n_ops": self.n_ops,
                "tensors": [{**r, "max_abs": _finite(r["max_abs"]), "max_rel": _finite(r["max_rel"])}
                            for r in self.frame().to_dicts()],
                "first_divergence": None if fd is None else {
                    f: getattr(fd, f) for f in fd.__slots__},
                "order_violations": [list(v) for v in self.order_violations],
                "error": self.error}

    def render(self, fmt: str = "text") -> str:
        """``text`` (``text()``), ``json`` (``to_dict()``), ``csv`` / ``md`` (the tensor table)."""
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if fmt in ("csv", "md"):
            from kbtrace.analysis.formats import render
            return render(self.frame(), fmt)
        return self.text() + "\n"

    def text(self) -> str:
        lines = [f"verify: {'PASS' if self.ok else 'FAIL'} ({self.n_ops} ops in replay order, "
                 f"{len(self.tensors)} output tensors; run {self.run_dir})"]
        if self.tensors:
            lines.append(f"  {'tensor':<16} {'dtype':<5} {'shape':<14} {'max_abs':>10} "
                         f"{'max_rel':>10} {'rtol/atol':>13}  result")
            for t in self.tensors:
                shape = "x".join(map(str, t.shape)) or "scalar"
                lines.append(f"  {t.tensor:<16} {t.dtype:<5} {shape:<14} {t.max_abs:>10.3e} "
                             f"{t.max_rel:>10.3e} {t.rtol:>6.0e}/{t.atol:<6.0e}  "
                             f"{'ok' if t.ok else f'FAIL ({t.n_bad} elements)'}")
        if self.first_divergence is not None:
            lines.append("  first diverging op: " + self.first_divergence.describe())
        for op, dep in self.order_violations[:5]:
            lines.append(f"  order violation: op {op} starts before its dependency op {dep} ends")
        if len(self.order_violations) > 5:
            lines.append(f"  ... {len(self.order_violations) - 5} more order violations")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)


_TRACE_FIX = "verify needs the run's trace (re-capture it, or fix trace.path in run.json)"


def _check_file(path: Path, expected: pa.Schema, fix: str) -> None:
    """A Parquet input of verify is there with ``expected``'s columns, else one line naming
    it + ``fix``."""
    from kbtrace.analysis.run import read_parquet_schema

    if not path.is_file():
        raise AnalysisError(f"{path}: missing; {fix}")
    schema.check_schema(read_parquet_schema(path, fix), expected, str(path))


def _read(path: Path, expected: pa.Schema, fix: str, columns: list[str] | None = None
          ) -> pa.Table:
    """A Parquet input of verify (``columns`` of it); missing, corrupt or mis-shaped: one
    line naming it + ``fix``."""
    from kbtrace.analysis.run import corrupt_parquet

    _check_file(path, expected, fix)
    try:
        return read_parquet_lean(path, columns)     # memory.parquet holds every tensor's bytes
    except (pa.ArrowException, OSError) as exc:
        raise corrupt_parquet(path, exc, fix) from None


def _references(path: Path) -> pa.Table:
    """The role=reference rows of a trace's ``memory.parquet`` (checked by ``_read`` earlier
    in the same verify), decoding only the row groups whose statistics may hold them: a
    ``pyarrow.dataset`` scan with that filter still raised the peak by ~180 MiB at 1.0 M
    gemm ops, these reads by ~80 (the references' row group, 32 MiB with the outputs')."""
    import pyarrow.parquet as pq

    from kbtrace.analysis.run import corrupt_parquet

    try:
        f = pq.ParquetFile(path, pre_buffer=False)
        meta, col = f.metadata, f.schema_arrow.get_field_index("role")
        groups = []
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(col).statistics
            if (st is None or not st.has_min_max
                    or str(st.min) <= "reference" <= str(st.max)):
                groups.append(g)
        t = f.read_row_groups(groups, use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise corrupt_parquet(path, exc, _TRACE_FIX) from None
    return t.filter(pc.equal(t.column("role").cast(pa.string()), "reference"))


def _load_memory(path: Path, mem: Any) -> None:
    """``executor.load_memory`` of ``memory.parquet`` (checked by ``_read`` earlier) a row group
    at a time, the references' groups skipped by their statistics: the whole table held every
    tensor's bytes beside the pages (+113 MiB at 1.0 M gemm ops: inputs, output, reference)."""
    import pyarrow.parquet as pq

    from kbtrace.analysis.run import corrupt_parquet
    from kbtrace.capture import executor as ex

    try:
        f = pq.ParquetFile(path, pre_buffer=False)
        meta, col = f.metadata, f.schema_arrow.get_field_index("role")
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(col).statistics
            if (st is not None and st.has_min_max
                    and str(st.min) == str(st.max) == "reference"):
                continue
            ex.load_memory(f.read_row_group(g, use_threads=False), mem)
    except (pa.ArrowException, OSError) as exc:
        raise corrupt_parquet(path, exc, _TRACE_FIX) from None


def _trace_ops(path: Path) -> TraceOps:
    """``TraceOps`` of ``path``: a well-formed trace before numpy executes it (validated in
    batches, no topology needed); a bad op or a corrupt file is one ``SchemaError`` line."""
    from kbtrace.analysis.run import corrupt_parquet
    from kbtrace.capture.executor import EXEC_FIELDS

    _check_file(path, schema.OPS, _TRACE_FIX)
    try:
        return TraceOps(path, EXEC_FIELDS, access=True)
    except KbtraceError as exc:
        raise SchemaError(str(exc).replace("ops.parquet: ", f"{path}: ", 1)) from None
    except (pa.ArrowException, OSError) as exc:
        raise corrupt_parquet(path, exc, _TRACE_FIX) from None


def _depth(ops: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(op_ids, dependency depth) per row (deps + recv->send); ops in a cycle get a large
    depth. The edges are built with Arrow / numpy, then Kahn's walk goes a level at a time
    over row numbers with numpy (the walk over dicts of op_ids cost ~5 us per op)."""
    ids = np.asarray(ops.column("op_id").to_numpy(), dtype=np.int64)
    n = len(ids)
    by_id = np.argsort(ids, kind="stable")
    sorted_ids = ids[by_id]

    def rows_of(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of the values that are op_ids, their rows)"""
        pos = np.minimum(np.searchsorted(sorted_ids, vals), max(n - 1, 0))
        ok = sorted_ids[pos] == vals if n else np.zeros(len(vals), dtype=bool)
        return ok, by_id[pos[ok]]

    deps = ops.column("deps").combine_chunks()
    flat = pc.list_flatten(deps)
    parent = np.asarray(pc.list_parent_indices(deps).to_numpy(), dtype=np.int64)
    present = ~np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    vals = np.asarray(pc.fill_null(flat, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    ok, src = rows_of(vals[present])
    dst = parent[present][ok]
    match = ops.column("match_op_id").combine_chunks()
    recv = (np.asarray(pc.equal(ops.column("kind"), "recv").fill_null(False).to_numpy(
        zero_copy_only=False), dtype=bool) & ~np.asarray(match.is_null().to_numpy(
            zero_copy_only=False), dtype=bool))
    rr = np.flatnonzero(recv)
    mok, msrc = rows_of(np.asarray(pc.fill_null(match, 0).to_numpy(zero_copy_only=False),
                                   dtype=np.int64)[rr])
    src = np.concatenate([src, msrc])
    dst = np.concatenate([dst, rr[mok]])
    # (what the walk does not read, freed first: ~50 MiB of verify's peak at 1.0 M gemm ops)
    del deps, flat, parent, present, vals, ok, match, recv, rr, mok, msrc
    indeg = np.bincount(dst, minlength=n)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=off[1:])
    succ = dst[np.argsort(src, kind="stable")]
    del src, dst
    # Kahn's walk a level at a time: the frontier is every op whose last predecessor is in
    # the level before, so its depth is that level's + 1 (the longest path to it); a level's
    # successors are gathered and their in-degrees counted down with numpy (a per-op Python
    # loop over machine-int arrays cost 0.42-0.59 CPU s at 1.0 M gemm ops)
    depth = np.full(n, n + 1, dtype=np.int64)       # (never released: in or behind a cycle)
    frontier = np.flatnonzero(indeg == 0)
    level = 0
    while len(frontier):
        depth[frontier] = level
        lo, hi = off[frontier], off[frontier + 1]
        lens = hi - lo
        total = int(lens.sum())
        if not total:
            break
        # the frontier's successor ranges [lo, hi) as one index array
        idx = np.arange(total, dtype=np.int64) + np.repeat(hi - np.cumsum(lens), lens)
        hit, cnt = np.unique(succ[idx], return_counts=True)
        left = indeg[hit] - cnt
        indeg[hit] = left
        frontier = hit[left == 0]
        level += 1
    return ids, depth


def execution_order(ops: pa.Table, op_timing: pa.Table) -> list[int]:
    """op_ids sorted by (t_start_ns, dependency depth, op_id)."""
    return _order(ops, op_timing).tolist()


def _last_rows(op_timing: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(op_ids sorted, their rows in op_timing): of repeated op_ids the last row counts."""
    tid = np.asarray(op_timing.column("op_id").to_numpy(), dtype=np.int64)
    srt = np.argsort(tid, kind="stable")
    keep = np.ones(len(srt), dtype=bool)
    keep[:-1] = tid[srt][1:] != tid[srt][:-1]
    rows = srt[keep]
    return tid[rows], rows


def _order(ops: pa.Table, op_timing: pa.Table) -> np.ndarray:
    """``execution_order`` as an array (the timing looked up with numpy: a dict of every
    op's start held ~0.1 KiB per op)."""
    ids, d = _depth(ops)
    uid, rows = _last_rows(op_timing)
    pos = np.minimum(np.searchsorted(uid, ids), max(len(uid) - 1, 0))
    found = uid[pos] == ids if len(uid) else np.zeros(len(ids), dtype=bool)
    missing = ids[~found]
    if len(missing):
        raise AnalysisError(f"op_timing has no row for {len(missing)} ops (first: op "
                            f"{int(missing[0])}); the run is incomplete, re-run `kbtrace replay`")
    extra = uid[~np.isin(uid, ids)]
    if len(extra):       # a run replayed from another trace than the one found now
        raise AnalysisError(f"op_timing has {len(extra)} rows for ops the trace does not have "
                            f"(first: op {int(extra[0])}); the run was replayed from another "
                            "trace, re-run `kbtrace replay` on this one")
    ts = np.asarray(op_timing.column("t_start_ns").to_numpy(), dtype=np.float64)[rows[pos]]
    return ids[np.lexsort((ids, d, ts))]      # by (t_start, depth, op_id)


def _order_violations(ops: pa.Table, op_timing: pa.Table) -> list[tuple[int, int]]:
    """(op, dep) pairs, in ops-row then deps order, where the op starts before its dependency
    ends (op_timing rows by op_id; of repeated op_ids the last row counts). With Arrow /
    numpy over the flattened deps (a loop over dicts cost ~1 us per op)."""
    uid, rows = _last_rows(op_timing)
    start = np.asarray(op_timing.column("t_start_ns").to_numpy(), dtype=np.float64)[rows]
    end = np.asarray(op_timing.column("t_end_ns").to_numpy(), dtype=np.float64)[rows]

    def find(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.minimum(np.searchsorted(uid, vals), max(len(uid) - 1, 0))
        return ((uid[pos] == vals) if len(uid) else np.zeros(len(vals), dtype=bool)), pos

    out: list[tuple[int, int]] = []
    for lo in range(0, ops.num_rows, _VIOLATION_ROWS):    # (a slice of rows at a time: the
        part = ops.slice(lo, _VIOLATION_ROWS)             # whole trace's flattened deps and
        deps = part.column("deps").combine_chunks()       # their lookups were ~+100 MiB at
        flat = pc.list_flatten(deps)                      # 1.0 M gemm ops)
        present = ~np.asarray(flat.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        x = np.asarray(pc.fill_null(flat, 0).to_numpy(zero_copy_only=False),
                       dtype=np.int64)[present]
        parent = np.asarray(pc.list_parent_indices(deps).to_numpy(), dtype=np.int64)[present]
        i = np.asarray(part.column("op_id").to_numpy(), dtype=np.int64)[parent]
        fx, px = find(x)
        fi, pi = find(i)
        bad = fx & fi
        bad[bad] = start[pi[bad]] < end[px[bad]]
        out += zip(i[bad].tolist(), x[bad].tolist(), strict=True)
    return out


def _compare(name: str, dtype: str, got: np.ndarray | None, want: np.ndarray) -> TensorCheck:
    from kbtrace.capture.dtypes import TOLERANCE, compare

    rtol, atol = TOLERANCE.get(dtype, (0.0, 0.0))
    shape = tuple(int(s) for s in want.shape)
    if got is None or tuple(got.shape) != shape:
        return TensorCheck(name, dtype, shape, float("inf"), float("inf"), rtol, atol,
                           int(np.prod(shape)) if shape else 1, False)
    max_abs, max_rel, n_bad = compare(got, want, dtype)
    return TensorCheck(name, dtype, shape, max_abs, max_rel, rtol, atol, n_bad, n_bad == 0)


def check_timing(timing: pa.Table, where: Path) -> None:
    """Every op of a run's op_timing starts at or after its issue and ends at or after its
    start, with finite times (a replay never writes otherwise: a damaged or crafted file)."""
    ti, ts, te = (np.asarray(timing.column(c).to_numpy(), dtype=np.float64)
                  for c in ("t_issue_ns", "t_start_ns", "t_end_ns"))
    tol = 1e-6 + 1e-9 * np.abs(te)
    bad = np.flatnonzero(~np.isfinite(te) | ~np.isfinite(ti) | (te < ts - tol)
                         | (ts < ti - tol))
    if bad.size:
        i = int(bad[0])
        op = timing.column("op_id")[i].as_py()
        raise SchemaError(f"{where}: op {op} is timed issue {ti[i]:.3f}, start {ts[i]:.3f}, end "
                          f"{te[i]:.3f} ns (it ends before it starts, or a time is not finite); "
                          "re-run `kbtrace replay` to regenerate the run")


def verify(run: Any, progress: Callable[[int, int], Any] | None = None) -> VerifyResult:
    """Re-execute a run's trace in replay timing order and check outputs and per-op digests.

    ``run``: a run directory path or an open ``Run``. Raises ``AnalysisError`` when the
    inputs are missing; numeric failures are reported in the result (``ok`` False).
    ``progress(done, total)``: called every ``PROGRESS_EVERY`` ops and at the end.
    """
    from kbtrace.analysis.run import read_run_json, recorded_trace_path, run_trace_dir

    run_dir = Path(run.path if hasattr(run, "path") else run)
    info = read_run_json(run_dir)
    trace_dir = run_trace_dir(run_dir, info)     # refuses a trace changed since the replay
    if trace_dir is None:
        raise AnalysisError(f"{run_dir}: trace {recorded_trace_path(info)!r} not found; "
                            "verify needs its ops.parquet and memory.parquet (re-capture it, "
                            "or fix trace.path in run.json)")
    check_trace_files(trace_dir, ("ops.parquet", "memory.parquet"))
    with _trace_ops(trace_dir / "ops.parquet") as ops:
        return _verify(run_dir, trace_dir, ops, progress)


def _verify(run_dir: Path, trace_dir: Path, ops: TraceOps,
            progress: Callable[[int, int], Any] | None) -> VerifyResult:
    """``verify`` once the trace's ops are validated."""
    from kbtrace.analysis.run import REPLAY_FIX
    from kbtrace.capture import executor as ex

    mem_path = trace_dir / "memory.parquet"
    _check_file(mem_path, schema.MEMORY, _TRACE_FIX)
    release_memory()            # (what validating the ops in batches freed)
    timing = _read(run_dir / "op_timing.parquet", schema.OP_TIMING, REPLAY_FIX, list(_TIMED))
    check_timing(timing, run_dir / "op_timing.parquet")
    graph, ops.graph = ops.graph, None
    assert graph is not None
    order = _order(graph, timing)
    result = VerifyResult(run_dir, len(order), order_violations=_order_violations(graph, timing))
    del graph, timing           # what the ops run with is the order: the rest is freed
    release_memory()
    # (each step's temporaries before the next one's: the tensors' bytes are read last)
    dead = _dead(ops, order, _read(mem_path, schema.MEMORY, _TRACE_FIX, ["role", "addr", "nbytes"]))
    release_memory()
    # what is read after the ops ran: the outputs' shards (where they are: no bytes) and
    # the references, read again then (held while the ops ran, with the outputs' initial
    # bytes, they were 32 MiB of verify's peak at 1.0 M gemm ops)
    meta = _read(mem_path, schema.MEMORY, _TRACE_FIX,
                 [f.name for f in schema.MEMORY if f.name != "data"])
    shards = meta.filter(pc.is_in(meta.column("role").cast(pa.string()),
                                  pa.array(["output", "reference"])))
    del meta
    machine = ex.Machine()
    _load_memory(mem_path, machine.mem)
    release_memory()
    with _gc_paused():
        _execute(machine, ops, order, result, progress, dead)
    if result.error is None:
        machine.mem.forget_reads()      # (the read cache: nothing reads through it now)
        trim_heap()
        outputs = ex.gather_outputs(shards, machine.mem)
        machine.mem.clear()     # (the pages: ``Machine`` is in a cycle, ``del`` left them to gc)
        del machine
        trim_heap()
        refs = ex.reference_outputs(_references(mem_path))
        dtypes = {r["tensor"]: r["dtype"] for r in shards.select(["tensor", "dtype"]).to_pylist()}
        for name in sorted(refs):
            result.tensors.append(_compare(name, dtypes[name], outputs.get(name), refs[name]))
        if not refs:
            result.error = "memory.parquet declares no reference outputs; nothing to compare"
    if progress is not None:
        progress(len(order), len(order))
    return result


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Automatic GC paused while the ops execute: they create no reference cycles, and the
    generational passes the ~10 objects per op triggered cost ~25% of verify's CPU (between
    batches of ops the young generation is collected once it grew by ``GC_YOUNG``)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


#: ``_dead``'s event positions; per position its first dead span (one more entry: the end),
#: the spans' addresses and bytes; its first read-cache address (idem) and those addresses.
#: Machine ints (``array.array``): as lists of tuples they took ~130 B per span
_Dead = tuple[array.array, array.array, array.array, array.array, array.array, array.array]
_NO_DEAD: _Dead = (array.array("q"), array.array("q", [0]), array.array("q"),
                   array.array("q"), array.array("q", [0]), array.array("q"))


def _dead(ops: TraceOps, order: np.ndarray, memory: pa.Table) -> _Dead:
    """Positions in ``order`` and what the image forgets once the op there ran
    (``capture._liveness``): the spans dead after it — written buffers whose bytes nothing
    reads again before they are written anew; at 1.0 M gemm ops the image otherwise held
    every PE's whole TCM (512 MiB on default.yaml) once the replay had cycled through it;
    never an output's span — and the addresses whose last tile read it was (the read
    cache's copies of a gemm's A and B tiles: all 81 MiB of them were held to the end, at
    most ~47 MiB are read again)."""
    from kbtrace.capture import _liveness as liveness

    acc = ops.take_accesses()
    pos = np.empty(ops.n, dtype=np.int64)
    pos[order] = np.arange(len(order), dtype=np.int64)
    out = memory.filter(pc.equal(memory.column("role").cast(pa.string()), "output"))
    keep = list(zip(out.column("addr").to_pylist(), out.column("nbytes").to_pylist(),
                    strict=True))
    e_at, e_addr = liveness.last_reads(acc, pos)
    at, addr, nbytes = liveness.drops(acc, pos, keep)
    del acc, pos
    if not len(at) and not len(e_at):
        return _NO_DEAD
    # both are sorted: merged by a stable sort of the two runs (a merge) and their repeats
    # dropped (``np.union1d`` sorts from scratch: ~0.5 CPU s at 1.0 M gemm ops)
    events = np.concatenate((at, e_at))
    events.sort(kind="stable")
    if len(events) > 1:
        events = events[np.concatenate(([True], events[1:] != events[:-1]))]

    def starts(x: np.ndarray) -> np.ndarray:
        return np.append(np.searchsorted(x, events, side="left"), len(x))

    def q(x: np.ndarray) -> array.array:
        return array.array("q", np.ascontiguousarray(x, dtype=np.int64).tobytes())

    return q(events), q(starts(at)), q(addr), q(nbytes), q(starts(e_at)), q(e_addr)


def _execute(machine: Any, ops: TraceOps, order: np.ndarray, result: VerifyResult,
             progress: Callable[[int, int], Any] | None, dead: _Dead = _NO_DEAD) -> None:
    """Step ``machine`` through ``order``; the first digest divergence or execution error
    goes into ``result``. One ``np.errstate`` around all ops (``Machine.digest_of``), as
    ``Machine.step`` holds around each. ``dead``: positions, and the spans whose bytes the
    image forgets once the op there ran, and the addresses whose cached reads it forgets
    (``_dead``). The executor's ``ExecOp`` of each op of ``order`` (the columns the executor
    reads) are built ``OP_BATCH`` at a time from the row groups that hold them
    (``TraceOps.in_order``; holding every op as a Python object took ~2.3 KiB per op), and
    looped over here (a generator yielding each op cost a frame resume per op)."""
    step = machine.digest_of
    drop, forget = machine.mem.drop, machine.mem.forget_reads_at
    at, starts, addrs, sizes, e_starts, e_addrs = dead
    k, nxt = 0, (at[0] if at else -1)
    base = 0
    with np.errstate(all="ignore"):
        for batch in ops.in_order(order, OP_BATCH):
            for pos, op in enumerate(batch, base):
                if progress is not None and not pos % PROGRESS_EVERY:
                    progress(pos, len(order))
                try:
                    dig = step(op)
                except (KbtraceError, ValueError, KeyError, IndexError) as exc:
                    op_id = op.op_id
                    result.first_divergence = (result.first_divergence or _div(
                        ops, op_id, pos, f"could not execute: {exc}"))
                    result.error = f"execution stopped at op {op_id}: {exc}"
                    return
                want = op.out_digest
                if (dig != want and dig is not None and want is not None
                        and result.first_divergence is None):
                    result.first_divergence = _div(ops, op.op_id, pos, f"result digest "
                                                   f"{dig:016x} != capture {want:016x}")
                if pos == nxt:
                    a, b = starts[k], starts[k + 1]
                    if b > a:
                        drop(zip(addrs[a:b], sizes[a:b], strict=True))
                    a, b = e_starts[k], e_starts[k + 1]
                    if b > a:
                        forget(e_addrs[a:b])
                    k += 1
                    nxt = at[k] if k < len(at) else -1
            base += len(batch)
            del batch
            if gc.get_count()[0] >= GC_YOUNG:
                gc.collect(0)


def _div(ops: TraceOps, op_id: int, pos: int, reason: str) -> DivergingOp:
    """The report of op ``op_id`` (read back from the trace) diverging at ``pos``."""
    r = ops.row(op_id, ["kind", "name", "launch", "program", "seq", "src_file", "src_line"])
    return DivergingOp(int(op_id), str(r["kind"]), str(r["name"]), int(r["launch"]),
                       int(r["program"]), int(r["seq"]), r["src_file"], r["src_line"], pos,
                       reason)

"""A trace's ``ops.parquet`` as verify reads it: validated in one pass of batches, then
executed in replay order from spills (issue 22: flat memory).

Verify used to hold the whole ops table (~0.3 KiB per op as Arrow, every column) from
the first check to the last op. ``TraceOps(path, fields)`` reads the file ``READ_ROWS``
rows at a time, once:

* each batch is validated (``validate_ops`` of the batch; the IPCQ pairing, which spans
  batches, is checked once at the end);
* the dependency graph is kept (``graph``: op_id, deps, kind, match_op_id, ~30 B per op),
  and the executor's columns of the batch (``fields``) go to a temporary Arrow IPC file,
  string columns as codes into one dictionary per column kept here (an IPC file keeps one
  dictionary per column); ``columns`` are those holding some value over the whole file
  (what ``executor.op_columns`` decides over a table);
* with ``access``, the batch's memory accesses (``capture._liveness.accesses``) go to a
  temporary file too, joined when ``take_accesses`` reads them back (verify, once it has
  the execution order: held, they were ~69 MiB under its validation's and order's peaks
  at 1.0 M gemm ops).

``in_order(order, batch)`` gives the executor's ``ExecOp`` of each op of ``order`` (op_ids
= rows: validation proved them dense from 0), ``batch`` at a time. The positions of the
order are cut into at most ``MAX_BUCKETS`` buckets of at least ``SPILL_ROWS``; each
batch of the first spill, sorted by position, is written bucket by bucket to a second
spill, which is then read one bucket at a time and sorted by position (the ops of one
program run across the whole replay, so no window of the trace in op_id order would
do). Held at a time: one bucket (~125 B per op of it) and the ops being built. The
spills are unnamed temporary files where the system has them (``tempfile.TemporaryFile``):
nothing is left behind, even by a killed process. ``row(op_id, columns)`` reads one op
from ``ops.parquet`` (error messages only).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace import schema
from kbtrace._io import trim_heap

__all__ = ["TraceOps", "READ_ROWS", "SPILL_ROWS", "MAX_BUCKETS", "GRAPH_COLUMNS"]

#: rows read and validated at a time in the first pass
READ_ROWS = 1 << 16
#: positions of the execution order per bucket, at least (see ``in_order``)
SPILL_ROWS = 1 << 16
#: buckets at most (each batch of the first spill is cut into one piece per bucket)
MAX_BUCKETS = 64
#: what the dependency depth and the order checks read
GRAPH_COLUMNS = ("op_id", "deps", "kind", "match_op_id")


def _dataset(path: str | os.PathLike[str]) -> Any:
    import pyarrow.dataset as ds
    return ds.dataset(str(path), format="parquet")


class _Row:
    """One op read back for a message (``IpcqPairs.check``'s ``source.fetch``)."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)


class _Spill:
    """A temporary Arrow IPC file: record batches written, then read back by index."""

    def __init__(self) -> None:
        self.file: Any = tempfile.TemporaryFile(prefix="kbtrace-verify-ops-")  # noqa: SIM115 - closed by close()
        self._writer: Any = None
        self._reader: Any = None
        self.n = 0

    def write(self, batch: pa.RecordBatch) -> int:
        if self._writer is None:
            self._writer = pa.ipc.new_file(pa.PythonFile(self.file, mode="w"), batch.schema)
        self._writer.write_batch(batch)
        self.n += 1
        return self.n - 1

    def get(self, i: int) -> pa.RecordBatch:
        if self._reader is None:
            if self._writer is not None:
                self._writer.close()
            self.file.seek(0)
            self._reader = pa.ipc.open_file(pa.PythonFile(self.file, mode="r"))
        return self._reader.get_batch(i)

    def close(self) -> None:
        if self._writer is not None and self._reader is None:
            self._writer.close()
        self.file.close()


class _Arrays:
    """Batches of like-named numpy arrays (``capture._liveness.accesses``) in an unnamed
    temporary file, joined when taken back (``take``, once)."""

    def __init__(self) -> None:
        self.file: Any = tempfile.TemporaryFile(prefix="kbtrace-verify-acc-")  # noqa: SIM115 - closed by close()
        self.parts: list[dict[str, tuple[np.dtype[Any], int]]] = []

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        self.parts.append({k: (a.dtype, len(a)) for k, a in arrays.items()})
        for a in arrays.values():
            self.file.write(np.ascontiguousarray(a).view(np.uint8))

    def take(self) -> dict[str, np.ndarray]:
        from kbtrace.capture import _liveness as liveness

        try:
            if not self.parts:
                return liveness.concat([])
            self.file.seek(0)
            out = {k: np.empty(sum(p[k][1] for p in self.parts), dt)
                   for k, (dt, _) in self.parts[0].items()}
            at = dict.fromkeys(out, 0)
            for p in self.parts:
                for k, (_, n) in p.items():
                    self.file.readinto(out[k][at[k]:at[k] + n].view(np.uint8))
                    at[k] += n
            return out
        finally:
            self.close()

    def close(self) -> None:
        self.parts = []
        self.file.close()


class TraceOps:
    """``ops.parquet`` validated in batches (``validate_ops`` with ``topo=None``: what
    verify checks before numpy executes a trace) and read back in execution order; a
    context manager (``close`` drops the spill)."""

    def __init__(self, path: str | os.PathLike[str], fields: frozenset[str],
                 access: bool = False) -> None:
        from kbtrace.capture import _liveness as liveness
        from kbtrace.capture.executor import OP_FIELDS
        from kbtrace.replay import validate

        self.path = path
        frag = next(iter(_dataset(path).get_fragments()), None)
        self.n = 0 if frag is None else frag.metadata.num_rows
        self._luts: dict[str, dict[Any, int]] = {}
        self._spill = _Spill()
        #: every op's memory accesses, when asked for (``take_accesses``)
        self._acc: _Arrays | None = _Arrays() if access else None
        try:
            codes: dict[Any, int] = {}
            kinds: list[np.ndarray] = []
            graph: list[pa.RecordBatch] = []
            used: set[str] = set()
            pairs = validate.IpcqPairs()
            sizes: list[int] = []
            for batch in _dataset(path).to_batches(batch_size=READ_ROWS, batch_readahead=0,
                                                   fragment_readahead=0, use_threads=False,
                                                   memory_pool=pa.system_memory_pool()):
                if not batch.num_rows:
                    continue
                t = pa.Table.from_batches([batch])
                validate.validate_ops(t, None, first_row=sum(sizes), n_total=self.n,
                                      pairs=pairs)
                c, vals = _codes(t.column("kind"))
                lut = np.array([codes.setdefault(v, len(codes)) for v in vals], dtype=np.uint8)
                kinds.append(lut[c])
                graph.append(pa.RecordBatch.from_arrays(
                    [batch.column(n) for n in GRAPH_COLUMNS], names=list(GRAPH_COLUMNS)))
                if self._acc is not None:
                    self._acc.add(liveness.accesses(t))
                mine = [n for n in OP_FIELDS if n in fields and n in t.column_names]
                used.update(n for n in mine if n not in used and _set(t.column(n)))
                self._spill.write(self._coded(t.select(mine)).combine_chunks().to_batches()[0])
                sizes.append(batch.num_rows)
                del t, batch
                trim_heap()     # (each batch's decoding and checks: ~150 MiB at 1.0 M ops)
            self.kind_values = list(codes)
            self.kinds = np.concatenate(kinds) if kinds else np.zeros(0, np.uint8)
            pairs.check(self)
        except BaseException:
            self.close()
            raise
        self.starts = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.starts[1:])
        #: the executor's columns holding some value (``executor.op_columns`` of the file)
        self.columns = [n for n in OP_FIELDS if n in used]
        #: op_id, deps, kind, match_op_id of every op (one chunk per batch); the caller may
        #: drop it (None) once it has the order
        self.graph: pa.Table | None = (pa.Table.from_batches(graph) if graph else pa.table(
            {n: pa.array([], schema.OPS.field(n).type) for n in GRAPH_COLUMNS}))

    def take_accesses(self) -> dict[str, np.ndarray]:
        """Every op's memory accesses (``capture._liveness.accesses``; ``access=True``), read
        back from their spill, once: held while the trace was validated and the execution
        order found, they were ~69 MiB of verify's peak at 1.0 M gemm ops."""
        assert self._acc is not None, "TraceOps(access=True) keeps the accesses, once"
        acc, self._acc = self._acc, None
        return acc.take()

    def close(self) -> None:
        self._spill.close()
        if self._acc is not None:
            self._acc.close()

    def __enter__(self) -> TraceOps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- reading back
    def fetch(self, rows: list[int]) -> dict[int, Any]:
        """op_id, kind, launch, program and seq of each row (``IpcqPairs.check``)."""
        return {r: _Row(self.row(r, ["op_id", "kind", "launch", "program", "seq"]))
                for r in rows}

    def row(self, op_id: int, columns: list[str]) -> dict[str, Any]:
        """``columns`` of op ``op_id`` (its row of ops.parquet) as Python values."""
        import pyarrow.dataset as ds
        t = _dataset(self.path).to_table(columns=columns, filter=ds.field("op_id") == op_id)
        out: dict[str, Any] = t.slice(0, 1).to_pylist()[0]
        return out

    def in_order(self, order: np.ndarray, batch: int) -> Iterator[list[Any]]:
        """``ExecOp`` lists of ``order``'s ops (op_ids), ``batch`` at a time (see the module
        docstring)."""
        from kbtrace.capture import executor as ex

        n = len(order)
        pos = np.empty(self.n, dtype=np.int64)
        pos[order] = np.arange(n, dtype=np.int64)
        span = max(SPILL_ROWS, -(-n // MAX_BUCKETS))     # positions per bucket
        second = _Spill()
        try:
            pieces = self._by_bucket(second, pos, span)
            for k, idx in enumerate(pieces):
                if not idx:
                    continue
                t = pa.Table.from_batches([second.get(i) for i in idx])
                pieces[k] = []
                t = self._decoded(t.take(np.argsort(t.column("_pos").to_numpy(),
                                                    kind="stable")))
                for a in range(0, t.num_rows, batch):
                    yield ex.exec_ops_from_table(t.slice(a, batch), self.columns)
        finally:
            second.close()

    def _by_bucket(self, out: _Spill, pos: np.ndarray, span: int) -> list[list[int]]:
        """Every batch of the first spill (``columns``), sorted by ``pos``, written to ``out``
        a piece per bucket (``pos // span``); per bucket, the record batches holding it."""
        pieces: list[list[int]] = [[] for _ in range(max(1, -(-len(pos) // span)))]
        for g in range(len(self.starts) - 1):
            p = pos[self.starts[g]:self.starts[g + 1]]
            o = np.argsort(p, kind="stable")
            t = pa.Table.from_batches([self._spill.get(g)]).select(self.columns)
            t = t.append_column("_pos", pa.array(p)).take(o).combine_chunks()
            bucket = p[o] // span
            cuts = [0, *(np.flatnonzero(np.diff(bucket)) + 1).tolist(), len(p)]
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                pieces[int(bucket[a])].append(out.write(t.slice(a, b - a).to_batches()[0]))
        return pieces

    def _coded(self, t: pa.Table) -> pa.Table:
        """``t`` with its dictionary columns as int16 codes into ``self._luts``."""
        for i, name in enumerate(t.column_names):
            col = t.column(name)
            if not pa.types.is_dictionary(col.type):
                continue
            arr = col.combine_chunks()
            lut = self._luts.setdefault(name, {})
            remap = np.array([lut.setdefault(v, len(lut)) for v in arr.dictionary.to_pylist()]
                             + [-1], dtype=np.int16)
            idx = pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            t = t.set_column(i, name, pa.array(remap[idx], mask=arr.is_null().to_numpy(
                zero_copy_only=False)))
        return t

    def _decoded(self, t: pa.Table) -> pa.Table:
        """``_coded``'s columns back as dictionary columns (one dictionary each)."""
        for name, lut in self._luts.items():
            i = t.schema.get_field_index(name)
            if i < 0:
                continue
            t = t.set_column(i, name, pa.DictionaryArray.from_arrays(
                t.column(name).combine_chunks(), pa.array(list(lut), pa.string())))
        return t


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[Any]]:
    """(per-row codes, values) of a string or dictionary column; null: code -1, whose
    value is the last one (None)."""
    arr = col.combine_chunks()
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    codes = pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, [*arr.dictionary.to_pylist(), None]


def _set(col: pa.ChunkedArray) -> bool:
    """Does ``col`` hold a value other than the default (``executor.op_columns``' test)?"""
    if col.null_count == len(col):
        return False
    return not (pa.types.is_list(col.type)
                and not pc.max(pc.list_value_length(col)).as_py())

"""The trace's ops as replay reads them: one pass in batches, then fed per program.

Replay used to hold one ``Op`` record per op (and the whole ops table) for the whole
run, ~1.2 KiB per op (issue 22). ``OpSource`` reads ``ops.parquet`` (or a duck-typed
trace's table) ``READ_ROWS`` rows at a time, once:

* each batch is validated (``validate.validate_ops`` on the batch; the IPCQ pairing,
  which spans batches, is checked once at the end from the few columns it needs);
* the non-host ops are written to a temporary Arrow IPC file (the *spill*; on Linux its
  name is removed as soon as it is open, and it is read back through its descriptor, so a
  replay killed by a signal leaves nothing behind; elsewhere ``close`` removes it) grouped
  by (launch, program), ``FEED_ROWS`` rows per record batch, in
  ``op_id`` order within a program; the fields that repeat from op to op are stored as one
  template id per op, the template's values built once as Python objects and shared by the
  records (``spillcode``);
* what the elaboration needs is kept in compact form: per (launch, program) its spill
  batches, op count and PE; the launch's first ``op_id``; host copies (``h2d`` / ``d2h``,
  few) as ``Op`` records; IPCQ sends and receives (their keys and matches); each op's
  kind as one byte.

``feed(launch, program)`` gives a program's ops in ``seq`` order as a ``ProgramFeed``:
records are built ``FEED_ROWS`` at a time as the PE_CPU reaches them and dropped once
it moved on (what still runs holds its own reference), so the records alive at a time
are bounded by the programs times ``FEED_ROWS`` plus the ops in flight, not by the
trace. A program whose ``seq`` does not increase with ``op_id`` (hand-made traces) is
sorted whole, as before. ``scan(columns)`` re-reads the trace in batches (op timing,
invariants); ``fetch(op_ids)`` reads single records (error messages only).
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kbtrace._io import column_pylist
from kbtrace.errors import ReplayError
from kbtrace.replay import validate
from kbtrace.replay.ops import _FIELDS, _LISTS, HOST_KINDS, VARYING, Op, build_ops
from kbtrace.replay.spillcode import TEMPLATE_ID, SpillCoder
from kbtrace.replay.spillcode import pylist as _pylist
from kbtrace.replay.spillcode import tuples_of as _tuples_of

__all__ = ["OpSource", "ProgramFeed", "READ_ROWS", "FEED_ROWS"]

#: rows read from ops.parquet at a time (one validation / spill step)
READ_ROWS = 1 << 16
#: rows of one program turned into records at a time
FEED_ROWS = 1 << 8
#: the spill is not compressed: LZ4 made reading a 256-row batch back 10x slower (0.15 vs
#: 0.015 ms; 0.94 vs 0.49 ms with the records built) for a file 3.5x smaller (21 MB per
#: 100 k gemm ops)
_SPILL_CODEC: str | None = None
#: bytes the spill's writes are gathered into (21.6 k write calls per 100 k gemm ops unbuffered)
_SPILL_BUFFER = 1 << 20


class _Prog:
    """One (launch, program) while the trace is read: its spill batches and order."""
    __slots__ = ("batches", "n", "coord", "last_seq", "sorted")

    def __init__(self, coord: tuple[int, int, int]) -> None:
        self.batches: list[int] = []
        self.n = 0
        self.coord = coord
        self.last_seq: int | None = None
        self.sorted = True


class ProgramFeed:
    """A program's ops in ``seq`` order, built ``FEED_ROWS`` at a time: ``feed[i]`` for
    ``i`` = 0, 1, 2, ... (sequential access; an index before the current chunk fails)."""
    __slots__ = ("src", "batches", "n", "coord", "_ops", "_base", "_k")

    def __init__(self, src: OpSource, info: _Prog) -> None:
        self.src = src
        self.batches = info.batches
        self.n = info.n
        self.coord = info.coord
        self._ops: list[Op] = []
        self._base = 0
        self._k = 0
        if not info.sorted:          # rare: read it whole, stable-sorted by seq
            ops = [o for b in info.batches for o in src.records(b)]
            ops.sort(key=lambda o: o.seq)
            self._ops, self._k = ops, len(info.batches)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Op]:
        """The ops in order, built a chunk at a time as they are reached (how the PE_CPU
        reads them: C iterators, so a ``next`` per op resumes no Python frame; use either
        this or indexing on a feed, not both)."""
        return chain(self._ops,              # (a program read whole: all of it)
                     chain.from_iterable(map(self.src.records, self.batches[self._k:])))

    def __getitem__(self, i: int) -> Op:
        j = i - self._base
        while j >= len(self._ops):
            self._base += len(self._ops)
            self._ops = self.src.records(self.batches[self._k])
            self._k += 1
            j = i - self._base
        if j < 0:
            raise IndexError(f"program feed: op {i} was already consumed")
        return self._ops[j]


class OpSource:
    """A trace's ops, read once in batches (see the module docstring). ``table``: an ops
    table, or ``path``: an ``ops.parquet`` (``scan``: a batch at a time, by
    ``pyarrow.parquet.ParquetFile``)."""

    def __init__(self, table: pa.Table | None = None, path: str | os.PathLike[str] | None = None,
                 columns: list[str] | None = None, topo: Any = None,
                 meta: dict[str, Any] | None = None, check: bool = False) -> None:
        self.table, self.path, self.columns = table, path, columns
        self.n = table.num_rows if table is not None else _n_rows(path)
        self.kind_values: list[str | None] = []
        self.kinds = np.zeros(self.n, dtype=np.uint8)
        self.progs: dict[tuple[int, int], _Prog] = {}
        self.first: dict[int, int] = {}               # launch -> its first op_id
        self.host: list[Op] = []                      # h2d / d2h records, op_id order
        self.sends: dict[tuple[int, int, int, int], int] = {}   # (launch, prog, peer, ipcq_seq)
        self.send_rows: list[tuple[int, int, int]] = []        # (op_id, program, seq)
        self.recvs: list[tuple[int, int, int, int, int, int | None, int]] = []
        self.used: set[tuple[int, int, int]] = set()
        self.coder = SpillCoder()
        fd, spill = tempfile.mkstemp(prefix="kbtrace-replay-ops-", suffix=".arrow")
        self._spill = Path(spill)
        self._sink: Any = pa.OSFile(spill, "w")
        # unlinked at once where the open file can be read again by its descriptor (Linux):
        # a replay killed by a signal then leaves nothing in the temporary directory
        self._fd: int | None = fd if os.path.isdir("/proc/self/fd") else None
        if self._fd is None:
            os.close(fd)
        else:
            self._spill.unlink()
        self._gone = weakref.finalize(self, _drop, self._spill, self._fd)
        self._reader: Any = None
        self._n_spilled = 0
        self._file: Any = None
        try:
            self._read(topo, meta, check)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ reading
    def scan(self, columns: list[str], rows: int | None = None) -> Iterator[pa.RecordBatch]:
        """The trace's ``columns`` in row (= ``op_id``) order, at most ``rows`` (default
        ``READ_ROWS``) at a time. ``ParquetFile.iter_batches`` rather than a
        ``pyarrow.dataset`` scan: the same batches' contents without importing the dataset
        machinery, 45-48 ms against 81-85 for replay's three scans of a 100 k-op gemm trace
        (2026-11-28); a batch's temporaries come from Arrow's default pool, reused batch to
        batch (a 100 k-op replay's peak RSS 308 against 321 MiB)."""
        rows = rows or READ_ROWS
        if self.table is not None:
            yield from self.table.select(columns).to_batches(rows)
            return
        import pyarrow.parquet as pq
        yield from pq.ParquetFile(str(self.path)).iter_batches(
            batch_size=rows, columns=columns, use_threads=False)

    def _read(self, topo: Any, meta: dict[str, Any] | None, check: bool) -> None:
        cols = list(dict.fromkeys((*_FIELDS, *(self.columns or ()))))
        pairs = validate.IpcqPairs() if check else None
        writer = None
        at = 0
        try:
            for batch in self.scan(cols):
                n = batch.num_rows
                if not n:
                    continue
                if check:
                    validate.validate_ops(pa.Table.from_batches([batch]), topo, meta,
                                          first_row=at, n_total=self.n, pairs=pairs)
                batch = self.coder.code(batch)
                if writer is None:     # (buffered: a feed batch is ~50 buffers, a write each)
                    out = pa.BufferedOutputStream(self._sink, _SPILL_BUFFER)
                    writer = pa.ipc.new_file(out, batch.schema,
                                             options=pa.ipc.IpcWriteOptions(
                                                 compression=_SPILL_CODEC))
                self._split(batch, at, writer)
                at += n
        finally:
            if writer is not None:
                writer.close()
                out.close()
        if pairs is not None:
            pairs.check(self)
        if not self._sink.closed:
            self._sink.close()
        if writer is not None:
            self._file = pa.OSFile(str(self._spill) if self._fd is None
                                   else f"/proc/self/fd/{self._fd}")
            self._reader = pa.ipc.open_file(self._file)

    def _split(self, batch: pa.RecordBatch, at: int, writer: Any) -> None:
        n = batch.num_rows
        cols = {c: batch.column(c) for c in ("op_id", "launch", "program", "seq", "kind")}
        op_id = cols["op_id"].to_numpy(zero_copy_only=False)
        if not np.array_equal(op_id, np.arange(at, at + n)):
            raise ReplayError("ops.parquet: op_id is not dense from 0; re-capture the workload")
        kind_lut = self.coder.luts["kind"]
        kcode = cols["kind"].to_numpy(zero_copy_only=False)
        while len(self.kind_values) < len(kind_lut):       # kind codes follow the lut
            self.kind_values.append(kind_lut[len(self.kind_values)])
        if len(self.kind_values) > 255:
            raise ReplayError("ops.parquet: more than 255 op kinds; re-capture the workload")
        self.kinds[at:at + n] = kcode
        host_codes = [i for i, k in enumerate(kind_lut) if k in HOST_KINDS]
        is_host = np.isin(kcode, host_codes)
        if is_host.any():
            self.host.extend(self._to_ops(batch.take(pa.array(np.flatnonzero(is_host)))))
        rows = np.flatnonzero(~is_host)
        if not len(rows):
            return
        launch = cols["launch"].to_numpy(zero_copy_only=False)[rows].astype(np.int64)
        prog = cols["program"].to_numpy(zero_copy_only=False)[rows].astype(np.int64)
        seq = cols["seq"].to_numpy(zero_copy_only=False)[rows]
        order = np.lexsort((prog, launch))           # stable: op_id order within a program
        rows, launch, prog, seq = rows[order], launch[order], prog[order], seq[order]
        cut = np.flatnonzero((np.diff(launch) != 0) | (np.diff(prog) != 0)) + 1
        bounds = [0, *cut.tolist(), len(rows)]
        place = [batch.column(c).to_numpy(zero_copy_only=False) for c in ("sip", "cube", "pe")]
        part = batch.take(pa.array(rows))      # programs grouped, each in op_id order
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            key = (int(launch[a]), int(prog[a]))
            info = self.progs.get(key)
            if info is None:
                r0 = int(rows[a])
                info = self.progs[key] = _Prog((int(place[0][r0]), int(place[1][r0]),
                                                int(place[2][r0])))
            first = self.first.get(key[0])
            if first is None or at + int(rows[a]) < first:
                self.first[key[0]] = at + int(rows[a])
            s = seq[a:b]
            if info.sorted and ((info.last_seq is not None and s[0] < info.last_seq)
                                or (len(s) > 1 and bool((np.diff(s) < 0).any()))):
                info.sorted = False
            info.last_seq = int(s[-1])
            info.n += b - a
            for c in range(a, b, FEED_ROWS):
                info.batches.append(self._n_spilled)
                self._n_spilled += 1
                writer.write_batch(part.slice(c, min(b, c + FEED_ROWS) - c))
        self._ipcq(batch, rows, at, kind_lut, place)

    def _ipcq(self, batch: pa.RecordBatch, rows: np.ndarray, at: int, kind_lut: list[Any],
              place: list[np.ndarray]) -> None:
        """PEs used, IPCQ sends (by key) and receives of a batch's non-host rows."""
        sip, cube, pe = (p[rows] for p in place)
        self.used.update(zip(sip.tolist(), cube.tolist(), pe.tolist(), strict=True))
        kcode = self.kinds[at + rows]
        ipcq = [i for i, k in enumerate(kind_lut) if k in ("send", "recv")]
        sel = rows[np.isin(kcode, ipcq)]
        if not len(sel):
            return
        get = {c: column_pylist(pa.chunked_array([batch.column(c).take(pa.array(sel))]))
               for c in ("op_id", "kind", "launch", "program", "peer_program", "ipcq_seq",
                         "match_op_id", "seq", "peer_sip", "peer_cube", "peer_pe")}
        for i in range(len(sel)):
            oid, k = get["op_id"][i], kind_lut[get["kind"][i]]
            if get["peer_sip"][i] is not None:
                self.used.add((get["peer_sip"][i], get["peer_cube"][i], get["peer_pe"][i]))
            if k == "send":
                self.sends[(get["launch"][i], get["program"][i], get["peer_program"][i],
                            get["ipcq_seq"][i])] = oid
                self.send_rows.append((oid, get["program"][i], get["seq"][i]))
            else:
                self.recvs.append((oid, get["launch"][i], get["program"][i],
                                   get["peer_program"][i], get["ipcq_seq"][i],
                                   get["match_op_id"][i], get["seq"][i]))

    # ------------------------------------------------------------------ records
    def _to_ops(self, batch: pa.RecordBatch) -> list[Op]:
        """The records of a spill-form batch: its template ids and varying columns."""
        cols = [_tuples_of(c, None, False) if f in _LISTS else _pylist(c)
                for f in VARYING for c in (batch.column(f),)]
        ids = batch.column(TEMPLATE_ID).to_numpy(zero_copy_only=False).tolist()
        return build_ops(self.coder.templates, ids, *cols)

    def records(self, i: int) -> list[Op]:
        """The records of spill batch ``i``."""
        return self._to_ops(self._reader.get_batch(i))

    def feed(self, launch: int, program: int) -> ProgramFeed:
        return ProgramFeed(self, self.progs[(launch, program)])

    def kind(self, op_id: int) -> str | None:
        return self.kind_values[int(self.kinds[op_id])]

    def fetch(self, op_ids: list[int]) -> dict[int, Op]:
        """Records of ``op_ids`` read from the trace (for error messages: a pass over it)."""
        want = sorted(set(op_ids))
        out: dict[int, Op] = {}
        if not want:
            return out
        at = 0
        cols = list(dict.fromkeys((*_FIELDS, *(self.columns or ()))))
        for batch in self.scan(cols):
            n = batch.num_rows
            lo, hi = np.searchsorted(want, [at, at + n])
            if hi > lo:
                idx = pa.array([w - at for w in want[lo:hi]])
                for o in self._to_ops(self.coder.code(batch.take(idx))):
                    out[o.op_id] = o
            at += n
        return out

    def where(self, op_id: int) -> tuple[Any, Any] | None:
        """(src_file, src_line) of an op, when the trace has them (error messages only)."""
        if "src_line" not in (self.columns or ()):
            return None
        at = 0
        for batch in self.scan(["src_file", "src_line"]):
            if at <= op_id < at + batch.num_rows:
                return (batch.column(0)[op_id - at].as_py(), batch.column(1)[op_id - at].as_py())
            at += batch.num_rows
        return None

    def close(self) -> None:
        """Drop the spill file (idempotent)."""
        self._reader = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if not self._sink.closed:
            self._sink.close()
        self._gone()


def _drop(spill: Path, fd: int | None) -> None:
    """The spill file gone: its name (where it still has one) and its descriptor."""
    spill.unlink(missing_ok=True)
    if fd is not None:
        os.close(fd)


def _n_rows(path: Any) -> int:
    import pyarrow.parquet as pq
    return int(pq.ParquetFile(str(path)).metadata.num_rows)

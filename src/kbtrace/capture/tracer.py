"""Trace-wide capture state: op ids, the lock-step data machine, regions, the streaming op sink.

``Tracer`` is shared by every launch of one capture. ``OpSink`` streams op rows
to ``ops.parquet`` through ``BatchWriter`` in op_id order; rows are held back
only while a send in them still waits for its receive (its ``match_op_id`` is
filled in when the receive happens), so memory stays bounded by the batch size
plus the IPCQ messages in flight.
"""

from __future__ import annotations

import os
from collections import Counter
from types import SimpleNamespace
from typing import Any

from kbtrace import schema
from kbtrace._io import BatchWriter
from kbtrace.capture.executor import OP_FIELDS, Machine, Op
from kbtrace.capture.memory import MemoryImage, RegionMap

__all__ = ["Tracer", "OpSink", "addresses"]

BATCH_ROWS = 65_536


def addresses() -> Any:
    """The physical-address encoders (``kbtrace.topology.address``, ADR-0001 rev 2)."""
    from kbtrace.topology import address
    return address


class OpSink:
    """Streams ops to Parquet in op_id order, holding rows whose send is not yet matched."""

    def __init__(self, path: str | os.PathLike[str] | None, batch_rows: int | None = None) -> None:
        batch_rows = batch_rows or BATCH_ROWS
        self._bw = BatchWriter(path, schema.OPS, batch_rows=batch_rows) if path else None
        self._buf: list[Op] = []
        self._unmatched: set[int] = set()
        self._batch = batch_rows
        self.counts: Counter[str] = Counter()
        self.rows = 0
        self.kept: list[Op] | None = None if path else []

    def emit(self, op: Op) -> None:
        self._buf.append(op)
        self.counts[op.kind] += 1
        self.rows += 1
        if op.kind == "send":
            self._unmatched.add(op.op_id)
        if len(self._buf) >= self._batch:
            self._drain(final=False)

    def matched(self, send: Op) -> None:
        self._unmatched.discard(send.op_id)

    def _drain(self, final: bool) -> None:
        if not self._buf:
            return
        cut = len(self._buf)
        if self._unmatched and not final:
            cut = min(self._unmatched) - self._buf[0].op_id
        if cut <= 0:
            return
        rows, self._buf = self._buf[:cut], self._buf[cut:]
        if self._bw is None:
            assert self.kept is not None
            self.kept.extend(rows)
            return
        cols = self._bw.columns
        for i, name in enumerate(OP_FIELDS):
            col = cols[i]
            col.extend([getattr(r, name) for r in rows])
        self._bw.commit(len(rows))

    def close(self) -> None:
        self._drain(final=True)
        if self._bw is not None:
            self._bw.close()

    def abort(self) -> None:
        if self._bw is not None:
            self._bw.abort()


class Tracer:
    """Everything one capture shares across launches."""

    def __init__(self, topo: Any, sink: OpSink, golden: bool = True) -> None:
        #: execute compute ops in lock-step (fills ops.out_digest, checks references)
        self.golden = golden
        self.topo = topo
        self.params = topo.params
        self.addr = addresses()
        self.mem = MemoryImage()
        self.machine = Machine(self.mem)
        self.regions = RegionMap()
        self.sink = sink
        self.next_op = 0
        self.launches: list[SimpleNamespace] = []

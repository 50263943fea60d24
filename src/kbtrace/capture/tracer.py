"""Trace-wide capture state: op ids, the op log, memory images, the streaming op sink.

``Tracer`` is shared by every launch of one capture. The recorder appends one
compact record per op to ``Tracer.log`` (a tuple for the hot kinds load /
store / fill / dot, an ``Op`` for the rest); nothing else happens per op.

``OpSink`` drains the log in op_id (= capture) order: it expands each record to
a full ``Op`` row, runs the data executor (``Machine``) over the rows in that
order -- the golden execution that fills ``out_digest``, exactly as if it had
run in lock-step -- and streams the columns to ``ops.parquet`` through
``BatchWriter``. Rows are held back only while a send in them still waits for
its receive (its ``match_op_id`` is filled in when the receive happens), so
memory stays bounded by the batch size plus the IPCQ messages in flight.

Two memory images: ``mem`` is the executor's (initial contents + every op's
effect, advanced at drain time); ``kmem`` is the capture-time image that
``tl.load`` reads real values from (initial contents + stores of real values,
advanced as the kernels run). Compute results never need to be in ``kmem``:
whatever a pending op wrote is read back as pending.
"""

from __future__ import annotations

import gc
import operator
import os
import time
import weakref
from collections import Counter
from types import SimpleNamespace
from typing import Any

from kbtrace import schema
from kbtrace._io import BatchWriter
from kbtrace.capture._drain import Drainer, _basename
from kbtrace.capture.executor import OP_FIELDS, Machine, Op
from kbtrace.capture.image import MemoryImage
from kbtrace.capture.memory import RegionMap

__all__ = ["Tracer", "OpSink", "addresses", "expand", "STRICT"]

#: the implicit type conversions a capture may be told to refuse (``capture(strict=...)``)
STRICT = ("promote", "store")

BATCH_ROWS = 65_536
#: a drain while automatic GC is paused collects the young generation once it holds this
#: many more container objects than at the last collection: that bounds the garbage a
#: kernel may leave in reference cycles, without a collection at every drain (gemm at
#: 100 k ops drains 258 times, mostly when a PE's TCM is full; collecting at each cost
#: ~0.8 CPU us per op, as each walked the memory images' read caches)
GC_YOUNG = 500_000
_COMPUTE = frozenset(("dot", "math", "composite"))
#: an Op -> its column values in schema order (one C call per row)
_ROW = operator.attrgetter(*OP_FIELDS)
_KIND_COL = OP_FIELDS.index("kind")


def addresses() -> Any:
    """The physical-address encoders (``kbtrace.topology.address``, ADR-0001 rev 2)."""
    from kbtrace.topology import address
    return address


def expand(rec: Any) -> Op:
    """A log record -> its full ``Op`` row (records are built by ``program.Program``).

    Tuple layout: ``(op_id, kind, program, seq, file, line, *kind fields)``.
    """
    if rec.__class__ is Op:
        return rec
    op_id, kind, p, seq, file, line = rec[:6]
    op = Op(op_id=op_id, launch=p.launch, program=p.index, pid0=p.pid0, pid1=p.pid1, sip=p.sip,
            cube=p.cube, pe=p.pe, seq=seq, kind=kind, src_file=_basename(file), src_line=line,
            is_async=False)
    if kind == "load":   # src_space, src_addr, dst_addr, nbytes, geometry, dtype, deps
        _, _, _, _, _, _, space, src, dst, nbytes, geo, dtype, deps = rec
        op.__dict__.update(name="load", src_space=space, src_addr=src, dst_space="tcm",
                           dst_addr=dst, nbytes=nbytes, out_shape=geo[4], out_dtype=dtype,
                           mem_strides=geo[5], deps=deps)
    elif kind == "store":  # handle, dst_space, dst_addr, geometry
        _, _, _, _, _, _, h, space, dst, geo = rec
        op.__dict__.update(name="store", src_space=h.space, src_addr=h.addr, dst_space=space,
                           dst_addr=dst, nbytes=geo[3], out_shape=geo[4], out_dtype=h.dtype,
                           mem_strides=geo[5], deps=list(h.deps))
    elif kind == "fill":   # name, dst_addr, geometry, dtype, scalars
        _, _, _, _, _, _, name, dst, geo, dtype, scalars = rec
        op.__dict__.update(name=name, dst_space="tcm", dst_addr=dst, nbytes=geo[3],
                           out_shape=geo[4], out_dtype=dtype, scalars=scalars)
    elif kind == "dot":    # a, b, acc | None, dst_addr, nbytes, acc dtype
        _, _, _, _, _, _, a, b, acc, dst, nbytes, acc_dt = rec
        ins = (a, b) if acc is None else (a, b, acc)
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        op.__dict__.update(name="dot", dst_space="tcm", dst_addr=dst, nbytes=nbytes,
                           in_addrs=[h.addr for h in ins], in_spaces=[h.space for h in ins],
                           in_shapes=[list(h.shape) for h in ins],
                           in_dtypes=[h.dtype for h in ins], out_shape=[m, n], out_dtype=acc_dt,
                           acc_dtype=acc_dt, m=m, n=n, k=k,
                           deps=sorted({d for h in ins for d in h.deps}))
    else:
        raise AssertionError(f"unknown op record kind {kind!r}")
    return op


class OpSink:
    """Drains the op log in op_id order: expand, golden-execute, stream to Parquet."""

    def __init__(self, path: str | os.PathLike[str] | None, batch_rows: int | None = None) -> None:
        batch_rows = batch_rows or BATCH_ROWS
        self._bw = BatchWriter(path, schema.OPS, batch_rows=batch_rows) if path else None
        #: the op log (records in op_id order, not yet drained); the recorder appends to it
        self.log: list[Any] = []
        self._unmatched: set[int] = set()
        self.batch = batch_rows
        self.counts: Counter[str] = Counter()
        self.rows = 0
        #: wall-clock seconds spent draining (expansion, golden execution, Parquet), and the
        #: process's CPU seconds meanwhile
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.kept: list[Op] | None = None if path else []
        self.machine: Machine | None = None
        self.golden = True
        self._drainer: Drainer | None = None
        #: set by capture while automatic GC is paused: each drain collects the young generation
        self.collect_gc = False
        #: the tracer's registry of lazily read handles (weak references), pruned at each drain
        self.lazy: list[Any] = []
        #: (op_id, addr, nbytes) of TCM buffers whose owning handle died, in death order: from
        #: that op on nothing reads the buffer before writing it (``memory.Allocator.died``),
        #: so the golden image forgets its bytes there (``Drainer``); at 1.0 M gemm ops the
        #: image otherwise held every PE's whole TCM (512 MiB on default.yaml) as dead arrays
        self.dead: list[tuple[int, int, int]] = []

    def unmatched(self, send: Op) -> None:
        self._unmatched.add(send.op_id)

    def matched(self, send: Op) -> None:
        self._unmatched.discard(send.op_id)

    def drain(self, final: bool = False) -> None:
        buf = self.log
        if not buf:
            return
        t0, c0 = time.perf_counter(), time.process_time()
        cut = len(buf)
        if self._unmatched and not final:
            first = buf[0][0] if buf[0].__class__ is tuple else buf[0].op_id
            cut = min(self._unmatched) - first
        if cut <= 0:
            return
        recs = buf[:cut]
        del buf[:cut]
        machine, golden = self.machine, self.golden
        if self._bw is not None and machine is not None:   # row tuples, dots batched
            if self._drainer is None or self._drainer.m is not machine:
                self._drainer = Drainer(machine, golden, expand, _ROW)
            tuples = self._drainer.run(recs, self.dead)
            self.rows += len(tuples)
            cols = self._bw.columns
            by_col = list(zip(*tuples, strict=True))
            for col, vals in zip(cols, by_col, strict=True):
                col.extend(vals)
            self.counts.update(by_col[_KIND_COL])   # (a tuple: counted in C)
            del by_col
            self._bw.commit(len(tuples))
            del tuples
        else:
            self.dead.clear()     # (the image keeps dead bytes: always correct)
            rows = [expand(r) for r in recs]
            if machine is not None:
                for op, dig in zip(rows, machine.run(rows, frozenset() if golden else _COMPUTE),
                                   strict=True):
                    op.out_digest = dig
            self.counts.update(op.kind for op in rows)
            self.rows += len(rows)
            if self._bw is None:
                assert self.kept is not None
                self.kept.extend(rows)
            else:
                cols = self._bw.columns
                for col, vals in zip(cols, zip(*map(_ROW, rows), strict=True), strict=True):
                    col.extend(vals)
                self._bw.commit(len(rows))
        # the drained records and rows are freed here, inside the drain's time: a record
        # holds handles, whose deaths also tell their allocators the buffers are free
        del recs
        if self.lazy:  # forget handles that died
            self.lazy[:] = [r for r in self.lazy if (h := r()) is not None and h._lazy is not None]
        if self.collect_gc and gc.get_count()[0] >= GC_YOUNG:
            gc.collect(0)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - c0

    def close(self) -> None:
        self.drain(final=True)
        if self._bw is not None:
            self._bw.close()

    def abort(self) -> None:
        if self._bw is not None:
            self._bw.abort()


class Tracer:
    """Everything one capture shares across launches."""

    def __init__(self, topo: Any, sink: OpSink, golden: bool = True,
                 strict: frozenset[str] = frozenset()) -> None:
        #: execute compute ops (at drain time; fills ops.out_digest, checks references)
        self.golden = golden
        #: type sanitizers turned into errors: "promote" (mixed operand dtypes), "store"
        #: (tl.store of another dtype than the destination's); see ``STRICT``
        self.strict = strict
        self.topo = topo
        self.params = topo.params
        self.addr = addresses()
        self.mem = MemoryImage()
        self.kmem = MemoryImage()
        self.machine = Machine(self.mem)
        self.regions = RegionMap()
        #: host tensors (copies only; kernels never see these)
        self.host_regions = RegionMap()
        self.sink = sink
        sink.machine, sink.golden = self.machine, golden
        self.log = sink.log
        self.next_op = 0
        self.launches: list[SimpleNamespace] = []
        #: weak references to handles whose values are still to be read from ``kmem``
        self.lazy: list[weakref.ref[Any]] = sink.lazy
        #: buffers whose owners died (``OpSink.dead``), appended to by the allocators
        self.dead = sink.dead

    def release(self) -> None:
        """Free both memory images and the executor's caches once the log is drained and the
        outputs gathered: what is left of a capture (references, ``memory.parquet``) reads
        the tensors' own arrays, and on gemm at 1.0 M ops the images held ~0.7 GiB (every
        PE's TCM and the HBM tensors, twice) under the Parquet writer's peak."""
        self.mem.clear()
        self.kmem.clear()
        self.machine.clear()

    def write_initial(self, addr: int, stored: Any) -> None:
        """Initial tensor contents go into both memory images (their pages shared until
        either writes into one: ``MemoryImage.write_shared``)."""
        self.mem.write_shared(self.kmem, addr, stored)

    def kwrite(self, addr: int, stored: Any, strides: Any = None) -> None:
        """A real value written to memory during capture: first fix every pending lazy read."""
        for r in self.lazy:
            h = r()
            if h is not None and h._lazy is not None:
                h.stored()
        self.lazy.clear()
        self.kmem.write(addr, stored, strides)

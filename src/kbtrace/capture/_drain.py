"""Draining the op log: schema-order row tuples and golden execution, dots in batches.

``Drainer.run(records)`` turns one drain's records (``tracer``: a tuple for the hot kinds
load / store / fill / dot, an ``Op`` for the rest) into one row tuple each, in
``executor.OP_FIELDS`` order, with ``out_digest`` filled by the golden execution in
capture order. It is what ``tracer.expand`` + ``Machine.run`` + one attribute getter per
row computed, without an ``Op`` object per hot op, and with integer ``tl.dot`` products
run through BLAS a batch at a time:

* a hot record executes as ``Machine``'s handler for its kind does (same memory image
  calls, same cache entries), its row built directly from the record;
* an integer dot (``acc_dtype`` i32) is *deferred*: its operands are read when it is met
  (the memory image then holds what sequential execution would show it), and its product
  is computed later with the other deferred ones in one stacked matmul, in float32 or
  float64 when every partial sum is an exact integer there (``k * max|a| * max|b|`` below
  2**24 / 2**53, the bound ``executor.matmul`` checks per dot), else dot by dot through
  ``executor.matmul``. Sums, writes and digests then follow in capture order, so every
  result, memory write and digest is the one sequential execution gives;
* a pending dot's result is not in the memory image until the batch is flushed: an op
  whose read or write touches the span the pending results cover is preceded by a flush,
  except a dot whose accumulator is exactly a pending result (an accumulator chain): it
  takes that value directly; pending results never overlap one another (a dot
  whose result would overlap them flushes first). Every other op flushes first.
"""

from __future__ import annotations

import hashlib
import os
from bisect import bisect_right as _bisect_right
from operator import itemgetter
from typing import Any

import numpy as np

from kbtrace.capture.dtypes import COMPUTE, ITEMSIZE, digest, to_compute
from kbtrace.capture.executor import OP_FIELDS, Machine, _entry_absmax, matmul

__all__ = ["Drainer"]

_N8 = (None,) * 8
_N12 = (None,) * 12
_EMPTY5 = ((), (), (), (), ())
_INT_ACC = frozenset(("i32",))
_INT_IN = frozenset(("i32", "i8"))
_EXACT_F32 = 1 << 24
_EXACT_F64 = 1 << 53
_I32 = 1 << 31
_INT32 = np.dtype(np.int32)
_BASENAMES: dict[str | None, str | None] = {}
_blake2b = hashlib.blake2b
_from_bytes = int.from_bytes
_AT = itemgetter(0)


def _basename(path: str | None) -> str | None:
    b = _BASENAMES.get(path)
    if b is None and path is not None:
        if len(_BASENAMES) > 4096:
            _BASENAMES.clear()
        b = _BASENAMES[path] = os.path.basename(path)
    return b


def _head(p: Any) -> tuple[Any, ...]:
    """(launch, program, pid0, pid1, sip, cube, pe) of a program (kept on it)."""
    h = p.__dict__.get("_row_head")
    if h is None:
        h = p._row_head = (p.launch, p.index, p.pid0, p.pid1, p.sip, p.cube, p.pe)
    return h


class Drainer:
    """Row tuples and golden execution of one capture's drains (see module docstring)."""

    def __init__(self, machine: Machine, golden: bool, expand: Any, row: Any) -> None:
        self.m, self.mem, self.golden = machine, machine.mem, golden
        self._expand, self._row = expand, row
        #: deferred dots: (row index, row head, row tail, a, b, acc value | pending index
        #: | None, dst, out dtype); their results cover [_lo, _hi)
        self._pend: list[tuple[Any, ...]] = []
        self._by_dst: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._lo, self._hi = 0, 0
        self._rows: list[Any] = []
        self._dead: list[tuple[int, int, int]] = []
        self._first = self._di = 0
        #: operand signature -> a dot row's columns in_spaces .. k (``_dot_columns``)
        self._dot_const: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        assert len(OP_FIELDS) == 44

    def run(self, recs: list[Any], dead: list[tuple[int, int, int]] | None = None
            ) -> list[tuple[Any, ...]]:
        """Row tuples of ``recs`` (consecutive op_ids). ``dead``: (op_id, addr, nbytes) of
        buffers nothing reads from that op on before writing them, in op_id order (none
        before the first record's): the image forgets each one's bytes right before that
        op (``MemoryImage.drop``), and the entries used are removed from the list."""
        rows: list[Any] = [None] * len(recs)
        self._rows = rows
        load, store, fill, dot = self._load, self._store, self._fill, self._dot
        first = (recs[0][0] if recs[0].__class__ is tuple else recs[0].op_id) if recs else 0
        self._dead, self._first, self._di = dead or [], first, 0
        nxt = self._drop_due(first)
        with np.errstate(all="ignore"):
            for i, r in enumerate(recs):
                if i == nxt:
                    nxt = self._drop_due(first + i)
                if r.__class__ is tuple:
                    kind = r[1]
                    if kind == "load":
                        rows[i] = load(r)
                    elif kind == "dot":
                        dot(r, i)
                    elif kind == "store":
                        rows[i] = store(r)
                    else:
                        rows[i] = fill(r)
                else:
                    if self._pend:
                        self.flush()
                    rows[i] = self._other(r)
            if self._pend:
                self.flush()
            self._drop_due(first + len(recs))
        del self._dead[:self._di]
        self._rows, self._dead = [], []
        return rows

    def _drop_due(self, op_id: int) -> int:
        """Forget the dead buffers due at ``op_id`` (before it runs); the record index of the
        next one due (-1: none in this drain)."""
        dead, i = self._dead, self._di
        n = len(dead)
        j = _bisect_right(dead, op_id, i, n, key=_AT)  # (``dead`` is in op_id order)
        if j > i:
            # (due earlier than ``op_id`` never happens, ``run``'s docstring; kept then, as is
            # safe: a later op may have written the span again)
            spans = [(a, nb) for at, a, nb in dead[i:j] if at == op_id]
            if self._pend:
                lo, hi = self._lo, self._hi
                for a, nb in spans:
                    if a < hi and a + nb > lo:      # (``_touches``)
                        self.flush()
                        break
            self.mem.drop(spans)
        self._di = j
        return dead[j][0] - self._first if j < n else -1

    # ------------------------------------------------------------------ hazards
    def _touches(self, addr: int, nbytes: int) -> bool:
        return addr < self._hi and addr + nbytes > self._lo

    def _other(self, op: Any) -> tuple[Any, ...]:
        kind = op.kind
        if kind in ("dot", "math", "composite") and not self.golden:
            op.out_digest = None
        else:
            op.out_digest = self.m.step(op)[1]
        return self._row(op)

    # ------------------------------------------------------------------ hot kinds
    def _load(self, r: tuple[Any, ...]) -> tuple[Any, ...]:
        op_id, _, p, seq, file, line, space, src, dst, nbytes, geo, dtype, deps = r
        if self._pend:
            lo, hi = self._lo, self._hi     # (``_touches``, inline)
            if (src < hi and src + geo[2] > lo) or (dst < hi and dst + nbytes > lo):
                self.flush()
        mem = self.mem
        e = mem.cached_read(src, geo[0], dtype, geo[6])
        dig = e[1]
        if dig is None:
            dig = e[1] = digest(e[0])
            mem.note_digest((src, geo[0], dtype, geo[6]), e)
        mem.write_entry(dst, dtype, e)
        return (op_id, *_head(p), seq, "load", "load", False, space, src, "tcm", dst, nbytes,
                *_EMPTY5, geo[4], dtype, *_N12,
                deps, None, None, _basename(file), line, None, dig, geo[5])

    def _store(self, r: tuple[Any, ...]) -> tuple[Any, ...]:
        op_id, _, p, seq, file, line, h, space, dst, geo = r
        hdt = h.dtype
        if self._pend and (self._touches(h.addr, geo[3]) or self._touches(dst, geo[2])):
            self.flush()
        mem = self.mem
        e = mem.cached_read(h.addr, geo[0], hdt)
        mem.write(dst, e[0], geo[6])
        if geo[6] is None:
            mem.remember(dst, hdt, e)
        dig = e[1]
        if dig is None:
            dig = e[1] = digest(e[0])
        return (op_id, *_head(p), seq, "store", "store", False, h.space, h.addr, space, dst,
                geo[3], *_EMPTY5, geo[4], hdt, *_N12,
                list(h.deps), None, None, _basename(file), line, None, dig, geo[5])

    def _fill(self, r: tuple[Any, ...]) -> tuple[Any, ...]:
        op_id, _, p, seq, file, line, name, dst, geo, dtype, scalars = r
        if self._pend and self._touches(dst, geo[3]):
            self.flush()
        e = self.m.fill_entry(name, geo[4], dtype, scalars)
        self.mem.write_entry(dst, dtype, e)
        dig = e[1]
        if dig is None:
            dig = e[1] = digest(e[0])
        return (op_id, *_head(p), seq, "fill", name, False, None, None, "tcm", dst, geo[3],
                (), (), (), (), scalars, geo[4], dtype, *_N12,
                (), None, None, _basename(file), line, None, dig, ())

    def _dot(self, r: tuple[Any, ...], i: int) -> None:
        op_id, _, p, seq, file, line, a, b, acc, dst, nbytes, acc_dt = r
        ia, ib = a.op_id, b.op_id
        if acc is None:
            ins: tuple[Any, ...] = (a, b)
            key: tuple[Any, ...] = (a.shape, a.dtype, a.space, b.shape, b.dtype, b.space, acc_dt)
            addrs = [a.addr, b.addr]
            deps = (sorted({ia, ib}) if ia is not None and ib is not None
                    else sorted({d for h in ins for d in h.deps}))
        else:
            ins = (a, b, acc)
            key = (a.shape, a.dtype, a.space, b.shape, b.dtype, b.space, acc_dt, acc.shape,
                   acc.dtype, acc.space)
            addrs = [a.addr, b.addr, acc.addr]
            ic = acc.op_id
            deps = (sorted({ia, ib, ic}) if ia is not None and ib is not None and ic is not None
                    else sorted({d for h in ins for d in h.deps}))
        const = self._dot_const.get(key)
        if const is None:
            const = self._dot_const[key] = self._dot_columns(ins, acc_dt)
        m, n, k = const[7], const[8], const[9]
        head = (op_id, *_head(p), seq, "dot", "dot", False, None, None, "tcm", dst, nbytes,
                addrs, *const, *_N8, deps, None, None, _basename(file), line, None)
        rows = self._rows
        if not self.golden:
            rows[i] = head + (None, ())
            return
        if (acc_dt not in _INT_ACC or a.dtype not in _INT_IN or b.dtype not in _INT_IN
                or not (m and k and n)):
            if self._pend:
                self.flush()
            op = self._expand(r)
            rows[i] = head + (self.m.step(op)[1], ())
            return
        pend = self._pend
        if pend:
            lo, hi = self._lo, self._hi
            aa, ba = a.addr, b.addr
            if ((dst < hi and dst + nbytes > lo)
                    or (aa < hi and aa + m * k * ITEMSIZE[a.dtype] > lo)
                    or (ba < hi and ba + k * n * ITEMSIZE[b.dtype] > lo)
                    or (acc is not None and acc.addr < hi and acc.addr + nbytes > lo
                        and self._chained(acc) is None)):
                self.flush()        # (only the accumulator may be a pending result)
                pend = self._pend
        acc_np = COMPUTE[acc_dt]
        # a and b do not touch the pending results (else the batch was flushed just now),
        # so neither is one of them
        av, am = self._value(a, acc_np)
        bv, bm = self._value(b, acc_np)
        cv = None if acc is None else self._operand(acc, acc_np)
        if not pend:
            self._lo, self._hi = dst, dst + nbytes
        else:
            self._lo, self._hi = min(self._lo, dst), max(self._hi, dst + nbytes)
        self._by_dst[dst] = (len(pend), (m, n))
        pend.append((i, head, av, bv, cv, dst, acc_dt, am, bm))

    def _dot_columns(self, ins: tuple[Any, ...], acc_dt: str) -> tuple[Any, ...]:
        """A dot row's columns from ``in_spaces`` to ``k`` that follow from its operands'
        shapes, dtypes and spaces (shared by every dot of that signature: the Parquet
        writer reads the lists, nothing modifies them)."""
        if len(self._dot_const) > 4096:
            self._dot_const.clear()
        a, b = ins[0], ins[1]
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        return ([h.space for h in ins], [list(h.shape) for h in ins], [h.dtype for h in ins],
                (), [m, n], acc_dt, acc_dt, m, n, k)

    def _chained(self, h: Any) -> int | None:
        """Index of the pending dot whose result ``h`` is exactly (same span, shape, dtype)."""
        hit = self._by_dst.get(h.addr)
        if hit is not None and hit[1] == h.shape and self._pend[hit[0]][6] == h.dtype:
            return hit[0]
        return None

    def _operand(self, h: Any, acc_np: Any) -> Any:
        """The operand's compute value (as ``Machine._operand`` then ``astype(acc)``), or the
        index of the pending dot whose result it is exactly (hazards are checked before)."""
        if self._pend:
            j = self._chained(h)
            if j is not None:
                return j
        return self._value(h, acc_np)[0]

    def _value(self, h: Any, acc_np: Any) -> tuple[Any, int]:
        """The compute value of ``h``, read from memory, as ``acc_np`` (``_operand``'s read),
        and its ``max|x|`` (kept in the cache entry: a tile read by many dots is scanned once)."""
        e = self.mem.cached_read(h.addr, h.shape, h.dtype)
        c = e[2]
        if c is None:
            c = e[2] = to_compute(e[0], h.dtype)
            c.flags.writeable = False
        return c.astype(acc_np, copy=False), _entry_absmax(e)

    def flush(self) -> None:
        """Compute the pending dots' products (stacked), then sums, writes and digests in
        capture order."""
        pend = self._pend
        self._pend = []
        self._by_dst = {}
        self._lo = self._hi = 0
        groups: dict[tuple[Any, ...], list[int]] = {}
        for j, q in enumerate(pend):
            groups.setdefault((q[2].shape, q[3].shape, q[2].dtype), []).append(j)
        prods: list[Any] = [None] * len(pend)
        for idx in groups.values():
            q0 = pend[idx[0]]
            bound = (max(pend[j][7] for j in idx) * max(pend[j][8] for j in idx)
                     * q0[2].shape[-1])
            if bound < _EXACT_F64:
                # (the operands stacked straight into the float type: one pass over them)
                f = np.float32 if bound < _EXACT_F32 else np.float64
                out = (np.stack([pend[j][2] for j in idx], dtype=f, casting="unsafe")
                       @ np.stack([pend[j][3] for j in idx], dtype=f, casting="unsafe"))
                dt = q0[2].dtype
                out = (out.astype(_INT32) if bound < _I32 and dt == _INT32
                       else out.astype(np.int64).astype(dt))   # (int32 sums: no wrap)
                for t, j in enumerate(idx):
                    prods[j] = out[t]
            else:
                for j in idx:
                    prods[j] = matmul(pend[j][2], pend[j][3])
        mem, rows = self.mem, self._rows
        results: list[Any] = [None] * len(pend)
        for j, (i, head, _a, _b, cv, dst, acc_dt, _am, _bm) in enumerate(pend):
            out = prods[j]
            if cv is not None:
                out = out + (results[cv] if cv.__class__ is int else cv)
            elif out.base is not None:  # a view of the stacked product: kept (dirty, cached)
                out = out.copy()        # alone, it would keep the whole batch alive
            results[j] = out
            e = [out, None, None]
            mem.write_entry(dst, acc_dt, e)
            # (``digest``, inlined for a C-contiguous 2-d result: its buffer is hashed)
            dig = e[1] = (_from_bytes(_blake2b(out, digest_size=8).digest(), "little")
                          if out.flags.c_contiguous else digest(out))
            rows[i] = head + (dig, ())

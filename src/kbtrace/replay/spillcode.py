"""Trace rows coded for replay's spill file, and the spill's columns as Python values.

An op's fields fall in two groups (``ops.TEMPLATE`` / ``ops.VARYING``). The *template*
fields -- kind, name, spaces, shapes, dtypes, GEMM sizes, ... -- repeat from op to op (a
kernel issues the same few calls over and over: gemm on ``default.yaml`` has five
combinations in 100 k ops). ``SpillCoder.code`` gives each row the id of its combination of
template values, found with Arrow and numpy a read batch at a time; the combination's values
are built once, as Python objects, into ``SpillCoder.templates``. The spill file then holds
the varying fields, the kind's code and that id (``TEMPLATE_ID``), and a record is the
template's tuple plus its varying values (``ops.build_ops``): no per-op conversion of the
template columns, which were ~60% of building the records (issue 22).

Exactness: every template value is the one the column-wise conversion (``pylist``,
``tuples_of``) gives for a row that has it, and rows share a template only when all their
template values are equal. Scalar and string columns are coded through their Arrow
dictionary (one dictionary per column, as the spill's strings were before); a list column by
sorting rows of (length, items) -- strings as dictionary codes, a nested list's inner lists
as their own groups -- or by the ``repr`` of each row's Python value where the column holds
nulls below its rows. The combination of a row's codes is one int64 (``_groups``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace.replay.ops import TEMPLATE, _tuples

__all__ = ["SpillCoder", "TEMPLATE_ID", "pylist", "tuples_of"]

#: the spill's column of template ids
TEMPLATE_ID = "_template"
#: template fields coded through their Arrow dictionary (the string ones, and scalars)
_SCALARS = tuple(f for f in TEMPLATE if f not in ("in_spaces", "in_shapes", "in_dtypes",
                                                   "out_shape"))
_LIST_FIELDS = {"in_spaces": False, "in_shapes": True, "in_dtypes": False, "out_shape": False}


class SpillCoder:
    """The codes and templates of one replay's trace (kept for the whole replay)."""

    def __init__(self) -> None:
        #: per template field: code -> value (``None`` for a null, code -1, at the end)
        self.luts: dict[str, list[Any]] = {f: [] for f in TEMPLATE}
        self._ids: dict[str, dict[Any, int]] = {f: {} for f in TEMPLATE}
        #: template id -> the values of ``ops.TEMPLATE``, in that order
        self.templates: list[tuple[Any, ...]] = []
        self._tids: dict[tuple[int, ...], int] = {}

    def code(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``batch`` (trace columns) in spill form: its other columns as they are, ``kind`` as
        codes into ``luts["kind"]`` and ``TEMPLATE_ID``, without the other template fields."""
        n = batch.num_rows
        codes = np.empty((len(TEMPLATE), n), dtype=np.int64)
        for j, f in enumerate(TEMPLATE):
            col = batch.column(f)
            codes[j] = self._list(f, col) if f in _LIST_FIELDS else self._scalar(f, col)
        names, arrays = [], []
        for name, col in zip(batch.schema.names, batch.columns, strict=True):
            if name == "kind":
                col = pa.array(codes[TEMPLATE.index("kind")], pa.int32())
            elif name in self.luts:
                continue
            names.append(name)
            arrays.append(col)
        names.append(TEMPLATE_ID)
        arrays.append(pa.array(self._templates(codes), pa.int32()))
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def _scalar(self, f: str, col: pa.Array) -> np.ndarray:
        """Codes of a string / integer / boolean column (-1: null)."""
        if not pa.types.is_dictionary(col.type):
            col = pc.dictionary_encode(col)
        local = col.dictionary.to_pylist()
        ids, lut = self._ids[f], self.luts[f]
        remap = np.empty(len(local) + 1, dtype=np.int64)
        for j, v in enumerate(local):
            c = ids.get(v)
            if c is None:
                c = ids[v] = len(lut)
                lut.append(v)
            remap[j] = c
        remap[-1] = -1
        return remap[pc.fill_null(col.indices, -1).to_numpy(zero_copy_only=False)]

    def _list(self, f: str, col: pa.Array) -> np.ndarray:
        """Codes of a list column, one per distinct value (built from its first row by
        ``tuples_of``, and compared as that value)."""
        nested = _LIST_FIELDS[f]
        inv, first = _list_groups(col, nested)
        ids, lut = self._ids[f], self.luts[f]
        remap = np.empty(len(first), dtype=np.int64)
        for j, r in enumerate(first.tolist()):
            v = tuples_of(col.take(pa.array([r])), None, nested)[0]   # (take: compact)
            c = ids.get(v)
            if c is None:
                c = ids[v] = len(lut)
                lut.append(v)
            remap[j] = c
        return remap[inv]

    def _templates(self, codes: np.ndarray) -> np.ndarray:
        """Each row's template id (``codes``: one row of field codes per template field)."""
        if not codes.shape[1]:
            return np.zeros(0, dtype=np.int32)
        inv, first = _groups(list(codes))
        tid = np.empty(len(first), dtype=np.int32)
        for u, r in enumerate(first.tolist()):
            sig = tuple(codes[:, r].tolist())
            t = self._tids.get(sig)
            if t is None:
                t = self._tids[sig] = len(self.templates)
                self.templates.append(tuple(self.luts[f][c] if c >= 0 else None
                                            for f, c in zip(TEMPLATE, sig, strict=True)))
            tid[u] = t
        return tid[inv.reshape(-1)]


def _list_groups(col: pa.Array, nested: bool) -> tuple[np.ndarray, np.ndarray]:
    """(per row the index of its value among the column's distinct ones, each one's first
    row): rows of equal values alike, found by sorting rows of (length, items...) (strings
    as their dictionary codes; nested, the inner lists as their own groups). Where the
    column has nulls below its rows, or types other than integers and strings, by the
    ``repr`` of each row's Python value."""
    ok = pa.types.is_list(col.type)
    flat = pc.list_flatten(col) if ok else col
    ok = ok and (not nested or pa.types.is_list(flat.type))
    inner = pc.list_flatten(flat) if ok and nested else flat
    text = ok and (pa.types.is_string(inner.type) or pa.types.is_large_string(inner.type))
    if (not ok or not (text or pa.types.is_integer(inner.type))
            or col.null_count or flat.null_count or inner.null_count):
        keys = pc.dictionary_encode(pa.array([repr(v) for v in col.to_pylist()], pa.string()))
        idx = keys.indices.to_numpy(zero_copy_only=False)
        _, first = np.unique(idx, return_index=True)          # every code occurs
        return idx, first
    if text:
        items = pc.dictionary_encode(inner).indices.to_numpy(zero_copy_only=False)
    else:
        items = inner.to_numpy(zero_copy_only=False)
    items = items.astype(np.int64, copy=False) if items.dtype != np.uint64 \
        else items.view(np.int64)
    if nested:
        items, _ = _rows_groups(flat, items)
    return _rows_groups(col, items)


def _rows_groups(lists: pa.Array, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_list_groups`` of a list array without nulls whose flattened items are ``items``."""
    off = lists.offsets.to_numpy().astype(np.int64)
    off -= off[0]
    n = len(lists)
    lens = np.diff(off)
    width = int(lens.max()) if n else 0
    cols = [lens]
    if width:
        m = np.zeros((width, n), dtype=np.int64)     # item j of each row (0 past its end)
        row = np.repeat(np.arange(n), lens)
        m[np.arange(len(items)) - off[row], row] = items
        cols += list(m)
    return _groups(cols)


def _groups(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(per row its group, each group's first row) of the rows of the equal-length integer
    columns ``cols``: rows equal in every column are one group. The columns are combined
    into one int64 key (mixed radix; renumbered densely where it would overflow)."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    if not len(key):
        return key, key
    span = 1
    for c in cols:
        lo, hi = int(c.min()), int(c.max())
        if hi - lo < 1 << 20:
            c, m = c - lo, hi - lo + 1
        else:
            u, c = np.unique(c, return_inverse=True)
            c, m = c.reshape(-1), len(u)
        if span * m >= 1 << 62:
            u, key = np.unique(key, return_inverse=True)
            key, span = key.reshape(-1), len(u)
        key = key * m + c
        span *= m
    n = len(key)
    if span > 4 * n + 1024:
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        return inv.reshape(-1), first
    seen = np.zeros(span, dtype=bool)       # a narrow key: ranked by counting, not sorting
    seen[key] = True                        # (np.unique's groups, ~5x faster on a batch)
    inv = (np.cumsum(seen) - 1)[key]
    first = np.full(int(np.count_nonzero(seen)), n, dtype=np.int64)
    np.minimum.at(first, inv, np.arange(n))
    return inv, first


# ------------------------------------------------------------------ columns as Python values
def _valid(arr: pa.Array) -> np.ndarray | None:
    """Per row of ``arr``, whether it is not null (None: no nulls)."""
    if not arr.null_count:
        return None
    bits = np.frombuffer(arr.buffers()[0], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[arr.offset:arr.offset + len(arr)].astype(bool)


def pylist(arr: pa.Array) -> list[Any]:
    """``arr.to_pylist()`` of a spill column that is not a list: integers, booleans or strings,
    read through numpy (no Arrow scalar per value, no compute call per column: a feed batch
    has few rows, so a call's fixed cost counted). Nulls are None."""
    n = len(arr)
    if arr.null_count == n:
        return [None] * n
    t = arr.type
    if pa.types.is_integer(t):
        dt = np.dtype(t.to_pandas_dtype())
        vals = np.frombuffer(arr.buffers()[1], dtype=dt, count=n,
                             offset=arr.offset * dt.itemsize).tolist()
    elif pa.types.is_boolean(t) and not arr.null_count:
        return arr.to_numpy(zero_copy_only=False).tolist()
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        return arr.to_numpy(zero_copy_only=False).tolist()       # (nulls come out None)
    else:
        return arr.to_pylist()
    ok = _valid(arr)
    if ok is not None:
        for i in np.flatnonzero(~ok).tolist():
            vals[i] = None
    return vals


def tuples_of(arr: pa.Array, memo: dict[tuple[Any, ...], tuple[Any, ...]] | None,
              nested: bool) -> list[Any]:
    """``ops._tuples(arr.to_pylist(), memo, nested)`` of a list column, built from its offsets
    and its values' ``pylist`` (``nested``: a list of lists, whose inner lists become tuples,
    null ones None)."""
    n = len(arr)
    if arr.null_count == n:
        vals: list[Any] = [None] * n
        return _tuples(vals, memo, nested)
    if not pa.types.is_list(arr.type):
        return _tuples(arr.to_pylist(), memo, nested)
    child = arr.values
    if nested:
        if not pa.types.is_list(child.type):
            return _tuples(arr.to_pylist(), memo, nested)
        inner = pylist(child.values)
        io = child.offsets.to_numpy().tolist()
        items: list[Any] = [tuple(inner[a:b]) for a, b in zip(io, io[1:], strict=False)]
        ok = _valid(child)
        if ok is not None:
            for i in np.flatnonzero(~ok).tolist():
                items[i] = None
    else:
        items = pylist(child)
    off = arr.offsets.to_numpy().tolist()
    out = [tuple(items[a:b]) for a, b in zip(off, off[1:], strict=False)]
    ok = _valid(arr)
    if ok is not None:
        for i in np.flatnonzero(~ok).tolist():
            out[i] = ()
    if memo is not None:
        out = [memo.setdefault(t, t) for t in out]
    return out

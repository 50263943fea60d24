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

Exactness: every template value is the one the column-wise conversion (``_pylist``,
``_tuples_of``) gives for a row that has it. String and scalar columns are coded through
their Arrow dictionary (as before, one dictionary per column); a list column through a text
key per row (its length, then its items) that is one-to-one with its value, or through
``repr`` of its Python value where the column holds nulls or a string with the key's
separator.
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
_SEP = "\x1f"          # between a string list's items in its key


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
        """Codes of a list column; a new value is built from its first row by ``tuples_of``."""
        keys = pc.dictionary_encode(_list_keys(col, _LIST_FIELDS[f]))
        idx = keys.indices.to_numpy(zero_copy_only=False)
        local = keys.dictionary.to_pylist()
        _, first = np.unique(idx, return_index=True)     # every code occurs: first[code]
        ids, lut = self._ids[f], self.luts[f]
        remap = np.empty(len(local), dtype=np.int64)
        for j, key in enumerate(local):
            c = ids.get(key)
            if c is None:
                c = ids[key] = len(lut)
                row = col.take(pa.array([first[j]]))     # (compact: not the whole child)
                lut.append(tuples_of(row, None, _LIST_FIELDS[f])[0])
            remap[j] = c
        return remap[idx]

    def _templates(self, codes: np.ndarray) -> np.ndarray:
        """Each row's template id (``codes``: one row of field codes per template field)."""
        n = codes.shape[1]
        if not n:
            return np.zeros(0, dtype=np.int32)
        key = np.zeros(n, dtype=np.int64)
        span = 1
        for row in codes:                    # mixed radix while it fits in 62 bits, else
            m = int(row.max()) + 2           # renumbered (dense) first
            if span * m >= 1 << 62:
                _, key = np.unique(key, return_inverse=True)
                span = int(key.max()) + 1
            key = key * m + (row + 1)
            span *= m
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
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


def _list_keys(col: pa.Array, nested: bool) -> pa.Array:
    """A text key per row of a list column, equal for two rows exactly when their values are
    (``"2:32,64"``; nested: ``"2:2:32,64|2:64,32"``); ``repr`` of each row's Python value where
    the column has nulls below its rows or a string item holds the separator."""
    ok = pa.types.is_list(col.type)
    flat = pc.list_flatten(col) if ok else col
    ok = ok and (not nested or pa.types.is_list(flat.type))
    inner = pc.list_flatten(flat) if ok and nested else flat
    text = ok and pa.types.is_string(inner.type)
    if (not ok or not (text or pa.types.is_integer(inner.type))
            or col.null_count or flat.null_count or inner.null_count
            or (text and len(inner) and pc.any(pc.match_substring(inner, _SEP)).as_py())):
        return pa.array([repr(v) for v in col.to_pylist()], pa.string())
    if nested:
        return _joined(_joined(inner, flat, ","), col, "|")
    return _joined(flat, col, _SEP if text else ",")


def _joined(items: pa.Array, lists: pa.Array, sep: str) -> pa.Array:
    """``"<length>:<items joined by sep>"`` per list of ``lists`` (whose values are ``items``,
    re-wrapped; no nulls; strings or integers)."""
    off = lists.offsets.to_numpy()
    wrapped = pa.ListArray.from_arrays(pa.array(off - off[0], pa.int32()),
                                       items if pa.types.is_string(items.type)
                                       else pc.cast(items, pa.string()))
    n = pc.cast(pc.list_value_length(lists), pa.string())
    return pc.binary_join_element_wise(n, pc.binary_join(wrapped, sep), ":")


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

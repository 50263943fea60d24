"""Where a written buffer's bytes die in a given execution order, so the executor's image
can forget them (``MemoryImage.drop``): verify's flat memory (issue 22, target 3).

Capture learns a TCM buffer is dead from its allocator (``Tracer.dead``); verify runs the
ops in the replay's order from the trace alone, so it finds the same from the ops' memory
accesses, with numpy over the columns (what ``executor.Machine`` reads and writes):

* ``accesses(batch)``: every access of a batch of ``ops.parquet`` rows as arrays (op_id,
  address, bytes spanned, write?, dirty write?). A *dirty* write is a contiguous result the
  image keeps as an array (``write_entry``: load, h2d, fill, math, dot, composite, recv
  results); a store's (or d2h's) write and every read count by the bytes they span (a
  strided tile: its first to last element).
* ``last_reads(acc, pos)``: the (position, address) of the last tile read (a load's or
  h2d's) at each address: after it the image's read cache may forget what it keeps for
  that address (``MemoryImage.forget_reads_at``; any later read there reads the pages
  again, so this is never wrong, only slower where other ops read the same tiles).
* ``drops(acc, pos, keep)``: the (position, address, bytes) at which a dirty write's bytes
  are dead. Only *slots* count: spans that no other distinct access overlaps (so every
  access touching a slot's bytes is a whole-slot read or write) and that overlap no
  ``keep`` span (the outputs, read once the ops ran). In execution order, a slot's write
  is dead after its last read before the next write (after the write itself if none reads
  it; never when the op of that last read writes the slot again: the write replaces it).
  A read precedes the same op's write. Any other span keeps its bytes (always correct).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace.capture.dtypes import ITEMSIZE

__all__ = ["accesses", "drops", "last_reads", "ACCESS_COLUMNS"]

#: the ops.parquet columns ``accesses`` reads
ACCESS_COLUMNS = ("op_id", "kind", "src_addr", "dst_addr", "in_addrs", "in_shapes", "in_dtypes",
                  "out_shape", "out_dtype", "mem_strides")
_DIRTY = ("load", "h2d", "fill", "math", "dot", "composite", "recv")
_STORE = ("store", "d2h")
_TILE_READ = ("load", "h2d")
_WHOLE_READ = ("store", "d2h", "send")
_COMPUTE = ("math", "dot", "composite")


def _mask(col: Any, kinds: tuple[str, ...]) -> np.ndarray:
    return np.asarray(pc.is_in(col.cast(pa.string()), pa.array(kinds)).fill_null(False)
                      .to_numpy(zero_copy_only=False), dtype=bool)


def _ints(col: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _itemsize(col: Any) -> np.ndarray:
    """Bytes per element of a dtype column (0 for null or unknown)."""
    vals = col.cast(pa.string())
    out = np.zeros(len(vals), dtype=np.int64)
    for name, size in ITEMSIZE.items():
        out[np.asarray(pc.equal(vals, name).fill_null(False).to_numpy(zero_copy_only=False),
                       dtype=bool)] = size
    return out


def _per_list(lists: Any, how: str, strides: Any = None) -> np.ndarray:
    """Per list of ints: the product of its values (``prod``; 1 when empty), or with the
    equally long ``strides`` lists, the elements a strided view spans (``span``: 1 + sum of
    (dim - 1) * stride, 0 if a dim is 0; the product where there are no strides)."""
    arr = lists.combine_chunks() if hasattr(lists, "combine_chunks") else lists
    n = len(arr)
    lens = np.asarray(pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False),
                      dtype=np.int64)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    vals = _ints(pc.list_flatten(arr))
    if n and (lens == lens[0]).all():      # (one rank throughout: no per-list loop)
        prod = vals.reshape(n, int(lens[0])).prod(axis=1)
        parent = None
    else:
        parent = np.repeat(np.arange(n), lens)
        prod = np.ones(n, dtype=np.int64)
        if len(vals):
            np.multiply.at(prod, parent, vals)
    if how == "prod":
        return prod
    if parent is None:
        parent = np.repeat(np.arange(n), lens)
    st = strides.combine_chunks() if hasattr(strides, "combine_chunks") else strides
    slens = np.asarray(pc.fill_null(pc.list_value_length(st), 0).to_numpy(zero_copy_only=False),
                       dtype=np.int64)
    has = (slens > 0) & (slens == lens)
    svals = _ints(pc.list_flatten(st))
    span = prod.copy()
    sel = has[parent]
    if sel.any():
        part = np.zeros(n, dtype=np.int64)
        np.add.at(part, parent[sel], (vals[sel] - 1) * svals[np.repeat(has, slens)])
        span[has] = np.where(prod[has] == 0, 0, 1 + part[has])
    return span


def accesses(t: pa.Table) -> dict[str, np.ndarray]:
    """Every memory access of the ops in ``t`` (``ACCESS_COLUMNS``): arrays ``op_id``,
    ``addr``, ``nbytes``, ``write``, ``dirty`` (module docstring) and ``tile`` (a load's or
    h2d's read); empty spans left out."""
    kind = t.column("kind")
    op_id = _ints(t.column("op_id"))
    src, dst = _ints(t.column("src_addr")), _ints(t.column("dst_addr"))
    isz = _itemsize(t.column("out_dtype"))
    whole = _per_list(t.column("out_shape"), "prod") * isz
    tile = _per_list(t.column("out_shape"), "span", t.column("mem_strides")) * isz
    parts = []

    def add(m: np.ndarray, ids: np.ndarray, addr: np.ndarray, nb: np.ndarray, write: bool,
            dirty: bool, tiled: bool = False) -> None:
        k = int(m.sum())
        parts.append((ids[m], addr[m], nb[m], np.full(k, write), np.full(k, dirty),
                      np.full(k, tiled)))

    add(_mask(kind, _DIRTY), op_id, dst, whole, True, True)
    add(_mask(kind, _STORE), op_id, dst, tile, True, False)
    add(_mask(kind, _TILE_READ), op_id, src, tile, False, False, True)
    add(_mask(kind, _WHOLE_READ), op_id, src, whole, False, False)
    comp = _mask(kind, _COMPUTE)
    if comp.any():
        ct = t.filter(pa.array(comp))
        addrs = ct.column("in_addrs").combine_chunks()
        shapes = pc.list_flatten(ct.column("in_shapes").combine_chunks())
        dts = pc.list_flatten(ct.column("in_dtypes").combine_chunks())
        lens = np.asarray(pc.fill_null(pc.list_value_length(addrs), 0)
                          .to_numpy(zero_copy_only=False), dtype=np.int64)
        ids = np.repeat(op_id[comp], lens)
        nb = _per_list(shapes, "prod") * _itemsize(dts)
        add(np.ones(len(ids), dtype=bool), ids, _ints(pc.list_flatten(addrs)), nb, False, False)
    cols = [np.concatenate([p[i] for p in parts]) for i in range(len(_NAMES))]
    keep = cols[2] > 0
    return {k: c[keep] for k, c in zip(_NAMES, cols, strict=True)}


_NAMES = ("op_id", "addr", "nbytes", "write", "dirty", "tile")


def concat(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``accesses`` of several batches as one."""
    if not batches:
        return {n: np.zeros(0, dtype=np.int64 if n in ("op_id", "addr", "nbytes") else bool)
                for n in _NAMES}
    return {n: np.concatenate([b[n] for b in batches]) for n in _NAMES}


def drops(acc: dict[str, np.ndarray], pos: np.ndarray,
          keep: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positions, addresses, bytes) of the dead dirty writes, by position (module
    docstring). ``pos``: execution position of each op_id; ``keep``: (addr, nbytes) spans
    whose bytes are read after the ops (never dropped). Empties ``acc`` as it goes (its
    arrays are the largest thing verify holds before the ops run: freed step by step)."""
    addr, nb = acc.pop("addr"), acc.pop("nbytes")
    acc.pop("tile", None)
    # distinct spans, and each access's (by start, then length: by start, then end)
    o = np.lexsort((nb, addr))
    a_s, n_s = addr[o], nb[o]
    del addr, nb
    new = np.ones(len(o), dtype=bool)
    new[1:] = (a_s[1:] != a_s[:-1]) | (n_s[1:] != n_s[:-1])
    sa, se = a_s[new], a_s[new] + n_s[new]      # distinct spans, by (start, end)
    del a_s, n_s
    slot = np.empty(len(o), dtype=np.int32)
    slot[o] = np.cumsum(new, dtype=np.int32) - 1
    del o, new
    # a slot overlaps no other distinct span
    clean = np.ones(len(sa), dtype=bool)
    if len(sa) > 1:
        reach = np.maximum.accumulate(se)   # the furthest end of the spans up to each
        clean[1:] &= sa[1:] >= reach[:-1]
        clean[:-1] &= sa[1:] >= se[:-1]
        del reach
    if keep and len(sa):
        ka = np.array([k[0] for k in keep], dtype=np.int64)
        ke = ka + np.array([k[1] for k in keep], dtype=np.int64)
        ko = np.argsort(ka, kind="stable")
        ka, ke = ka[ko], np.maximum.accumulate(ke[ko])
        i = np.searchsorted(ka, se, side="left") - 1     # keep spans starting before se
        clean &= ~((i >= 0) & (ke[np.maximum(i, 0)] > sa))
    use = clean[slot]
    s = slot[use]
    del slot
    p = pos[acc.pop("op_id")[use]]
    w, d = acc.pop("write")[use], acc.pop("dirty")[use]
    del use
    # events by slot, position, reads before writes
    o = np.lexsort((w, p, s))
    s, p, w, d = s[o], p[o], w[o], d[o]
    del o
    if not len(s):
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    first = w.copy()
    first[0] = True
    first[1:] |= s[1:] != s[:-1]
    starts = np.flatnonzero(first)
    last = np.append(starts[1:], len(s)) - 1
    ok = w[starts] & d[starts]
    # the op of the last read writes the slot again: no drop (its write replaces the bytes)
    nxt = last + 1
    again = np.zeros(len(starts), dtype=bool)
    inner = nxt < len(s)
    again[inner] = (s[nxt[inner]] == s[last[inner]]) & (p[nxt[inner]] == p[last[inner]])
    ok &= ~again
    at = p[last[ok]]
    sl = s[starts[ok]]
    o = np.argsort(at, kind="stable")
    return at[o], sa[sl][o], (se - sa)[sl][o]


def last_reads(acc: dict[str, np.ndarray], pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, addresses), by position: for each address a load or h2d reads a tile at
    (``tile``), the position of the last such read (module docstring). ``pos``: execution
    position of each op_id. ``acc`` is left as it is."""
    t = acc["tile"]
    addrs, inv = np.unique(acc["addr"][t], return_inverse=True)
    last = np.full(len(addrs), -1, dtype=np.int64)
    np.maximum.at(last, inv, pos[acc["op_id"][t]])
    o = np.argsort(last, kind="stable")
    return last[o], addrs[o]

"""Validate a trace against a topology before it is simulated (replay's build phase).

A trace is data a user can edit, damage or carry to another topology; replay trusts it
only after ``validate_ops(table, topo, meta)`` has checked, column by column (numpy /
Arrow compute, no per-op Python), that

* ``op_id`` is dense from 0 and every ``kind`` is one of ``schema.OP_KINDS`` (and spaces,
  dtypes and IPCQ directions are known values);
* every dependency names an existing, *earlier* op (capture records ops in program order,
  so a dependency on a later op is a damaged trace, and forbidding it rules out cycles);
* byte counts, GEMM dimensions, shapes and cycle counts are non-negative (dimensions
  positive) and bounded (``MAX_*``), so no plan or timing is built from a negative or
  absurd number;
* every placement (sip, cube, pe, IPCQ peer) exists in this topology;
* every HBM / SRAM / TCM operand address is mapped in this topology, in the space the
  op names, and its whole extent fits (a trace captured with 2 MiB of TCM does not
  replay on a topology with 16 KiB);
* IPCQ sends and receives are paired (each ``match_op_id`` names an op of the other
  kind that names it back);
* composite ops' ``extra_json`` is a JSON object whose ``tile_shape`` is three positive
  integers and whose tiles per op are bounded.

The first failure is a ``ReplayError`` naming the op (id, kind, program, seq), the bad
value and the fix. Cost: a few numpy passes over each column (see the README's Errors
section for a measurement on a large gemm trace).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbtrace import schema
from kbtrace.errors import AddressError, ReplayError
from kbtrace.topology import address

__all__ = ["validate_ops", "IpcqPairs", "MAX_NBYTES", "MAX_DIM", "MAX_TILES"]

#: largest byte count of one op (1 TiB: more than any topology's memory)
MAX_NBYTES = 1 << 40
#: largest GEMM dimension / shape extent of one op
MAX_DIM = 1 << 24
#: most elements of one op's result and most tiles of one composite op
MAX_ELEMS = 1 << 40
MAX_TILES = 1 << 22
MAX_CYCLES = 1 << 40
_FIX = "re-capture the workload"
_DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i8": 1, "bool": 1}


class _Ctx:
    """The table's identifying columns, to name an op in a message."""

    def __init__(self, table: pa.Table, topo: Any, meta: dict[str, Any]) -> None:
        self.t, self.topo, self.meta = table, topo, meta

    def op(self, i: int) -> str:
        t = self.t
        g = (lambda c: t.column(c)[int(i)].as_py())  # noqa: E731 - one row, only on failure
        return (f"op {g('op_id')} ({g('kind')}, launch {g('launch')}, program {g('program')}, "
                f"seq {g('seq')})")

    def fail(self, i: int, what: str, fix: str = _FIX) -> ReplayError:
        return ReplayError(f"ops.parquet: {self.op(i)}: {what}; {fix}")

    def captured(self) -> str:
        name = (self.meta.get("topology") or {}).get("name") if isinstance(
            self.meta.get("topology"), dict) else None
        return f"the trace was captured for {name!r}: " if name else ""


def _np(col: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    """A numeric column as numpy, nulls replaced by ``fill``."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count:
        arr = pc.fill_null(arr, fill)
    return arr.to_numpy(zero_copy_only=False)


def _strings(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[Any]]:
    """(per-row codes, values): a dictionary or string column as integer codes into the
    list of its distinct values (null -> None)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    codes = _np(arr.indices, -1).astype(np.int64)
    values = [*arr.dictionary.to_pylist(), None]
    return codes, values


def _first(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if len(idx) else None


def validate_ops(table: pa.Table, topo: Any, meta: dict[str, Any] | None = None, *,
                 first_row: int = 0, n_total: int | None = None,
                 pairs: IpcqPairs | None = None) -> None:
    """Raise ``ReplayError`` for the first op of ``table`` (schema.OPS columns) that does not
    fit ``topo`` or is not a well-formed op (see the module docstring). ``topo=None`` checks
    only what needs no topology (kinds, numbers, dependencies, operand lists, IPCQ pairs,
    extra_json): what verify checks before it executes a trace.

    A trace read in batches: ``table`` holds rows ``first_row`` on of a trace of ``n_total``
    rows, and the IPCQ pairing (which spans batches) goes to ``pairs``, checked once every
    batch was seen (``IpcqPairs.check``)."""
    cx = _Ctx(table, topo, meta or {})
    n = table.num_rows
    if n == 0:
        return
    op_id = _np(table.column("op_id"))
    bad = _first(op_id != np.arange(first_row, first_row + n, dtype=op_id.dtype))
    if bad is not None:
        row = first_row + bad
        raise ReplayError(f"ops.parquet: row {row} has op_id {int(op_id[bad])}, expected {row} "
                          f"(op_id must be dense from 0 in row order); {_FIX}")
    kinds = _check_enums(table, cx)
    _check_numbers(table, cx, kinds)
    _check_operand_lists(table, cx)
    _check_deps(table, cx, op_id, n if n_total is None else n_total)
    if topo is not None:
        _check_placement(table, cx, kinds)
        _check_addresses(table, cx)
    if pairs is None:
        _check_ipcq(table, cx, kinds)
    else:
        pairs.add(table, kinds, first_row)
    _check_extra(table, cx, kinds)


def _check_enums(table: pa.Table, cx: _Ctx) -> np.ndarray:
    """Known kinds, spaces, dtypes, directions; the kind of each row as a string array."""
    codes, values = _strings(table.column("kind"))
    for j, v in enumerate(values[:-1]):
        if v not in schema.OP_KINDS:
            i = _first(codes == j)
            if i is not None:
                raise cx.fail(i, f"unknown op kind {v!r} (kbtrace {schema.SCHEMA_VERSION} "
                              f"knows {', '.join(schema.OP_KINDS)})")
    i = _first(codes < 0)
    if i is not None:
        raise cx.fail(i, "op kind is null")
    for col, allowed in (("src_space", schema.SPACES), ("dst_space", schema.SPACES),
                         ("out_dtype", schema.DTYPES), ("direction", schema.DIRECTIONS)):
        c, vals = _strings(table.column(col))
        for j, v in enumerate(vals[:-1]):
            if v not in allowed:
                i = _first(c == j)
                if i is not None:
                    raise cx.fail(i, f"{col} {v!r} is not one of {', '.join(allowed)}")
    for col, allowed in (("in_spaces", schema.SPACES), ("in_dtypes", schema.DTYPES)):
        lst = table.column(col).combine_chunks()
        flat = pc.list_flatten(lst)
        if len(flat):
            ok = pc.is_in(flat, value_set=pa.array(allowed)).to_numpy(zero_copy_only=False)
            bad = _first(~ok)
            if bad is not None:
                row = int(pc.list_parent_indices(lst).to_numpy()[bad])
                raise cx.fail(row, f"{col} value {flat[bad].as_py()!r} is not one of "
                              f"{', '.join(allowed)}")
    return np.array(values, dtype=object)[codes]


def _check_numbers(table: pa.Table, cx: _Ctx, kinds: np.ndarray) -> None:
    nb = _np(table.column("nbytes"))
    i = _first((nb < 0) | (nb > MAX_NBYTES))
    if i is not None:
        raise cx.fail(i, f"nbytes = {int(nb[i])} is outside [0, {MAX_NBYTES}] (1 TiB)")
    for col in ("m", "n", "k"):
        arr = table.column(col).combine_chunks()
        v = _np(arr, 1)
        null = arr.is_null().to_numpy(zero_copy_only=False)
        i = _first(((v < 1) | (v > MAX_DIM)) & ~null)
        if i is not None:
            raise cx.fail(i, f"GEMM dimension {col} = {int(v[i])} is outside [1, {MAX_DIM}]")
        i = _first(null & (kinds == "dot")) if cx.topo is not None else None
        if i is not None:       # (replay plans a dot from m, n, k; verify reads shapes)
            raise cx.fail(i, f"GEMM dimension {col} is null on a dot")
    cyc = _np(table.column("cycles"))
    i = _first((cyc < 0) | (cyc > MAX_CYCLES))
    if i is not None:
        raise cx.fail(i, f"cycles = {int(cyc[i])} is outside [0, {MAX_CYCLES}]")
    shp = table.column("out_shape").combine_chunks()
    dims = _np(pc.list_flatten(shp))
    if len(dims):
        j = _first((dims < 0) | (dims > MAX_DIM))
        if j is not None:
            row = int(pc.list_parent_indices(shp).to_numpy()[j])
            raise cx.fail(row, f"out_shape has extent {int(dims[j])}, outside [0, {MAX_DIM}]")
        elems = _list_prod(shp, dims)
        i = _first(elems > MAX_ELEMS)
        if i is not None:
            raise cx.fail(i, f"out_shape holds {elems[i]:.3g} elements, more than {MAX_ELEMS}")


def _check_operand_lists(table: pa.Table, cx: _Ctx) -> None:
    """in_addrs, in_spaces, in_shapes and in_dtypes describe the same operands."""
    lens = {c: _np(pc.list_value_length(table.column(c).combine_chunks()))
            for c in ("in_addrs", "in_spaces", "in_shapes", "in_dtypes")}
    base = lens["in_addrs"]
    for c, v in lens.items():
        i = _first(v != base)
        if i is not None:
            raise cx.fail(i, f"in_addrs has {int(base[i])} operands but {c} has {int(v[i])}")


def _list_prod(lst: pa.Array, flat: np.ndarray) -> np.ndarray:
    """Per-row product of a list<int> column (an empty list: 1), as float64 (no overflow)."""
    offs = _np(lst.offsets).astype(np.int64)
    lens = np.diff(offs)
    out = np.ones(len(lens))
    nz = lens > 0
    if len(flat) and nz.any():
        out[nz] = np.multiply.reduceat(flat.astype(np.float64), offs[:-1][nz])
    return out


def _check_deps(table: pa.Table, cx: _Ctx, op_id: np.ndarray, n_total: int) -> None:
    deps = table.column("deps").combine_chunks()
    vals = _np(pc.list_flatten(deps), -1)
    if not len(vals):
        return
    parent = pc.list_parent_indices(deps).to_numpy()
    j = _first((vals < 0) | (vals >= n_total))
    if j is not None:
        raise cx.fail(int(parent[j]), f"depends on op {int(vals[j])}, which is not in the trace "
                      f"({n_total} ops)")
    j = _first(vals >= op_id[parent])
    if j is not None:
        raise cx.fail(int(parent[j]), f"depends on op {int(vals[j])}, which is not an earlier "
                      "op (dependencies point back in capture order; this one would make a "
                      "cycle or a wait on the future)")


def _check_placement(table: pa.Table, cx: _Ctx, kinds: np.ndarray) -> None:
    topo = cx.topo
    dev = ~np.isin(kinds, ("h2d", "d2h"))
    for pre in ("", "peer_"):
        cols = [table.column(pre + c).combine_chunks() for c in ("sip", "cube", "pe")]
        null = cols[0].is_null().to_numpy(zero_copy_only=False)
        s, c, p = (_np(a) for a in cols)
        bad = ((s < 0) | (s >= topo.n_sips) | (c < 0) | (c >= topo.cubes_per_sip)
               | (p < 0) | (p >= topo.pes_per_cube)) & ~null & dev
        i = _first(bad)
        if i is not None:
            raise cx.fail(i, f"{'IPCQ peer ' if pre else 'runs on '}sip{s[i]}.cube{c[i]}.pe{p[i]}, "
                          f"which topology {topo.params.name!r} ({topo.n_sips} SIP(s) x "
                          f"{topo.cubes_per_sip} cubes x {topo.pes_per_cube} PEs) does not have",
                          f"{cx.captured()}replay it on that topology or re-capture")


# ----------------------------------------------------------------------------- addresses

def _decode(a: np.ndarray) -> dict[str, np.ndarray]:
    u = np.uint64
    return {
        "high": (a >> u(address.ADDR_BITS)) != 0,
        "sip": (a >> u(address.SIP_SHIFT)) & u(0xF),
        "die": (a >> u(address.DIE_SHIFT)) & u(0x1F),
        "mbz": (a >> u(38)) & u(0xF),
        "hbm": ((a >> u(37)) & u(1)) == 1,
        "hbm_off": a & u(address.HBM_WINDOW_BYTES - 1),
        "kind": (a >> u(34)) & u(0x7),
        "bit33": (a >> u(33)) & u(1),
        "pe": (a >> u(29)) & u(0xF),
        "sub": (a >> u(25)) & u(0xF),
        "sram_mbz": (a >> u(25)) & u(0x1FF),
        "off": a & u(address.SLOT_BYTES - 1),
    }


def _mapped(a: np.ndarray, nb: np.ndarray, topo: Any) -> np.ndarray:
    """Per address: does ``[a, a + nb)`` lie in memory this topology has? The target is
    what the address decodes to (replay routes by address): HBM and SRAM extents within
    capacity, a PE's TCM extent within ``pe.tcm.size_kb``, other PE / M_CPU sub-units and
    IO chiplets present."""
    d = _decode(a)
    nb = nb.astype(np.uint64)
    ok_top = ~d["high"] & (d["sip"] < topo.n_sips)
    cube = ok_top & (d["die"] < topo.cubes_per_sip) & (d["mbz"] == 0)
    hbm = cube & d["hbm"] & (
        d["hbm_off"] + nb <= np.uint64(topo.pes_per_cube * topo.hbm_slice_bytes))
    local = cube & ~d["hbm"]
    sram = local & (d["kind"] == 2) & (d["sram_mbz"] == 0) & (
        d["off"] + nb <= np.uint64(topo.params.cube.sram.size_mb << 20))
    pe = local & (d["kind"] == 0) & (d["bit33"] == 0) & (d["pe"] < topo.pes_per_cube)
    budget = np.zeros(16, np.uint64)
    for sub, (_name, size) in address.PE_SUB_UNITS.items():
        budget[sub] = size
    budget[address.PE_TCM] = topo.params.pe.tcm.size_kb * 1024
    pe_ok = pe & (d["off"] + nb <= budget[d["sub"].astype(np.int64)])
    mcpu = local & (d["kind"] == 1)
    io = (ok_top & (d["die"] >= address.IO_DIE_BASE)
          & (d["die"] < address.IO_DIE_BASE + topo.n_io_chiplets))
    return hbm | sram | pe_ok | mcpu | io


_MEMORY = ("hbm", "sram", "tcm")


def _in_memory(col: pa.Array) -> np.ndarray:
    """Per value of a space column: is it a memory space (hbm / sram / tcm)?"""
    codes, values = _strings(col)
    lut = np.array([v in _MEMORY for v in values])
    return lut[codes]


def _operands(table: pa.Table) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(label, row, address, extent bytes) per operand in memory (hbm / sram / tcm)."""
    nb = _np(table.column("nbytes")).astype(np.int64)
    out = []
    for side in ("src", "dst"):
        mem = np.flatnonzero(_in_memory(table.column(f"{side}_space")))
        addr = _np(table.column(f"{side}_addr")).astype(np.uint64)
        out.append((f"{side}_addr", mem, addr[mem], nb[mem]))
    addrs = table.column("in_addrs").combine_chunks()
    flat = _np(pc.list_flatten(addrs)).astype(np.uint64)
    if len(flat):
        parent = pc.list_parent_indices(addrs).to_numpy()
        mem = _in_memory(pc.list_flatten(table.column("in_spaces").combine_chunks()))
        per_op = pc.list_flatten(table.column("in_shapes").combine_chunks())  # a shape each
        elems = _list_prod(per_op, _np(pc.list_flatten(per_op)))
        codes, dts = _strings(pc.list_flatten(table.column("in_dtypes").combine_chunks()))
        size = np.array([_DTYPE_BYTES.get(x, 4) for x in dts], dtype=np.float64)[codes]
        ext = np.minimum(elems * size, float(MAX_NBYTES)).astype(np.int64)
        sel = np.flatnonzero(mem)
        out.append(("in_addrs", parent[sel], flat[sel], ext[sel]))
    return out


def _check_addresses(table: pa.Table, cx: _Ctx) -> None:
    topo = cx.topo
    for label, rows, addr, ext in _operands(table):
        if not len(rows):
            continue
        j = _first(~_mapped(addr, ext, topo))
        if j is None:
            continue
        a, nb, row = int(addr[j]), int(ext[j]), int(rows[j])
        raise cx.fail(row, _address_problem(a, nb, topo, label),
                      f"{cx.captured()}replay it on a topology that maps it, or re-capture "
                      "on this one")


def _address_problem(a: int, nb: int, topo: Any, label: str) -> str:
    """Why ``[a, a + nb)`` is not in this topology (the first reason)."""
    try:
        topo.resolve(a)
        pa_ = address.decode(a)
    except AddressError as exc:
        return f"{label}: {exc}"
    if pa_.target == "pe_local" and pa_.sub_unit == address.PE_TCM:
        cap = topo.params.pe.tcm.size_kb
        return (f"{label} {a:#x} uses TCM bytes [{pa_.offset}, {pa_.offset + nb}) but topology "
                f"{topo.params.name!r} has pe.tcm.size_kb = {cap} ({cap * 1024} bytes)")
    if pa_.target == "cube_sram":
        return (f"{label} {a:#x} uses SRAM bytes [{pa_.offset}, {pa_.offset + nb}) beyond "
                f"cube.sram.size_mb = {topo.params.cube.sram.size_mb}")
    if pa_.target == "hbm":
        return (f"{label} {a:#x} + {nb} bytes runs past the "
                f"{topo.params.cube.hbm.capacity_gb} GB of HBM per cube")
    return (f"{label} {a:#x} + {nb} bytes runs past the end of its "
            f"{pa_.sub_unit_name or pa_.target} window")


# ----------------------------------------------------------------------------- IPCQ, extras

def _check_ipcq(table: pa.Table, cx: _Ctx, kinds: np.ndarray) -> None:
    send, recv = kinds == "send", kinds == "recv"
    if not (send.any() or recv.any()):
        return
    col = table.column("match_op_id").combine_chunks()
    m = _np(col, -1).astype(np.int64)
    has = ~col.is_null().to_numpy(zero_copy_only=False)
    n = len(kinds)
    rows = np.flatnonzero((send | recv) & has)
    mm = m[rows]
    j = _first((mm < 0) | (mm >= n))
    if j is not None:
        raise cx.fail(int(rows[j]), f"its IPCQ match is op {int(mm[j])}, which is not in the "
                      "trace")
    other = np.where(send[rows], "recv", "send")
    j = _first(kinds[mm] != other)
    if j is not None:
        raise cx.fail(int(rows[j]), f"its IPCQ match op {int(mm[j])} is a {kinds[mm[j]]}, not "
                      f"a {other[j]} (sends and receives must be paired)")
    j = _first(m[mm] != rows)
    if j is not None:
        raise cx.fail(int(rows[j]), f"its IPCQ match op {int(mm[j])} is matched with op "
                      f"{int(m[mm[j]])} (sends and receives must be paired one to one)")
    n_send, n_recv = int(send.sum()), int(recv.sum())
    if n_send != n_recv and has[send | recv].all():
        i = _first(send | recv)
        assert i is not None          # (the counts differ: there is a send or a receive)
        raise cx.fail(i, f"{n_send} IPCQ sends but {n_recv} receives")


def _check_extra(table: pa.Table, cx: _Ctx, kinds: np.ndarray) -> None:
    codes, values = _strings(table.column("extra_json"))
    parsed: dict[int, Any] = {}
    for j, text in enumerate(values[:-1]):
        i = _first(codes == j)
        if i is None:
            continue
        try:
            obj = json.loads(text)
        except ValueError as exc:
            raise cx.fail(i, f"extra_json is not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise cx.fail(i, "extra_json is not a JSON object")
        ts = obj.get("tile_shape")
        if ts is not None and not (isinstance(ts, list) and len(ts) == 3 and all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_DIM
                for x in ts)):
            raise cx.fail(i, f"extra_json tile_shape {ts!r} is not three integers in "
                          f"[1, {MAX_DIM}]")
        epi = obj.get("epilogue", [])
        if not isinstance(epi, list) or not all(isinstance(e, dict) for e in epi):
            raise cx.fail(i, "extra_json epilogue is not a list of objects")
        parsed[j] = obj
    comp = np.flatnonzero(kinds == "composite")
    if not len(comp) or cx.topo is None:
        return
    tile = cx.topo.params.pe.tile
    mnk = [_np(table.column(c), 1)[comp].astype(np.float64) for c in ("m", "n", "k")]
    ts = np.array([(parsed.get(int(c), {}).get("tile_shape") or [tile.m, tile.k, tile.n])
                   for c in codes[comp]], dtype=np.float64).reshape(-1, 3)
    tiles = (np.ceil(mnk[0] / ts[:, 0]) * np.ceil(mnk[1] / ts[:, 2])
             * np.ceil(mnk[2] / ts[:, 1]))
    big = _first(tiles > MAX_TILES)
    if big is not None:
        raise cx.fail(int(comp[big]), f"composite of {tiles[big]:.3g} tiles, more than {MAX_TILES} "
                      "(m, n, k against the tile shape)")


class IpcqPairs:
    """The IPCQ pairing of a trace validated in batches: each batch's sends and receives
    (row, match) are kept, and ``check(source)`` runs ``_check_ipcq``'s tests over them once
    (``source``: an ``OpSource``, for each row's kind and to name a failing op)."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.send: list[np.ndarray] = []
        self.match: list[np.ndarray] = []
        self.has: list[np.ndarray] = []

    def add(self, table: pa.Table, kinds: np.ndarray, first_row: int) -> None:
        send, recv = kinds == "send", kinds == "recv"
        sel = np.flatnonzero(send | recv)
        if not len(sel):
            return
        col = table.column("match_op_id").combine_chunks()
        self.rows.append(sel + first_row)
        self.send.append(send[sel])
        self.match.append(_np(col, -1).astype(np.int64)[sel])
        self.has.append(~col.is_null().to_numpy(zero_copy_only=False)[sel])

    def check(self, source: Any) -> None:
        if not self.rows:
            return
        rows_all, send = np.concatenate(self.rows), np.concatenate(self.send)
        m_all, has = np.concatenate(self.match), np.concatenate(self.has)

        def fail(row: int, what: str) -> ReplayError:
            o = source.fetch([row])[row]
            return ReplayError(f"ops.parquet: op {o.op_id} ({o.kind}, launch {o.launch}, "
                               f"program {o.program}, seq {o.seq}): {what}; {_FIX}")

        rows, mm = rows_all[has], m_all[has]
        j = _first((mm < 0) | (mm >= source.n))
        if j is not None:
            raise fail(int(rows[j]), f"its IPCQ match is op {int(mm[j])}, which is not in the "
                       "trace")
        kind_of = np.array(source.kind_values, dtype=object)[source.kinds[mm]]
        other = np.where(send[has], "recv", "send")
        j = _first(kind_of != other)
        if j is not None:
            raise fail(int(rows[j]), f"its IPCQ match op {int(mm[j])} is a {kind_of[j]}, not "
                       f"a {other[j]} (sends and receives must be paired)")
        back = m_all[np.searchsorted(rows_all, mm)]
        j = _first(back != rows)
        if j is not None:
            raise fail(int(rows[j]), f"its IPCQ match op {int(mm[j])} is matched with op "
                       f"{int(back[j])} (sends and receives must be paired one to one)")
        n_send = int(send.sum())
        n_recv = len(send) - n_send
        if n_send != n_recv and has.all():
            raise fail(int(rows_all[0]), f"{n_send} IPCQ sends but {n_recv} receives")

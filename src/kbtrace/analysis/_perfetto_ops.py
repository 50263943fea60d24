"""The timeline's op slices encoded as columns (``perfetto._stream``; issue 22, target 2).

A run has one ``X`` event per op: at a million ops, building a dict per op and encoding it
with ``json`` was ~6 CPU s of the report. Here each batch of op rows (DuckDB -> Arrow) is
encoded in Arrow compute: every field is a column of JSON text -- integers as Arrow casts them
(``str(int)``), floats through ``json.dumps`` of each distinct value (``repr``, ``NaN``,
``Infinity``), strings through ``json.dumps`` of each distinct one, times through
``us_strings`` (``perfetto.us``, exact) -- and the columns are joined element-wise into the
events' text, byte for byte what ``json.JSONEncoder(separators=(",", ":"))`` writes for the
same dicts. A batch comes out as one ``Encoded`` (its events joined by commas), which
``perfetto._write`` copies as is and ``perfetto.trace_events`` decodes.

Tracks: ops arrive sorted by engine, then start; an engine's slices go to lane 0 as long as
each starts no earlier than the one before it ends (every engine of gemm at a million ops);
an engine where slices overlap (DMA channels, async composites) is placed slice by slice by
``_Tracks.place``, as before. Either way tracks and lanes are registered in the same order as
slice-by-slice placement would, so pids and tids are the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Encoded", "us_strings", "json_floats", "json_strings", "op_slices", "counter_steps"]


class Encoded:
    """``n`` trace events already encoded: compact JSON objects joined by commas."""

    __slots__ = ("data", "n")

    def __init__(self, data: bytes, n: int) -> None:
        self.data, self.n = data, n

    def events(self) -> list[dict[str, Any]]:
        return json.loads(b"[" + self.data + b"]") if self.n else []


def _ints(a: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(a, pa.int64()), pa.string())


def us_strings(ns: np.ndarray) -> pa.Array:
    """``perfetto.us`` of each integer ns: exact decimal microseconds, three decimals."""
    m = np.abs(ns)
    out = pc.binary_join_element_wise(_ints(m // 1000),
                                      pc.utf8_lpad(_ints(m % 1000), width=3, padding="0"), ".")
    neg = ns < 0
    if neg.any():
        out = pc.if_else(pa.array(neg), pc.binary_join_element_wise("-", out, ""), out)
    return out


def json_floats(x: np.ndarray) -> pa.Array:
    """Each float as ``json.dumps`` writes it; distinct values (by bits: -0.0 is not 0.0)
    encoded once."""
    bits = np.ascontiguousarray(x, dtype=np.float64).view(np.int64)
    u, inv = np.unique(bits, return_inverse=True)
    text = pa.array([json.dumps(v) for v in u.view(np.float64).tolist()], pa.string())
    return text.take(pa.array(inv.reshape(-1)))


def json_strings(col: pa.Array) -> tuple[pa.Array, pa.Array, list[str]]:
    """A string column as JSON string literals, each distinct value encoded once; with the
    dictionary indices and the distinct values."""
    d = pc.dictionary_encode(col)
    if isinstance(d, pa.ChunkedArray):
        d = d.combine_chunks()
    values = d.dictionary.to_pylist()
    text = pa.array([json.dumps(v) for v in values], pa.string())
    return text.take(d.indices), d.indices, values


def _codes(col: pa.Array) -> tuple[np.ndarray, list[Any]]:
    """Dictionary indices (-1 for nulls) and the distinct values of a string column."""
    d = pc.dictionary_encode(col.cast(pa.string()) if pa.types.is_dictionary(col.type)
                             else col)
    return d.indices.fill_null(-1).to_numpy(), d.dictionary.to_pylist()


def _joined(parts: list[Any]) -> bytes:
    """The element-wise concatenation of ``parts`` (columns and constant strings), each row
    followed by a comma; the rows as one text without the last comma."""
    arr = pc.binary_join_element_wise(*parts, ",", "")
    off = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset:arr.offset + len(arr) + 1]
    return arr.buffers()[2].to_pybytes()[int(off[0]):int(off[-1]) - 1]


def _place(tracks: Any, proc: str, local: str, s: np.ndarray, e: np.ndarray,
           pid: np.ndarray, tid: np.ndarray) -> None:
    """pid and tid of one engine's consecutive slices (``tracks.place`` semantics)."""
    lanes = tracks.lane_end.get((proc, local))
    sequential = bool((s[1:] >= e[:-1]).all()) and (
        not lanes or (len(lanes) == 1 and lanes[0] <= int(s[0])))
    if sequential:      # each fits lane 0 (free when it starts): one call registers it
        p, t = tracks.place(proc, local, int(s[0]), int(e[0]))
        tracks.lane_end[(proc, local)][0] = int(e[-1])
        pid[:], tid[:] = p, t
        return
    for i, (a, b) in enumerate(zip(s.tolist(), e.tolist(), strict=True)):
        pid[i], tid[i] = tracks.place(proc, local, a, b)


def op_slices(batches: Iterator[pa.RecordBatch], tracks: Any, slot: Any,
              split: Callable[[str], tuple[str, str]]) -> Iterator[Encoded]:
    """One ``Encoded`` per batch of op rows (op_id, launch, program, seq, kind, name, engine,
    t_start_ns, t_end_ns, queue_ns, nbytes; by engine, then start): their ``X`` events, each
    op's slice put in ``slot``."""
    for b in batches:
        n = b.num_rows
        if not n:
            continue
        c = {name: b.column(i) for i, name in enumerate(b.schema.names)}
        s = np.rint(c["t_start_ns"].to_numpy()).astype(np.int64)
        e = np.maximum(s, np.rint(c["t_end_ns"].to_numpy()).astype(np.int64))
        eng_i, engines = _codes(c["engine"])
        pid = np.empty(n, np.int64)
        tid = np.empty(n, np.int64)
        starts = np.flatnonzero(np.r_[True, eng_i[1:] != eng_i[:-1]]).tolist() + [n]
        for g0, g1 in zip(starts[:-1], starts[1:], strict=True):
            proc, local = split(engines[eng_i[g0]])
            _place(tracks, proc or "host/io", local, s[g0:g1], e[g0:g1],
                   pid[g0:g1], tid[g0:g1])
        label = pc.binary_join_element_wise(c["kind"], c["name"], "/")
        name_js, lab_i, labels = json_strings(label)
        cat_js = json_strings(c["kind"])[0]
        op_id = c["op_id"].to_numpy()
        slot.put_many(op_id, pid, tid, s, e, lab_i.to_numpy(), labels)
        data = _joined([
            '{"ph":"X","pid":', _ints(pid), ',"tid":', _ints(tid), ',"ts":"', us_strings(s),
            '","dur":"', us_strings(e - s), '","name":', name_js, ',"cat":', cat_js,
            ',"args":{"op_id":', _ints(op_id), ',"launch":', _ints(c["launch"].to_numpy()),
            ',"program":', _ints(c["program"].to_numpy()), ',"seq":',
            _ints(c["seq"].to_numpy()), ',"queue_ns":', json_floats(c["queue_ns"].to_numpy()),
            ',"nbytes":', _ints(c["nbytes"].to_numpy()), "}}"])
        yield Encoded(data, n)


def counter_steps(series: list[tuple[tuple[str, str, str], np.ndarray, np.ndarray]],
                  pid: Callable[[str], int], cut: int | None,
                  rows: int = 1 << 16) -> Iterator[Encoded]:
    """The ``C`` events of counters' step functions, in order: per (process, track, series)
    key, ``{"ph":"C","pid":..,"name":track,"ts":..,"args":{series:level}}`` at each of its
    times (those <= ``cut`` when given); encoded ``rows`` events at a time."""
    heads, tails, idx, ts, vals = [], [], [], [], []
    for i, ((proc, track, name), t, level) in enumerate(series):
        if cut is not None:
            keep = t <= cut
            t, level = t[keep], level[keep]
        heads.append(f'{{"ph":"C","pid":{pid(proc)},"name":{json.dumps(track)},"ts":"')
        tails.append(f'","args":{{{json.dumps(name)}:')
        idx.append(np.full(len(t), i, np.int64))
        ts.append(np.asarray(t, np.int64))
        vals.append(np.asarray(level, np.int64))
    if not idx:
        return
    at, t_all, v_all = np.concatenate(idx), np.concatenate(ts), np.concatenate(vals)
    head, tail = pa.array(heads, pa.string()), pa.array(tails, pa.string())
    for i in range(0, len(at), rows):
        j = pa.array(at[i:i + rows])
        yield Encoded(_joined([head.take(j), us_strings(t_all[i:i + rows]), tail.take(j),
                               _ints(v_all[i:i + rows]), "}}"]), len(j))

"""The timeline's op slices encoded as columns (``analysis._perfetto_ops``) are byte for byte
what encoding one dict per op with ``json`` writes: times, floats and strings of every kind,
engines whose slices overlap (lanes) and engines whose slices follow one another."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pyarrow as pa

from kbtrace.analysis._perfetto_ops import (
    counter_steps,
    json_floats,
    json_strings,
    op_slices,
    us_strings,
)
from kbtrace.analysis.perfetto import _Slots, _split, _Tracks, us

ENC = json.JSONEncoder(separators=(",", ":")).encode


def test_us_strings_are_us_of_each_value():
    ns = np.array([0, 7, 999, 1000, 1001, 12345, -1, -999, -1000, -12345, 2**53 + 1], np.int64)
    assert us_strings(ns).to_pylist() == [us(int(v)) for v in ns.tolist()]


def test_json_floats_and_strings_are_json_dumps():
    x = np.array([0.0, -0.0, 1e-5, 1e16, 0.1 + 0.2, math.nan, math.inf, -math.inf, 2.5, 0.0])
    assert json_floats(x).to_pylist() == [json.dumps(v) for v in x.tolist()]
    assert json_floats(x).to_pylist()[:2] == ["0.0", "-0.0"]        # by bits, not by value
    col = pa.array(["dma/a", 'q"uote', "é\u2028", "dma/a"])
    text, idx, values = json_strings(col)
    assert text.to_pylist() == [json.dumps(v) for v in col.to_pylist()]
    assert values == ["dma/a", 'q"uote', "é\u2028"] and idx.to_pylist() == [0, 1, 2, 0]


def _reference(rows, tracks, slot):
    """The op events as perfetto._stream wrote them before (one dict per op)."""
    split = functools.cache(_split)
    out = []
    for (op_id, launch, program, seq, kind, name, engine, t0, t1, q, nb) in rows:
        s, e = round(t0), round(t1)
        e = max(s, e)
        proc, local = split(engine)
        pid, tid = tracks.place(proc or "host/io", local, s, e)
        lab = f"{kind}/{name}"
        slot.put(op_id, pid, tid, s, e, lab)
        out.append({"ph": "X", "pid": pid, "tid": tid, "ts": us(s), "dur": us(e - s),
                    "name": lab, "cat": kind,
                    "args": {"op_id": op_id, "launch": launch, "program": program,
                             "seq": seq, "queue_ns": q, "nbytes": nb}})
    return out


def test_op_slices_are_the_dict_encoding_byte_for_byte():
    # by engine, then start (the export's order); pe0.dma overlaps itself (3 lanes), pe0.gemm
    # runs back to back, host engines have no cube, one slice ends before it starts
    rows = [
        (5, 0, 1, 0, "dma", "rd", "sip0.cube0.pe0.dma", 0.0, 10.0, 0.0, 64),
        (6, 0, 1, 1, "dma", "rd", "sip0.cube0.pe0.dma", 2.5, 12.0, 1.5, 64),
        (7, 0, 1, 2, "dma", "wr", "sip0.cube0.pe0.dma", 3.5, 4.0, -0.0, 128),
        (8, 0, 1, 3, "dma", "wr", "sip0.cube0.pe0.dma", 11.0, 20.0, 1e-5, 128),
        (1, 0, 0, 0, "gemm", "mm", "sip0.cube0.pe0.gemm", 0.49, 1000.5, 0.0, 0),
        (2, 0, 0, 1, "gemm", "mm", "sip0.cube0.pe0.gemm", 1000.5, 1999.5, 0.1 + 0.2, 0),
        (3, 1, 2, 0, "h2d", 'cp"y', "host.pcie", 5.0, 4.0, 0.0, 2**40),
        (0, 1, 2, 1, "h2d", "cpy", "host.pcie", 1e9 + 0.5, 1e9 + 1.5, 7.0, 1),
    ]
    names = ["op_id", "launch", "program", "seq", "kind", "name", "engine", "t_start_ns",
             "t_end_ns", "queue_ns", "nbytes"]
    types = [pa.int64(), pa.int32(), pa.int32(), pa.int32(), pa.string(), pa.string(),
             pa.string(), pa.float64(), pa.float64(), pa.float64(), pa.int64()]
    cols = list(zip(*rows, strict=True))
    batch = pa.record_batch([pa.array(c, t) for c, t in zip(cols, types, strict=True)],
                            names=names)
    want_tracks, want_slot = _Tracks(), _Slots()
    want = _reference(rows, want_tracks, want_slot)
    tracks, slot = _Tracks(), _Slots()
    # in two batches: an engine's slices continue across them
    got = list(op_slices(iter([batch.slice(0, 3), batch.slice(3)]), tracks, slot,
                         functools.cache(_split)))
    assert b",".join(g.data for g in got) == ENC(want)[1:-1].encode()
    assert sum(g.n for g in got) == len(rows)
    assert [e for g in got for e in g.events()] == want
    assert tracks.meta() == want_tracks.meta()
    assert {e["tid"] for e in want if e["cat"] == "dma"} == {1, 2, 3}     # three lanes
    for op in range(9):
        assert slot.get(op) == want_slot.get(op) and slot.label(op) == want_slot.label(op)


def test_counter_steps_are_the_dict_encoding_byte_for_byte():
    pids = {"sip0.cube0 fabric": 3, "fabric": 7}
    series = [
        (("fabric", "link a -> b (x)", "bytes in flight"), np.array([0, 5, 1500, 3000]),
         np.array([64, 128, 0, -1])),
        (("sip0.cube0 fabric", "hbm_ctrl.pe0", "waiting"), np.array([], np.int64),
         np.array([], np.int64)),
        (("sip0.cube0 fabric", 'l"nk é', "in service"), np.array([2, 2999, 3001]),
         np.array([1, 0, 2**40])),
    ]
    for cut in (None, 3000, 1):
        want = [{"ph": "C", "pid": pids[proc], "name": track, "ts": us(ts), "args": {name: v}}
                for (proc, track, name), t, level in series
                for ts, v in zip(t.tolist(), level.tolist(), strict=True)
                if cut is None or ts <= cut]
        for rows in (1 << 16, 2):       # one chunk, or events two at a time
            got = list(counter_steps(series, pids.__getitem__, cut, rows))
            assert sum(g.n for g in got) == len(want) == {None: 7, 3000: 6, 1: 1}[cut]
            assert len(got) == (1 if rows > 2 else -(-len(want) // 2))
            assert b",".join(g.data for g in got) == ENC(want)[1:-1].encode()
            assert [e for g in got for e in g.events()] == want
    assert list(counter_steps(series[1:2], pids.__getitem__, None)) == []

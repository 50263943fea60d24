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


def _fabric_reference(rows, tracks, slot, steps, chains, link_track):
    """The fabric slices as ``perfetto._stream`` built them before: a dict per row."""
    split = functools.cache(_split)
    out = []
    for (op_id, tile, hop, link_idx, t0, t1, nb, q, busy, node, dst, lkind) in rows:
        s, e = round(t0), round(t1)
        e = max(s, e)
        cube, src_local = split(node)
        proc = f"{cube} fabric" if cube else "fabric"
        if link_idx >= 0:
            dst_local = split(dst)[1] if split(dst)[0] == cube else dst
            track = f"link {src_local} -> {dst_local} ({lkind})"
        else:
            track = src_local
        pid, tid = tracks.place(proc, track, s, e)
        out.append({"ph": "X", "pid": pid, "tid": tid, "ts": us(s), "dur": us(e - s),
                    "name": slot.label(op_id), "cat": "fabric",
                    "args": {"op_id": op_id, "tile": tile, "nbytes": nb, "queue_ns": q}})
        if link_idx >= 0:
            chains[(op_id, tile)].append((hop, pid, tid, s))
            link_track[link_idx] = (proc, track)
            for name in (track, "links"):
                steps.add((proc, name, "bytes in flight"), s, nb, e, -nb)
        else:
            qe = max(s, min(round(t0 + q), e))
            steps.add((proc, track, "waiting"), s, 1, qe, -1)
            steps.add((proc, track, "in service"), max(qe, round(t1 - busy)), 1, e, -1)
    return out


def test_fabric_slices_are_the_dict_encoding_byte_for_byte():
    from collections import defaultdict

    from kbtrace.analysis._perfetto_fabric import fabric_slices
    from kbtrace.analysis._perfetto_flows import Chains
    from kbtrace.analysis.perfetto import _Steps

    # by entry time (the export's order): link 3 carries two overlapping hops (two lanes),
    # link 4 leaves the cube, node 9 is an HBM controller (queued, then served); op 77 has
    # no op slice ("op 77"); times at .5 round half to even, as Python's round
    a, b = "sip0.cube0.pe0.router", "sip0.cube0.pe1.router"
    rows = [
        (1, 0, 0, 3, 0.5, 10.0, 64, 0.0, 9.5, a, b, "mesh"),
        (2, 0, 0, 3, 2.0, 12.5, 64, 1.5, 9.0, a, b, "mesh"),
        (1, 0, 1, 4, 10.0, 20.0, 64, 0.0, 10.0, b, "sip0.cube1.pe0.router", "d2d"),
        (77, -1, 0, -1, 11.0, 30.0, 128, 4.4, 10.0, "sip0.cube0.hbm_ctrl.pe0", None, None),
        (2, 1, 1, 3, 12.5, 13.5, 32, -0.0, 1.0, a, b, "mesh"),
        (5, 0, 0, -1, 13.0, 13.0, 8, 0.1 + 0.2, 0.0, "sip0.cube0.hbm_ctrl.pe0", None, None),
    ]
    names = ["op_id", "tile", "hop", "link_idx", "t_enter_ns", "t_leave_ns", "nbytes",
             "queue_ns", "busy_ns", "node", "dst_id", "link_kind"]
    types = [pa.int64(), pa.int32(), pa.int32(), pa.int32(), pa.float64(), pa.float64(),
             pa.int64(), pa.float64(), pa.float64(), pa.string(), pa.string(), pa.string()]
    cols = list(zip(*rows, strict=True))
    batch = pa.record_batch([pa.array(c, t) for c, t in zip(cols, types, strict=True)],
                            names=names)

    def setup():
        tracks, slot = _Tracks(), _Slots()
        for op, lab in ((1, "load/ld"), (2, 'store/"st"'), (5, "load/ld")):
            slot.put(op, *tracks.place("sip0.cube0", "pe0.dma", op, op + 1), op, op + 1, lab)
        return tracks, slot, _Steps(), {}

    wt, ws, wsteps, wlinks = setup()
    wchains = defaultdict(list)
    want = _fabric_reference(rows, wt, ws, wsteps, wchains, wlinks)
    tracks, slot, steps, links = setup()
    chains = Chains()
    got = list(fabric_slices(iter([batch.slice(0, 4), batch.slice(4)]), tracks, slot,
                             functools.cache(_split), steps, chains, links))
    assert got[-1] == len(rows)
    assert b",".join(g.data for g in got[:-1]) == ENC(want)[1:-1].encode()
    assert [e for g in got[:-1] for e in g.events()] == want
    assert tracks.meta() == wt.meta()
    assert [e["name"] for e in want] == ["load/ld", 'store/"st"', "load/ld", "op 77",
                                         'store/"st"', "load/ld"]
    assert [e["tid"] for e in want[:2]] == [2, 3]          # two lanes on link 3
    assert chains.to_dict() == {k: sorted(v) for k, v in sorted(wchains.items())}
    assert chains.to_dict() == {(1, 0): [(0, 2, 2, 0), (1, 2, 4, 10)],
                                (2, 0): [(0, 2, 3, 2)], (2, 1): [(1, 2, 2, 12)]}
    assert links == wlinks
    assert [(k, t.tolist(), v.tolist()) for k, t, v in steps.levels()] == [
        (k, t.tolist(), v.tolist()) for k, t, v in wsteps.levels()]


def _flows_reference(chains, slot, recv_of, limit):
    """The transfer flows' points as ``perfetto._flows`` wrote them before: a dict of tuple
    lists, an f-string per point."""
    out, n, total = [], 0, 0
    for (op_id, _tile), hops in sorted(chains.items()):
        if op_id not in slot:
            continue
        total += 1
        if n >= limit:
            continue
        n += 1
        hops = sorted(hops)
        pid, tid, s, e = slot[op_id]
        cat = "ipcq" if op_id in recv_of else "transfer"

        def point(ph, p, t, ts, n=n, cat=cat):
            out.append(f'{{"ph":"{ph}","id":{n},"pid":{p},"tid":{t},"ts":"{us(ts)}",'
                       f'"name":"{cat}","cat":"flow.{cat}"' + (',"bp":"e"}' if ph == "f" else "}"))
        point("s", pid, tid, max(s, min(hops[0][3], e)))
        dst = slot.get(recv_of[op_id]) if op_id in recv_of else None
        for i, (_h, hp, ht, hs) in enumerate(hops):
            point("f" if i == len(hops) - 1 and dst is None else "t", hp, ht, hs)
        if dst is not None:
            dp, dt, ds, de = dst
            point("f", dp, dt, max(ds, min(hops[-1][3], de)))
    return total, n, ",".join(out).encode()


def test_chain_flows_are_the_per_point_encoding_byte_for_byte():
    from kbtrace.analysis._perfetto_flows import Chains, chain_flows

    tracks, slot = _Tracks(), _Slots()
    # op 1: a transfer; op 2: a send whose receive (op 9) has a slice, ending there clamped
    # to it; op 3: a send whose receive (op 8) has none (ends on its last hop); op 4: no
    # slice (no flow); op 5: two tiles, hops given out of order; op 6: past the limit
    for op, (a, b) in {1: (0, 50), 2: (10, 20), 3: (5, 9), 5: (-3000, 7), 6: (0, 1),
                       9: (100, 200)}.items():
        slot.put(op, *tracks.place("sip0.cube0", f"pe{op}.dma", a, b), a, b, "load/ld")
    rows = [  # op, tile, hop, pid, tid, s
        (1, 0, 1, 2, 4, 30), (1, 0, 0, 2, 3, 60), (2, 0, 0, 2, 5, 12), (2, 0, 1, 2, 6, 15),
        (3, 0, 0, 2, 7, 6), (4, 0, 0, 2, 8, 1), (5, 1, 0, 2, 3, -2000), (5, 0, 2, 2, 4, 3),
        (5, 0, 1, 2, 4, 1), (6, 0, 0, 2, 9, 0)]
    recv_of = {2: 9, 3: 8, 7: 1}
    ref: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    for op, tile, hop, pid, tid, s in rows:
        ref.setdefault((op, tile), []).append((hop, pid, tid, s))
    for limit in (10, 4, 0):
        chains = Chains()
        cols = [np.array(c, np.int64) for c in zip(*rows, strict=True)]
        chains.add(*(c[:4] for c in cols))
        chains.add(*(c[4:] for c in cols))
        total, n, pts = chain_flows(chains, slot, recv_of, limit)
        want = _flows_reference(ref, slot, recv_of, limit)
        assert (total, n) == want[:2] == (6, min(6, limit))
        assert b",".join(e.data for e in pts) == want[2]
    assert want[2] == b"" and _flows_reference(ref, slot, recv_of, 10)[2].count(b'"ph"') == 16
    assert b'"ph":"f","id":2,"pid":1,"tid":6,"ts":"0.100","name":"ipcq"' in \
        _flows_reference(ref, slot, recv_of, 10)[2]

"""Perfetto export of a real run: fabric tracks (links, HBM controllers), one flow per
transfer through its links, counters (bytes in flight per link and cube, link utilisation per
window, HBM accesses waiting / in service), integer-ns timestamps that Perfetto parses exactly.

No trace processor can be installed here (the `perfetto` package downloads its binary at
run time), so the load is checked structurally, in integer ns as Perfetto's JSON importer
parses string timestamps: every flow point lies inside a slice on its track, flows start
once and end once, slices on a track nest."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from kbtrace.analysis.main import run_workload
from kbtrace.analysis.perfetto import export_perfetto, us


def _ns(v: str) -> int:
    whole, frac = v.split(".")
    assert len(frac) == 3 and whole.lstrip("-").isdigit()
    return int(whole) * 1000 + int(frac)


def test_us_is_exact_decimal():
    assert [us(0), us(7), us(12345), us(1000)] == ["0.000", "0.007", "12.345", "1.000"]
    # a float would lose a ns in Perfetto (int(1.001 * 1000) == 1000); the string does not
    assert int(float(str(1001 / 1000)) * 1000) == 1000 and _ns(us(1001)) == 1001


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    d = tmp_path_factory.mktemp("pf")
    s = run_workload("ring_allreduce", out=d / "data", verify_data=False, make_report=False,
                     attribute=False)
    out = d / "ring.json"
    export_perfetto(s.run_dir, out)
    return json.loads(out.read_text())


def test_fabric_tracks_and_flows_through_links(ring):
    ev = ring["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M"
             and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M"
               and e["name"] == "thread_name"}
    assert "sip0.cube0 fabric" in procs.values()
    links = [n for n in threads.values() if n.startswith("link ")]
    assert links and any("(router_mesh)" in n for n in links)
    fabric = [e for e in ev if e["ph"] == "X" and e["cat"] == "fabric"]
    assert len(fabric) > 100
    flows = defaultdict(list)
    for e in ev:
        if e["ph"] in "stf":
            flows[e["id"]].append(e)
    ipcq = [f for f in flows.values() if f[0]["cat"] == "flow.ipcq"]
    assert ipcq, "no IPCQ transfer flows"
    for f in ipcq:          # send -> each link -> the matching recv
        assert [e["ph"] for e in f] == ["s"] + ["t"] * (len(f) - 2) + ["f"]
        assert all(threads[(e["pid"], e["tid"])].split(" [")[0].startswith("link ")
                   for e in f[1:-1])
        assert len(f) >= 3
    for f in flows.values():
        ts = [_ns(e["ts"]) for e in f]
        assert ts == sorted(ts)


def test_every_flow_point_lies_inside_its_slice_in_integer_ns(ring):
    ev = ring["traceEvents"]
    slices = defaultdict(list)
    for e in ev:
        if e["ph"] == "X":
            t0 = _ns(e["ts"])
            slices[(e["pid"], e["tid"])].append((t0, t0 + _ns(e["dur"])))
    outside = [e for e in ev if e["ph"] in "stf" and not any(
        a <= _ns(e["ts"]) <= b for a, b in slices[(e["pid"], e["tid"])])]
    assert outside == []
    for spans in slices.values():          # a track's slices nest (lanes take overlaps)
        spans.sort()
        for (_a0, a1), (b0, b1) in zip(spans, spans[1:], strict=False):
            assert not (b0 < a1 < b1)


@pytest.fixture(scope="module")
def gemm(tmp_path_factory):
    d = tmp_path_factory.mktemp("pfg")
    s = run_workload("gemm", params={"M": 64, "N": 64, "K": 64}, out=d / "data",
                     verify_data=False, make_report=False, attribute=False)
    out = d / "gemm.json"
    export_perfetto(s.run_dir, out)
    return json.loads(out.read_text()), s.run_dir


def _series(ev):
    """(pid, counter track name as Perfetto names it: '<name> <arg>') -> [(ns, value)]."""
    out = defaultdict(list)
    for e in ev:
        if e["ph"] == "C":
            (key, v), = e["args"].items()
            out[(e["pid"], f"{e['name']} {key}")].append((_ns(e["ts"]), v))
    return out


def test_counter_tracks_bytes_in_flight_per_link_and_per_cube(ring):
    ev = ring["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M"
             and e["name"] == "process_name"}
    series = _series(ev)
    links = {k: v for k, v in series.items() if k[1].startswith("link ")
             and k[1].endswith(" bytes in flight")}
    assert links and all(procs[pid].endswith("fabric") for pid, _ in links)
    for pts in series.values():
        ts = [t for t, _ in pts]
        assert ts == sorted(ts) and len(set(ts)) == len(ts)     # one value per instant
    for (_pid, name), pts in links.items():
        assert min(v for _, v in pts) >= 0 and pts[-1][1] == 0, name    # drained at the end
    # each link slice: its bytes are in flight on its link's counter while it lasts
    threads = {(e["pid"], e["tid"]): e["args"]["name"].split(" [")[0] for e in ev
               if e["ph"] == "M" and e["name"] == "thread_name"}
    checked = 0
    for e in ev:
        if (e["ph"] == "X" and e["cat"] == "fabric" and _ns(e["dur"]) > 0   # (0 ns: +b -b)
                and threads[(e["pid"], e["tid"])].startswith("link ")):
            pts = links[(e["pid"], threads[(e["pid"], e["tid"])] + " bytes in flight")]
            t = _ns(e["ts"])
            level = [v for ts, v in pts if ts <= t][-1]
            assert level >= e["args"]["nbytes"]
            checked += 1
    assert checked > 100
    # per process: the sum over its links, at every instant
    for pid in {pid for pid, _ in links}:
        total = dict(series[(pid, "links bytes in flight")])
        mine = [pts for (p, _), pts in links.items() if p == pid]
        for t, v in total.items():
            assert v == sum(next((x for ts, x in reversed(pts) if ts <= t), 0) for pts in mine)


def test_counter_tracks_link_util_per_window(ring):
    series = _series(ring["traceEvents"])
    util = {k: v for k, v in series.items() if k[1].endswith(" util")}
    assert util and all(k[1].startswith("link ") for k in util)
    ends = {ring["otherData"]["makespan_ns"]}
    for pts in util.values():
        assert len(pts) == 21 and all(0.0 <= v <= 1.0 for _, v in pts)   # 20 windows + end
        assert pts[-1] == (round(next(iter(ends))), 0.0)
    assert max(v for pts in util.values() for _, v in pts) > 0.1


def test_counter_tracks_hbm_waiting_and_in_service(gemm):
    doc, run_dir = gemm
    series = _series(doc["traceEvents"])
    waiting = {k: v for k, v in series.items() if k[1].endswith(" waiting")}
    serving = {k: v for k, v in series.items() if k[1].endswith(" in service")}
    assert waiting and {k[1].rsplit(" ", 1)[0] for k in waiting} == {
        k[1].rsplit(" ", 2)[0] for k in serving}
    assert all(k[1].startswith("hbm_ctrl.pe") for k in waiting)
    # the time integral of 'waiting' is the HBM queueing of the run, in integer ns
    from kbtrace.analysis.run import open_run
    with open_run(run_dir) as r:
        rows = r.sql("SELECT t_enter_ns, t_leave_ns, queue_ns FROM hops "
                     "WHERE CAST(stage AS VARCHAR) = 'hbm'").rows()
    want = sum(min(max(round(a + q), round(a)), max(round(a), round(b))) - round(a)
               for a, b, q in rows)
    got = 0
    for pts in waiting.values():
        assert pts[-1][1] == 0 and min(v for _, v in pts) >= 0
        got += sum((b[0] - a[0]) * a[1] for a, b in zip(pts, pts[1:], strict=False))
    assert want > 0 and got == want
    assert max(v for pts in serving.values() for _, v in pts) >= 1


def test_counter_events_are_capped_at_one_time_for_every_counter(ring, tmp_path, monkeypatch):
    import kbtrace.analysis.perfetto as pf

    n = sum(1 for e in ring["traceEvents"] if e["ph"] == "C")
    monkeypatch.setattr(pf, "MAX_COUNTER_EVENTS", n // 3)
    run_dir = ring["otherData"]["run"]
    export_perfetto(run_dir, tmp_path / "cut.json")
    doc = json.loads((tmp_path / "cut.json").read_text())
    kept = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert 0 < len(kept) <= n // 3
    assert doc["otherData"]["counter_events_left_out"] == n - len(kept)
    last = max(_ns(e["ts"]) for e in kept)
    before = [e for e in ring["traceEvents"] if e["ph"] == "C" and _ns(e["ts"]) < last]
    assert len(before) < len(kept)     # every counter is whole up to the cut


@pytest.mark.parametrize("cap", [1, 37, 71])
def test_fabric_slices_under_the_cap_are_the_earliest_in_slice_order(gemm, tmp_path,
                                                                     monkeypatch, cap):
    """Past ``MAX_FABRIC_SLICES`` the slices are the first ones of the ORDER BY over every
    fabric hop (the cut by entry time only narrows what is sorted), the rest counted."""
    import kbtrace.analysis.perfetto as pf
    from kbtrace.analysis.run import open_run

    _, run_dir = gemm
    monkeypatch.setattr(pf, "MAX_FABRIC_SLICES", cap)
    export_perfetto(run_dir, tmp_path / "cap.json")
    doc = json.loads((tmp_path / "cap.json").read_text())
    got = [(e["args"]["op_id"], e["args"]["tile"], e["ts"]) for e in doc["traceEvents"]
           if e["ph"] == "X" and e["cat"] == "fabric"]
    with open_run(run_dir) as r:
        fab = "WHERE link_idx >= 0 OR CAST(stage AS VARCHAR) = 'hbm'"
        n = r.sql(f"SELECT count(*) FROM hops {fab}").item()
        want = r.con.sql(f"SELECT op_id, tile, t_enter_ns FROM hops {fab} ORDER BY "
                         f"t_enter_ns, op_id, tile, hop LIMIT {cap}").fetchall()
    assert n > cap
    assert got == [(o, t, us(round(s))) for o, t, s in want]
    assert doc["otherData"]["fabric_slices_left_out"] == n - cap


@pytest.mark.parametrize("cap", [1, 71])
def test_fabric_cut_counted_by_the_island_scan_gives_the_same_timeline(gemm, tmp_path,
                                                                        monkeypatch, cap):
    """``Run.materialize``'s island scan counts the fabric hops and their ``cap``-th earliest
    entry (``_earliest.Earliest``); the timeline of that open run is the one of a fresh run,
    which scans the hops itself."""
    import kbtrace.analysis.perfetto as pf
    from kbtrace.analysis.run import open_run

    _, run_dir = gemm
    monkeypatch.setattr(pf, "MAX_FABRIC_SLICES", cap)
    export_perfetto(run_dir, tmp_path / "own.json")
    with open_run(run_dir) as r:
        r.materialize()
        assert r._fabric is not None and r._fabric.complete and r._fabric.k == cap
        n = r.sql("SELECT count(*) FROM hops WHERE link_idx >= 0 OR "
                  "CAST(stage AS VARCHAR) = 'hbm'").item()
        assert r._fabric.n == n > cap
        export_perfetto(r, tmp_path / "shared.json")
    assert (tmp_path / "shared.json").read_bytes() == (tmp_path / "own.json").read_bytes()


def test_earliest_keeps_the_kth_earliest_of_a_stream():
    import numpy as np

    from kbtrace.analysis._earliest import Earliest

    e = Earliest(3)
    for batch in ([5.0, 1.0], [9.0, 2.0, np.nan], [2.0, 7.0], [0.5]):
        e.add(np.array(batch))
    assert e.n == 8 and e.cut() == 2.0 and sorted(e.low.tolist()) == [0.5, 1.0, 2.0]
    few = Earliest(3)
    few.add(np.array([1.0, 2.0, 3.0]))
    assert few.cut() is None            # no more than k: no cut
    nan = Earliest(2)
    nan.add(np.array([np.nan, np.nan, 1.0]))
    assert nan.cut() is None            # the 2nd earliest is a NaN: no cut, as before
    nan.add(np.array([0.0]))
    assert nan.cut() == 1.0             # (a NaN held filtered nothing: 0.0 went in)

"""Perfetto export of a real run: fabric tracks (links, HBM controllers), one flow per
transfer through its links, integer-ns timestamps that Perfetto parses exactly.

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

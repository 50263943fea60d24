"""Host tensors and host <-> device copies: h2d / d2h rows, ordering with launches in capture
and replay, verify through copies, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kbtrace.analysis import verify
from kbtrace.capture import capture, execute
from kbtrace.capture.hostcopy import HOST_BASE
from kbtrace.cli import main
from kbtrace.errors import CaptureError
from kbtrace.host import DPPolicy
from kbtrace.replay import ReplayOptions, replay
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small():
    return compile_topology(ROOT / "topologies" / "small.yaml")


def double(tl, x, y):
    v = tl.load(x, (4, 4), "f32")
    tl.store(y, v * 2.0)


def build_roundtrip(w, p):
    xh = w.host_tensor("xh", (4, 8), "f32", init=w.random(1))
    dp = DPPolicy(cube="column_wise", pe="replicate", num_cubes=2, num_pes=1)
    x = w.tensor("x", (4, 8), "f32", dp=dp)
    y = w.tensor("y", (4, 8), "f32", dp=dp)
    w.copy_to_device(xh, x)
    w.launch(double, args=(x, y), on=x)
    yh = w.copy_to_host(y)
    w.output(yh, reference=lambda v: v["xh"] * 2.0)


ROUNDTRIP = SimpleNamespace(NAME="roundtrip", PARAMS={}, build=build_roundtrip)


@pytest.fixture(scope="module")
def roundtrip(small, tmp_path_factory):
    d = tmp_path_factory.mktemp("rt")
    tr = capture(ROUNDTRIP, small, out_dir=d / "trace")
    runs = {f: replay(tr, small, ReplayOptions(fidelity=f, out_dir=str(d / f)))
            for f in ("fast", "flit")}
    return tr, runs


def test_copies_are_h2d_and_d2h_rows_in_host_program_order(roundtrip):
    tr, _ = roundtrip
    rows = tr.ops().to_pylist()
    got = [(o["kind"], o["launch"], o["program"], o["seq"], o["cube"], o["src_space"],
            o["dst_space"], o["nbytes"], o["mem_strides"]) for o in rows]
    assert got == [
        ("h2d", -1, -1, 0, 0, "host", "hbm", 64, [8, 1]),
        ("h2d", -1, -1, 1, 1, "host", "hbm", 64, [8, 1]),
        ("load", 0, 0, 0, 0, "hbm", "tcm", 64, []), ("math", 0, 0, 1, 0, None, "tcm", 64, []),
        ("store", 0, 0, 2, 0, "tcm", "hbm", 64, []),
        ("load", 0, 1, 0, 1, "hbm", "tcm", 64, []), ("math", 0, 1, 1, 1, None, "tcm", 64, []),
        ("store", 0, 1, 2, 1, "tcm", "hbm", 64, []),
        ("d2h", -1, -1, 2, 0, "hbm", "host", 64, [8, 1]),
        ("d2h", -1, -1, 3, 1, "hbm", "host", 64, [8, 1])]
    # column shard c of the host tensor starts c * 4 floats in; loads depend on their h2d,
    # each d2h on the store that wrote its shard
    assert [rows[i]["src_addr"] - HOST_BASE for i in (0, 1)] == [0, 16]
    assert rows[2]["deps"] == [0] and rows[5]["deps"] == [1]
    assert rows[8]["deps"] == [4] and rows[9]["deps"] == [7]
    assert tr.meta["reference_check"]["y_host"]["ok"]
    assert tr.op_counts == {"d2h": 2, "h2d": 2, "load": 2, "math": 2, "store": 2}
    mem = {m["tensor"]: m for m in tr.memory().to_pylist() if m["role"] != "reference"}
    assert mem["xh"]["space"] == "host" and mem["xh"]["sip"] is None
    assert mem["y_host"]["role"] == "output"


@pytest.mark.parametrize("fid", ["fast", "flit"])
def test_replay_orders_copies_and_launches_and_verify_passes_through_copies(roundtrip, fid):
    _, runs = roundtrip
    run = runs[fid]
    t = {o["op_id"]: o for o in run.op_timing().to_pylist()}
    launch = json.loads((run.run_dir / "run.json").read_text())["launches"][0]
    assert t[1]["t_issue_ns"] >= t[0]["t_end_ns"]              # copies one after another
    assert launch["t_launch_ns"] >= t[1]["t_end_ns"]           # launch after the h2d copies
    assert t[8]["t_issue_ns"] >= launch["t_done_ns"]           # d2h after the launch is done
    assert t[8]["engine"] == "sip0.io0.pcie_ep"
    res = verify(run.run_dir)
    assert res.ok, res.text()


def test_copied_values_are_what_verify_checks(roundtrip):
    """Executing the d2h before the kernel's stores gives zeros in y_host: the output
    depends on the order of copies and launches, so verify would catch a replay that
    reordered them."""
    tr, _ = roundtrip
    want = tr.execute().outputs["y_host"]
    assert np.abs(want).min() > 0
    bad = execute(tr.ops(), tr.memory(), order=[0, 1, 8, 9, 2, 3, 4, 5, 6, 7]).outputs["y_host"]
    assert (bad == 0).all()


def test_kernels_see_copied_values_during_capture(small, tmp_path):
    """A load after an h2d reads the copied values (capture may branch on them)."""
    seen = []

    def k(tl, x):
        seen.append(tl.load(x, (3,), "i32").data.tolist())

    def build(w, p):
        xh = w.host_tensor("xh", (3,), "i32", init=[7, 8, 9])
        x = w.tensor("x", (3,), "i32")
        w.copy_to_device(xh, x)
        w.launch(k, args=(x,), grid=(1, 1))
    capture(SimpleNamespace(NAME="t", PARAMS={}, build=build), small, out_dir=tmp_path / "t")
    assert seen == [[7, 8, 9]]


def test_replicated_tensors_get_every_replica_and_give_back_one(small, tmp_path):
    def build(w, p):
        xh = w.host_tensor("xh", (2, 8), "f32", init=w.random(0))
        x = w.tensor("x", (2, 8), "f32", dp=DPPolicy(num_cubes=2, num_pes=2))
        w.copy_to_device(xh, x)
        w.copy_to_host(x)
    tr = capture(SimpleNamespace(NAME="t", PARAMS={}, build=build), small, out_dir=tmp_path / "t")
    rows = tr.ops().to_pylist()
    assert [(o["kind"], o["cube"], o["pe"], o["mem_strides"]) for o in rows] == [
        ("h2d", 0, 0, []), ("h2d", 0, 1, []), ("h2d", 1, 0, []), ("h2d", 1, 1, []),
        ("d2h", 0, 0, [])]


@pytest.mark.parametrize("call,match", [
    (lambda w: w.copy_to_device(SimpleNamespace(name="ghost"), w.tensor("x", (4,))),
     "copy_to_device of 'ghost', which is not a tensor of this workload"),
    (lambda w: w.copy_to_host(w.host_tensor("h", (4,))),
     "tensor 'h' lives in host, expected one in device HBM"),
    (lambda w: w.copy_to_device(w.host_tensor("h", (4,)), w.tensor("x", (8,))),
     r"\(4,\) f32 vs \(8,\) f32; copies need equal shapes and dtypes"),
    (lambda w: w.launch(double, args=(w.host_tensor("h", (4,)), 0), grid=(1, 1)),
     "lives in host memory, which kernels cannot address"),
])
def test_bad_copies_are_one_clear_error(small, tmp_path, call, match):
    with pytest.raises(CaptureError, match=match):
        capture(SimpleNamespace(NAME="t", PARAMS={}, build=lambda w, p: call(w)), small,
                out_dir=tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_cli_bad_copy_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    wl = tmp_path / "bad.py"
    wl.write_text("def build(w, p):\n    w.copy_to_host(w.host_tensor('h', (4,)))\n")
    rc = main(["capture", str(wl), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "lives in host" in err, err
    assert not (tmp_path / "out").exists()

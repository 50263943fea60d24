"""Ranks (rank = SIP), per-rank tensors and arguments, sparse launches, ``tl`` hardware ids."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.compute as pc
import pytest

from kbtrace.capture import capture
from kbtrace.errors import CaptureError
from kbtrace.host import DPPolicy
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def two_sips():
    """small.yaml (4 cubes x 8 PEs) with 2 SIPs."""
    return compile_topology(ROOT / "topologies" / "small.yaml",
                            overrides={"system.sips.count": "2"})


def wl(build, params=None):
    return SimpleNamespace(NAME="t", PARAMS=params or {}, build=build)


def ops_of(tr):
    return tr.ops().to_pylist()


def test_world_and_per_rank_tensors_and_arguments(two_sips, tmp_path):
    """Each rank gets its own tensor and scalar; kernels find their SIP with tl.sip_id()."""
    seen = []

    def k(tl, x, out, scale):
        seen.append((tl.sip_id(), tl.cube_id(), tl.pe_id(), tl.num_sips(), tl.num_cubes(),
                     tl.num_pes(), tl.program_id(0), tl.program_id(1), tl.num_programs(0),
                     tl.num_programs(1), scale))
        v = tl.load(x, (4,), "f32")
        tl.store(out, v * scale)

    def build(w, p):
        assert w.world_size == 2 and list(w.ranks) == [0, 1]
        xs = [w.tensor(f"x{r}", (4,), "f32", init=np.full(4, r + 1.0), sip=r) for r in w.ranks]
        outs = [w.tensor(f"y{r}", (4,), "f32", sip=r) for r in w.ranks]
        w.launch(k, args=(w.per_rank(xs), w.per_rank(outs), w.per_rank(lambda r: 10.0 * (r + 1))),
                 sips=[0, 1], cubes=0, pes=0)
        for r in w.ranks:
            w.output(outs[r], reference=lambda v, r=r: v[f"x{r}"] * 10.0 * (r + 1))

    tr = capture(wl(build), two_sips, out_dir=tmp_path / "t")
    assert seen == [(0, 0, 0, 2, 4, 8, 0, 0, 1, 2, 10.0), (1, 0, 0, 2, 4, 8, 0, 1, 1, 2, 20.0)]
    assert all(c["ok"] for c in tr.meta["reference_check"].values())
    placed = {(o["sip"], o["cube"], o["pe"]) for o in ops_of(tr)}
    assert placed == {(0, 0, 0), (1, 0, 0)}


def test_sparse_launch_runs_only_the_chosen_pes(two_sips, tmp_path):
    """The new user's case: programs on SIP 1 only, no dummy programs that return at once."""
    def k(tl, x):
        tl.load(x, (2,), "f32")

    def build(w, p):
        x = w.tensor("x", (2,), "f32", sip=1)
        w.launch(k, args=(x,), sips=1, cubes=[1, 3], pes=[2, 5, 7])

    tr = capture(wl(build), two_sips, out_dir=tmp_path / "t")
    rows = ops_of(tr)
    assert [(o["sip"], o["cube"], o["pe"], o["pid0"], o["pid1"]) for o in rows] == [
        (1, c, pe, i, j) for j, c in enumerate([1, 3]) for i, pe in enumerate([2, 5, 7])]
    assert tr.meta["launches"][0]["programs"] == 6 and tr.meta["launches"][0]["grid"] == [3, 2]


def test_launch_on_a_tensor_runs_where_its_shards_are(two_sips, tmp_path):
    def k(tl, x, y):
        v = tl.load(x, (2, 4), "f32")
        tl.store(y, v + 1.0)

    def build(w, p):
        dp = DPPolicy(cube="row_wise", pe="column_wise", num_cubes=2, num_pes=2)
        x = w.tensor("x", (4, 8), "f32", init=w.random(3), dp=dp, sip=1)
        y = w.tensor("y", (4, 8), "f32", dp=dp, sip=1)
        w.launch(k, args=(x, y), on=x)
        w.output(y, reference=lambda v: v["x"] + 1.0)

    tr = capture(wl(build), two_sips, out_dir=tmp_path / "t")
    assert tr.meta["reference_check"]["y"]["ok"]
    loads = tr.ops().filter(pc.equal(tr.ops()["kind"], "load")).to_pylist()
    assert [(o["sip"], o["cube"], o["pe"]) for o in loads] == [
        (1, c, p) for c in range(2) for p in range(2)]
    mem = tr.memory().to_pylist()
    xs = [(m["sip"], m["cube"], m["pe"], m["offset"], m["shape"]) for m in mem if m["tensor"] == "x"]
    assert xs == [(1, 0, 0, [0, 0], [2, 4]), (1, 0, 1, [0, 4], [2, 4]),
                  (1, 1, 0, [2, 0], [2, 4]), (1, 1, 1, [2, 4], [2, 4])]


@pytest.mark.parametrize("kw,match", [
    ({"sips": 2}, "launch on SIP 2, which 'small' does not have"),
    ({"pes": [8]}, "launch on PE 8, which 'small' does not have"),
    ({"cubes": [0, 0]}, "list each cube once"),
    ({"sips": 0, "grid": (1, 1)}, "grid= or sips/cubes/pes/on=, not both"),
])
def test_a_launch_on_pes_that_do_not_exist_is_one_error(two_sips, tmp_path, kw, match):
    def build(w, p):
        w.launch(lambda tl: None, **kw)
    with pytest.raises(CaptureError, match=match):
        capture(wl(build), two_sips, out_dir=tmp_path / "t")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("call,match", [
    (lambda w: w.tensor("x", (4,), sip=2), r"rank/SIP 2 is out of range.*ranks 0\.\.1"),
    (lambda w: w.tensor("x", (4,), dp=DPPolicy(), sip=-1), "rank/SIP -1 is out of range"),
    (lambda w: w.per_rank({3: 1.0}), "rank/SIP 3 is out of range"),
    (lambda w: w.tensor("x", (6, 4), dp=DPPolicy(cube="row_wise")),
     "splits rows 6 over 4 cubes, which does not divide"),
    (lambda w: w.tensor("x", (4,), dp=DPPolicy(), pe=(0, 0, 0)), "only one of pe=, shard= and dp="),
])
def test_bad_rank_and_placement_input(two_sips, tmp_path, call, match):
    with pytest.raises(CaptureError, match=match):
        capture(wl(lambda w, p: call(w)), two_sips, out_dir=tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_per_rank_argument_missing_a_launched_rank(two_sips, tmp_path):
    def build(w, p):
        w.launch(lambda tl, s: None, args=(w.per_rank({0: 1}),), sips=[0, 1], cubes=0, pes=0)
    with pytest.raises(CaptureError, match="no value for rank 1"):
        capture(wl(build), two_sips, out_dir=tmp_path / "t")


@pytest.mark.parametrize("body,match", [
    ("w.tensor('x', (6, 4), dp=DPPolicy(cube='row_wise'))", "does not divide"),
    ("w.tensor('x', (4,), sip=5)", "rank/SIP 5 is out of range"),
    ("w.launch(lambda tl: None, pes=[9])", "launch on PE 9"),
    ("w.copy_to_device(w.host_tensor('h', (4,)), 'x')", "not a tensor of this workload"),
])
def test_cli_bad_host_program_exits_2_one_line_nothing_written(tmp_path, capsys, body, match):
    from kbtrace.cli import main
    wf = tmp_path / "bad.py"
    wf.write_text(f"from kbtrace.host import DPPolicy\n\ndef build(w, p):\n    {body}\n")
    rc = main(["capture", str(wf), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and match in err, err
    assert not (tmp_path / "out").exists()

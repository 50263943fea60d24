"""kbtrace sweep: points = traces x topologies x fidelities x grid, one replay each, into a
hive-partitioned directory with points.parquet; failures recorded; deterministic; resumable."""

from __future__ import annotations

import json
import sys
import types

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kbtrace
from kbtrace import schema
from kbtrace.analysis.reporter import report
from kbtrace.analysis.sweepreport import point_frames, tuning_frame, workload_grid_keys
from kbtrace.capture import capture
from kbtrace.cli import main
from kbtrace.errors import OutputError, SweepError
from kbtrace.replay import ReplayOptions, _sweepsafe, replay
from kbtrace.replay.sweep import run_sweep
from kbtrace.replay.sweep_config import load_config, parse_grid_items
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR

ROOT = TOPO_DIR.parent
SMALL = str(TOPO_DIR / "small.yaml")
BW = "cube.hbm.pc_bw_gbps"


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep_trace") / "gemm"
    capture(ROOT / "capture" / "gemm.py", compile_topology(SMALL), {"M": 128, "N": 128, "K": 128},
            d)
    return d


def cfg(trace, **kw):
    return {"traces": [str(trace)], "topologies": [SMALL], "grid": {BW: [8, 32]}, **kw}


def files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*.parquet"))}


def test_points_equal_direct_replays_and_do_not_depend_on_the_executor(trace, tmp_path,
                                                                      monkeypatch):
    a = run_sweep(cfg(trace, fidelity=["fast", "flit"]), tmp_path / "a")
    assert a.ok and a.reused == 0
    t = a.points
    assert t.schema.names == [f.name for f in schema.SWEEP_POINTS] + [BW]
    schema.check_schema(pq.read_schema(tmp_path / "a" / "points.parquet"), schema.SWEEP_POINTS,
                        "points.parquet")
    rows = t.to_pylist()
    assert [(r["point"], r["fidelity"], r[BW], r["status"]) for r in rows] == [
        (0, "fast", 8, "ok"), (1, "fast", 32, "ok"), (2, "flit", 8, "ok"), (3, "flit", 32, "ok")]
    assert rows[0]["run_dir"] == f"trace=gemm/topology=small/fidelity=fast/{BW}=8"
    assert rows[0]["makespan_ns"] > rows[1]["makespan_ns"]     # a quarter of the HBM bandwidth
    for r in rows:                      # each point is exactly the replay it names
        direct = tmp_path / f"direct{r['point']}"
        run = replay(trace, compile_topology(SMALL, overrides={BW: r[BW]}),
                     ReplayOptions(fidelity=r["fidelity"], out_dir=str(direct)))
        assert (run.run_id, run.makespan_ns, run.hops) == (r["run_id"], r["makespan_ns"], r["hops"])
        for f in ("op_timing.parquet", "hops.parquet"):
            assert (tmp_path / "a" / r["run_dir"] / f).read_bytes() == (direct / f).read_bytes()
        pj = json.loads((tmp_path / "a" / r["run_dir"] / "point.json").read_text())
        assert (pj["status"], pj["params"], pj["point"]) == ("ok", {BW: r[BW]}, r["point"])
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS", 0)    # workers even for tiny points
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS_FORK", 0)
    b = run_sweep(cfg(trace, fidelity=["fast", "flit"]), tmp_path / "b", jobs=2)
    assert b.ok
    assert files(tmp_path / "a") == files(tmp_path / "b")       # points.parquet included
    assert (tmp_path / "a" / "sweep.json").read_bytes() == (tmp_path / "b" / "sweep.json").read_bytes()


def test_failed_point_is_recorded_and_the_others_run(trace, tmp_path, capsys):
    res = run_sweep(cfg(trace, grid={BW: [16, -1]}), tmp_path / "s")
    assert not res.ok
    assert [f["point"] for f in res.failed] == [1]
    assert "cube.hbm.pc_bw_gbps = -1.0: bandwidth must be > 0" in res.failed[0]["error"]
    rows = res.points.to_pylist()
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert rows[1]["makespan_ns"] is None and rows[1]["run_id"] is None
    bad = tmp_path / "s" / rows[1]["run_dir"]
    assert json.loads((bad / "point.json").read_text())["status"] == "error"
    assert not (bad / "op_timing.parquet").exists()
    # the CLI: the table, then one error line naming the point; exit 1
    (tmp_path / "c.yaml").write_text(json.dumps(cfg(trace, grid={BW: [-1, 16, 64]})))
    assert main(["sweep", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "cli")]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("point") and lines[0].endswith("makespan_ns  vs workload's first")
    assert lines[2].split() == ["0", "gemm", "small", "fast", "-1", "error", "-"]
    assert lines[3].split()[:5] == ["1", "gemm", "small", "fast", "16"]
    assert lines[3].endswith(" 1.000x")
    assert lines[4].split()[:5] == ["2", "gemm", "small", "fast", "64"]
    assert float(lines[4].split()[-1][:-1]) < 1.0     # relative to point 1
    assert lines[5] == "(3 rows)"
    assert lines[-1] == f"next: kbtrace report {tmp_path / 'cli'}   (makespan against each grid " \
                        "parameter, per-point bottlenecks)"
    assert err.strip().splitlines()[-1].startswith(
        "kbtrace: error: sweep: 1 of 3 point(s) failed; first: point 0 "
        f"(trace=gemm/topology=small/fidelity=fast/{BW}=-1): ")


def test_resume_reuses_finished_points_only(trace, tmp_path):
    out = tmp_path / "s"
    first = run_sweep(cfg(trace), out)
    before = files(out)
    again = run_sweep(cfg(trace), out, resume=True)
    assert again.reused == 2 and files(out) == before
    # a point whose outputs are gone is replayed again; the others are reused
    (out / first.points.column("run_dir")[1].as_py() / "run.json").unlink()
    third = run_sweep(cfg(trace), out, resume=True)
    assert third.reused == 1 and files(out) == before
    assert run_sweep(cfg(trace), out).reused == 0            # without resume: all replayed


def test_sweep_directory_must_be_this_sweep(trace, tmp_path):
    run_sweep(cfg(trace), tmp_path / "s")
    with pytest.raises(SweepError, match="holds a different sweep"):
        run_sweep(cfg(trace, grid={BW: [8, 16]}), tmp_path / "s")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(OutputError, match="other: exists and was not written by kbtrace"):
        run_sweep(cfg(trace), tmp_path / "other")
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]


def test_open_run_on_a_sweep_names_runs_by_partition(trace, tmp_path):
    run_sweep(cfg(trace, grid={BW: [8, 16, 32]}), tmp_path / "s")
    with kbtrace.open_run(tmp_path / "s") as rs:
        got = rs.sql(f'SELECT p."{BW}", r.name, r.makespan_ns FROM points p JOIN runs r '
                     "ON r.name = p.run_dir ORDER BY p.point").rows()
        assert [g[0] for g in got] == [8, 16, 32]                 # point order, not "16" < "8"
        assert got[0][1] == f"trace=gemm/topology=small/fidelity=fast/{BW}=8"
        assert got[0][2] > got[1][2] > got[2][2]
        assert rs.sql("SELECT run_name, count(*) FROM op_timing GROUP BY ALL ORDER BY 1").rows() \
            == [(f"trace=gemm/topology=small/fidelity=fast/{BW}={v}", 128) for v in (16, 32, 8)]
    # plain hive partitioning: the grid key is a typed column
    got = duckdb.sql(f"SELECT \"{BW}\", max(t_end_ns) FROM read_parquet("
                     f"'{tmp_path}/s/**/op_timing.parquet', hive_partitioning=true) "
                     "GROUP BY ALL ORDER BY 1").fetchall()
    assert [g[0] for g in got] == [8, 16, 32]


def test_workloads_are_captured_once_per_topology(tmp_path):
    res = run_sweep({"workloads": [{"path": str(ROOT / "capture" / "softmax.py"),
                                    "params": {"R": 32}, "name": "sm32"}],
                     "topologies": [SMALL, str(TOPO_DIR / "tiny.yaml")], "grid": {BW: [16]}},
                    tmp_path / "s")
    assert res.ok
    assert sorted(p.name for p in (tmp_path / "s" / "traces").iterdir()) == ["sm32-small",
                                                                            "sm32-tiny"]
    assert [(r["trace"], r["topology"]) for r in res.points.to_pylist()] == [
        ("sm32", "small"), ("sm32", "tiny")]


@pytest.mark.parametrize("conf, msg", [
    ({"topologies": [SMALL]}, "nothing to replay; add traces:"),
    ({"traces": ["T"], "topologies": [SMALL], "grids": {}}, "unknown key 'grids'"),
    ({"traces": ["T"]}, "topologies: expected a non-empty list"),
    ({"traces": ["T"], "topologies": [SMALL], "fidelity": ["exact"]}, "unknown 'exact'"),
    ({"traces": ["T"], "topologies": [SMALL], "grid": [1]}, "grid: expected a mapping"),
    ({"traces": ["T"], "topologies": [SMALL], "grid": {BW: []}}, f"grid.{BW}: expected a non-empty"),
    ({"traces": ["T"], "topologies": [SMALL], "grid": {BW: ["a/b"]}}, "cannot name a directory"),
    ({"traces": ["T"], "topologies": [SMALL], "grid": {BW: [8, 8]}}, "repeated value"),
    ({"traces": ["T"], "topologies": [SMALL], "grid": {"cube.hbm.pc_bw": [8]}},
     "grid: override 'cube.hbm.pc_bw': unknown key 'pc_bw' under cube.hbm; did you mean "
     "'pc_bw_gbps'"),
    ({"traces": ["T"], "topologies": [SMALL], "grid": {"cube.hbm": [8]}}, "names a section"),
    ({"traces": ["a/T", "b/T"], "topologies": [SMALL]}, "two traces are named 'T'"),
    ({"workloads": [{"path": "w.py", "param": {}}], "topologies": [SMALL]}, "unknown key 'param'"),
    ({"workloads": [{"path": "w.py", "grid": [16]}], "topologies": [SMALL]},
     "workloads: w.py: grid: expected a mapping"),
    ({"workloads": [{"path": "w.py", "grid": {"BM": [16, 16]}}], "topologies": [SMALL]},
     "workloads: w.py: grid.BM: repeated value"),
    ({"workloads": [{"path": "w.py", "params": {"BM": 8}, "grid": {"BM": [16]}}],
      "topologies": [SMALL]}, "'BM' is in both params and grid"),
    ({"workloads": [{"path": "w.py", "grid": {"BM": [16, "x"]}}], "topologies": [SMALL]},
     "grid.BM: values .* mix kinds"),
    ({"workloads": [{"path": "w.py", "grid": {"BM": [16]}}, {"path": "v.py", "name": "x",
                                                           "grid": {"BM": ["a"]}}],
      "topologies": [SMALL]}, "grid key 'BM' has both number and word values"),
    ({"workloads": ["g/w.py", {"path": "w.py", "grid": {"BM": [16]}}], "topologies": [SMALL]},
     "two workloads are named 'w'"),
    ({"traces": ["T"], "topologies": [SMALL], "grid": {BW: [8, "x"]}}, f"grid.{BW}: .* mix kinds"),
])
def test_bad_config_is_refused_with_the_key(conf, msg):
    with pytest.raises(SweepError, match="sweep config: .*" + msg.replace("[", r"\[")
                       .replace("(", r"\(")):
        load_config(conf)


def test_bad_inputs_name_the_file(trace, tmp_path):
    with pytest.raises(SweepError, match=r"nope.yaml: no such sweep config"):
        load_config(tmp_path / "nope.yaml")
    assert main(["sweep", str(tmp_path / "nope.yaml")]) == 2     # a config error: nothing ran
    (tmp_path / "nt").mkdir()
    with pytest.raises(SweepError, match="is not a trace directory"):
        run_sweep({"traces": [str(tmp_path / "nt")], "topologies": [SMALL]}, tmp_path / "s")
    with pytest.raises(SweepError, match="expected KEY=V1,V2"):
        parse_grid_items(["cube.hbm.pc_bw_gbps"])
    assert parse_grid_items([f"{BW}=8,16.5,x"]) == {BW: [8, 16.5, "x"]}
    c = load_config(cfg(trace), {BW: [4]})                       # --grid replaces an axis
    assert c.grid == ((BW, (4,)),)


def test_ray_executor(trace, tmp_path, monkeypatch):
    """Without ray: one actionable line. With it (here a stand-in exposing the calls the
    executor makes: init, remote, wait, get), points run as remote tasks."""
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SweepError, match=r"ray is not installed; pip install 'kbtrace\[ray\]'"):
        run_sweep(cfg(trace), tmp_path / "none", executor="ray")
    calls: list[str] = []

    class Ref:                          # an object ref: hashable, resolved by get()
        def __init__(self, value):
            self.value = value

    def remote(fn):
        calls.append("remote")
        return types.SimpleNamespace(remote=lambda job: Ref(fn(job)))

    fake = types.SimpleNamespace(
        is_initialized=lambda: False, init=lambda: calls.append("init"), remote=remote,
        wait=lambda pending, num_returns: (pending[:num_returns], pending[num_returns:]),
        get=lambda ref: ref.value)
    monkeypatch.setitem(sys.modules, "ray", fake)
    res = run_sweep(cfg(trace), tmp_path / "ray", executor="ray")
    assert res.ok and calls == ["init", "remote"]
    local = run_sweep(cfg(trace), tmp_path / "local")
    assert files(tmp_path / "ray") == files(local.out_dir)


@pytest.mark.slow
def test_real_ray_cluster_gives_the_local_bytes(trace, tmp_path):
    """On a real local Ray cluster (``pip install 'kbtrace[ray]'``; ~5 s to start): every
    point's Parquet, points.parquet and sweep.json equal the in-process sweep's bytes."""
    ray = pytest.importorskip("ray")
    try:
        res = run_sweep(cfg(trace, fidelity=["fast", "flit"]), tmp_path / "ray", executor="ray")
    finally:
        ray.shutdown()
    local = run_sweep(cfg(trace, fidelity=["fast", "flit"]), tmp_path / "local")
    assert res.ok and len(res.points) == 4
    assert files(tmp_path / "ray") == files(local.out_dir)
    assert (tmp_path / "ray" / "sweep.json").read_bytes() == (local.out_dir / "sweep.json").read_bytes()


def test_config_paths_resolve_from_anywhere_and_take_names(tmp_path, monkeypatch):
    """Paths that exist stay as written (point keys do not move); others resolve under the
    repository or name a catalog entry, checked once the config is well formed."""
    monkeypatch.chdir(tmp_path)
    c = load_config({"workloads": ["capture/gemm.py", {"path": "softmax", "name": "sm"}],
                     "topologies": ["small", "topologies/tiny.yaml"]})
    assert [t.workload for t in c.traces] == [str(ROOT / "capture" / "gemm.py"),
                                               str(ROOT / "capture" / "softmax.py")]
    assert c.topologies == (str(ROOT / "topologies" / "small.yaml"),
                            str(ROOT / "topologies" / "tiny.yaml"))
    monkeypatch.chdir(ROOT)
    assert load_config({"workloads": ["capture/gemm.py"], "topologies": ["topologies/small.yaml"]}
                       ).topologies == ("topologies/small.yaml",)
    with pytest.raises(SweepError, match=r"sweep config: topologies: topology 'smal': no such "
                                         r"path.*did you mean 'small'\?"):
        load_config({"workloads": ["gemm"], "topologies": ["smal"]})


def test_workload_grid_expands_into_traces_and_columns(tmp_path):
    """A workload's own parameters as a grid axis (tile-size tuning): one trace per
    combination, named after it, and one typed points column per workload key."""
    wl = {"path": str(ROOT / "capture" / "gemm.py"), "params": {"M": 128, "N": 128, "K": 128},
          "grid": {"BM": [16, 32]}}
    c = load_config({"workloads": [wl], "topologies": [SMALL], "grid": {BW: [8, 32]}})
    assert [(t.name, t.base, dict(t.params)) for t in c.traces] == [
        ("gemm-BM16", "gemm", {"M": 128, "N": 128, "K": 128, "BM": 16}),
        ("gemm-BM32", "gemm", {"M": 128, "N": 128, "K": 128, "BM": 32})]
    assert c.workload_grid_keys == ("BM",)
    plain = load_config({"workloads": [str(ROOT / "capture" / "gemm.py")], "topologies": [SMALL]})
    assert "base" not in plain.as_json()["traces"][0]     # sweep.json of plain sweeps unchanged
    res = run_sweep(c, tmp_path / "s")
    assert res.ok
    t = res.points
    assert t.schema.names[-2:] == [BW, "BM"] and t.schema.field("BM").type == pa.int64()
    rows = [(r["trace"], r[BW], r["BM"]) for r in t.to_pylist()]
    assert rows == [("gemm-BM16", 8, 16), ("gemm-BM16", 32, 16), ("gemm-BM32", 8, 32),
                    ("gemm-BM32", 32, 32)]
    ms = {(r["BM"], r[BW]): r["makespan_ns"] for r in t.to_pylist()}
    assert ms[16, 8] > ms[32, 8] and ms[16, 32] > ms[32, 32]     # smaller tiles, more loads
    assert t.column("run_dir")[0].as_py() == f"trace=gemm-BM16/topology=small/fidelity=fast/{BW}=8"
    again = run_sweep(c, tmp_path / "s", resume=True)            # point keys are stable
    assert again.reused == 4
    points, _, params = point_frames(tmp_path / "s")
    assert params == [BW, "BM"] and set(points["workload"]) == {"gemm"}
    assert points["speedup"].min() == 1.0 and points.filter(
        pl.col("speedup") == 1.0)["BM"].to_list() == [16]          # slowest of the workload
    assert workload_grid_keys(tmp_path / "s") == ["BM"]
    best = tuning_frame(points, params, ["BM"])                    # the tuning answer
    assert best.select("workload", BW, "BM", "point").rows() == [("gemm", 8, 32, 2),
                                                                  ("gemm", 32, 32, 3)]
    assert best["speedup"].to_list() == pytest.approx([ms[16, 8] / ms[32, 8],
                                                       ms[16, 32] / ms[32, 32]])
    out = report(tmp_path / "s")
    assert (out / "tables" / "tuning.csv").read_text().splitlines()[0] == (
        f"workload,topology,fidelity,{BW},BM,makespan_ns,speedup,point")


def test_report_of_a_sweep_mixing_gridded_and_plain_workloads(trace, tmp_path):
    """A workload grid key is null for the other traces: the report still draws it, and the
    tuning table lists only the gridded workload."""
    res = run_sweep({"traces": [str(trace)],
                     "workloads": [{"path": str(ROOT / "capture" / "gemm.py"), "name": "g",
                                    "params": {"M": 64, "N": 64, "K": 64},
                                    "grid": {"BM": [16, 32]}}],
                     "topologies": [SMALL]}, tmp_path / "s")
    assert res.ok and res.points.column("BM").to_pylist() == [None, 16, 32]
    out = report(tmp_path / "s")
    tuning = pl.read_csv(out / "tables" / "tuning.csv")
    assert tuning.select("workload", "BM").rows() == [("g", 32)]
    points = pl.read_csv(out / "tables" / "points.csv")
    assert points["workload"].to_list() == ["gemm", "g", "g"]


def test_shipped_sweep_configs_load():
    """Every sweep config in replay/ (those with topologies:) is valid as shipped."""
    import yaml

    configs = [p for p in sorted((ROOT / "replay").glob("*.yaml"))
               if "topologies" in (yaml.safe_load(p.read_text()) or {})]
    assert {p.stem for p in configs} >= {"hbm_bandwidth", "gemm_tiles", "all_gather_links"}
    for p in configs:
        c = load_config(p)
        assert c.traces and c.topologies, p
    tiles = load_config(ROOT / "replay" / "gemm_tiles.yaml")
    assert len(tiles.traces) == 9 and tiles.workload_grid_keys == ("BM", "BN")
    links = load_config(ROOT / "replay" / "all_gather_links.yaml")
    assert len(links.traces) == 2 and links.workload_grid_keys == ("peers",)


def test_jobs_start_workers_only_when_the_work_pays_for_them(trace, tmp_path, monkeypatch):
    """-j 2 on points too small for worker start-up runs them here (no worker started);
    workloads captured in workers and points replayed there give the files a serial sweep
    gives (``Pool.LOCAL = False``: every job goes to a worker, none to this process)."""
    submitted = []
    submit = _sweepsafe.Pool.submit
    monkeypatch.setattr(_sweepsafe.Pool, "submit",
                        lambda self, fn, *a: submitted.append(a[0][0] if fn.__name__ == "_job"
                                                              else fn.__name__)
                        or submit(self, fn, *a))
    small = run_sweep(cfg(trace), tmp_path / "small", jobs=2)
    assert small.ok and submitted == []
    wl = {"workloads": [{"path": str(ROOT / "capture" / "gemm.py"), "grid": {"BM": [16, 32]},
                         "params": {"M": 64, "N": 64, "K": 64}}],
          "topologies": [SMALL], "grid": {BW: [8, 32]}}
    serial = run_sweep(wl, tmp_path / "serial")
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS", 0)
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS_FORK", 0)
    monkeypatch.setattr(_sweepsafe.Pool, "LOCAL", False)
    par = run_sweep(wl, tmp_path / "par", jobs=2)
    assert serial.ok and par.ok
    # two workers (-j 2 with this process idle), each announced by _ready, then 2 captures
    # and 4 points (one set of jobs: each point once its trace is captured), all in workers
    assert submitted[:2] == ["_ready", "_ready"]
    assert submitted[2:4] == ["capture"] * 2 and submitted[4:] == ["point"] * 4
    assert files(tmp_path / "serial") == files(tmp_path / "par")
    for t in ("gemm-BM16-small", "gemm-BM32-small"):
        assert (tmp_path / "serial" / "traces" / t / "trace.json").read_bytes() == \
            (tmp_path / "par" / "traces" / t / "trace.json").read_bytes()


def test_pool_shares_jobs_between_this_process_and_workers(tmp_path):
    """Pool.run: every job done once, results to done() in this thread, this process
    working while the worker starts; an exception reaches done() as (False, exception)."""
    import os
    import threading
    pool = _sweepsafe.Pool(2)
    got: dict[int, tuple[bool, object]] = {}
    main = threading.get_ident()

    def done(i, ok, res):
        assert threading.get_ident() == main
        assert i not in got
        got[i] = (ok, res)
    try:
        pool.run(_sweepsafe.work, [{"trace_dir": str(tmp_path / f"none{i}")} for i in range(6)],
                 done)
        assert got == {i: (True, 0) for i in range(6)}
        got.clear()
        pool.run(os.stat, [str(tmp_path), str(tmp_path / "missing")], done)
        assert got[0][0] is True and got[1][0] is False
        assert isinstance(got[1][1], FileNotFoundError)
    finally:
        pool.close()
    assert not pool.started


def test_free_cores_measures_the_machine_now(monkeypatch):
    """free_cores: the cores less this process less what the others used over the window
    (/proc/stat's busy seconds less this process's CPU), rounded; the load average only where
    /proc/stat is missing."""
    clock = {"wall": 100.0, "own": 5.0}
    monkeypatch.setattr(_sweepsafe.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(_sweepsafe.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(_sweepsafe.time, "process_time", lambda: clock["own"])
    monkeypatch.setattr(_sweepsafe.os, "getloadavg", lambda: (3.4, 3.0, 2.0))

    def run(others_busy_s: float, own_s: float) -> int:
        busy = iter([1000.0, 1000.0 + others_busy_s + own_s])
        monkeypatch.setattr(_sweepsafe, "_busy_jiffy_s", lambda: next(busy))

        def sleep(s: float) -> None:
            clock["wall"] += s
            clock["own"] += own_s
        monkeypatch.setattr(_sweepsafe.time, "sleep", sleep)
        return _sweepsafe.free_cores(0.1)

    assert run(0.0, 0.0) == 3           # idle machine: 4 cores less this process
    assert run(0.0, 0.05) == 3          # this process's own threads do not count
    assert run(0.1, 0.0) == 2           # one other core busy
    assert run(0.16, 0.0) == 1          # 1.6 cores busy -> 4 - 1.6 - 1 = 1.4 -> 1
    assert run(0.4, 0.0) == 0           # every core busy: none left for a worker
    monkeypatch.setattr(_sweepsafe, "_busy_jiffy_s", lambda: None)
    assert _sweepsafe.free_cores(0.1) == 1      # no /proc/stat: 4 - 3.4 (load average)


def test_workers_start_only_on_free_cores(tmp_path, monkeypatch):
    """With every core busy (free_cores() <= 0) -j 2 starts no worker and runs every job
    here; with one free core it starts one; a forced pool (execute with a number) ignores
    the load."""
    jobs = [{"trace_dir": str(tmp_path / f"none{i}")} for i in range(3)]
    for free, started in ((0, False), (-3, False), (1, True)):
        monkeypatch.setattr(_sweepsafe, "free_cores", lambda free=free: free)
        pool = _sweepsafe.Pool(2)
        got = {}
        try:
            pool.run(_sweepsafe.work, jobs, lambda i, ok, r, got=got: got.setdefault(i, (ok, r)))
            assert pool.started is started
        finally:
            pool.close()
        assert got == {0: (True, 0), 1: (True, 0), 2: (True, 0)}
    monkeypatch.setattr(_sweepsafe, "free_cores", lambda: 0)
    forced = _sweepsafe.Pool(2, spare_cores_only=False)
    try:
        forced.start()
        assert forced.started
    finally:
        forced.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_forked_and_spawned_workers_write_the_serial_files(trace, tmp_path, monkeypatch, method):
    """Workers forked (up at once, kbtrace imported) or spawned (a fresh interpreter) replay
    the points into the files a serial sweep writes; the pool says how it started them."""
    serial = run_sweep(cfg(trace), tmp_path / "serial")
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS", 0)
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS_FORK", 0)
    monkeypatch.setattr(_sweepsafe.Pool, "LOCAL", False)
    monkeypatch.setattr(_sweepsafe, "start_method", lambda: method)
    started = []
    close = _sweepsafe.Pool.close
    monkeypatch.setattr(_sweepsafe.Pool, "close",
                        lambda self: started.append(self.start_method) or close(self))
    par = run_sweep(cfg(trace), tmp_path / "par", jobs=2)
    assert serial.ok and par.ok and started == [method]
    assert files(tmp_path / "serial") == files(tmp_path / "par")


def test_workers_fork_only_without_other_threads():
    """fork (Linux) while this is the only Python thread; spawn while another thread runs,
    which could hold a lock the child would inherit locked."""
    import threading
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert _sweepsafe.start_method() == "spawn"
    finally:
        stop.set()
        t.join()
    if threading.active_count() == 1:       # (pytest plugins may keep threads of their own)
        assert _sweepsafe.start_method() == "fork"


def test_progress_threads_pause_around_a_fork():
    """threads_paused() stops a rich display's refresh thread for the block and restarts it."""
    import io
    import threading

    from kbtrace._progress import progress, threads_paused

    class Tty(io.StringIO):
        def isatty(self):
            return True

    def refreshing():
        return [t for t in threading.enumerate() if "Refresh" in type(t).__name__]
    with progress(True, Tty()) as bars:
        bars.add("sweep", total=4, unit="points")
        assert len(refreshing()) == 1
        with threads_paused():
            assert refreshing() == []
        assert len(refreshing()) == 1 and refreshing()[0].is_alive()

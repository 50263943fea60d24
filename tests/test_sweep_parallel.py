"""Parallel sweeps (issue 22, target 7): jobs that wait on others (a trace's points on its
capture), the CPU-time decomposition of a sweep and the speed-up predicted from it."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from kbtrace.errors import SweepError
from kbtrace.replay import _sweepsafe
from kbtrace.replay._sweepcpu import JobCpu, SweepCpu, predict, schedule
from kbtrace.replay.sweep import run_sweep
from test_replay_util import TOPO_DIR

ROOT = TOPO_DIR.parent
SMALL = str(TOPO_DIR / "small.yaml")
BW = "cube.hbm.pc_bw_gbps"
GEMM = str(ROOT / "capture" / "gemm.py")


def files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*.parquet"))}


def test_schedule_plays_the_pool_policy():
    """Each free process takes the first ready job in list order; this process is free at
    0, a worker from start_s; a job waits for the jobs it comes after."""
    j = [JobCpu("point", i, c) for i, c in enumerate((1.0, 1.0, 2.0))]
    assert schedule(j, 1, 0.0) == 4.0
    assert schedule(j, 2, 0.0) == 3.0           # 0-1 | 0-1, then 1-3
    assert schedule(j[::-1], 2, 0.0) == 2.0     # largest first: 2 | 1 + 1
    assert schedule(j[::-1], 2, 0.5) == 2.5     # the worker starts late: 0-2 | 0.5-1.5-2.5
    # captures 0.5 (here) and 0.3 (worker), each with two points: after a barrier on both
    # captures, or each point after its own capture
    caps = [JobCpu("capture", 0, 0.5), JobCpu("capture", 1, 0.3)]
    costs = (0.9, 1.1, 0.4, 0.6)
    barrier = caps + [JobCpu("point", i, c, after=(0, 1)) for i, c in enumerate(costs)]
    piped = caps + [JobCpu("point", i, c, after=(i // 2,)) for i, c in enumerate(costs)]
    # barrier: both free at 0.5; 0.5-1.4 | 0.5-1.6; 1.4-1.8 | 1.6-2.2
    assert schedule(barrier, 2, 0.0) == pytest.approx(2.2)
    # piped: the worker is free at 0.3 and takes point 2 (its trace is captured): 0.3-0.7;
    # then 0.5-1.4 (p0) here, 0.7-1.8 (p1) there, 1.4-2.0 (p3) here
    assert schedule(piped, 2, 0.0) == pytest.approx(2.0)
    # the second trace's points first in list order: 0.3-0.7 (p2) | 0.5-1.1 (p3), then
    # 0.7-1.6 (p0) | 1.1-2.2 (p1): the order of preference decides the tail
    piped2 = caps + [piped[4], piped[5], piped[2], piped[3]]
    assert schedule(piped2, 2, 0.0) == pytest.approx(2.2)
    with pytest.raises(ValueError, match="never starts"):
        schedule([JobCpu("point", 0, 1.0, after=(0,))], 2)


def test_predict_adds_the_serial_part():
    cpu = SweepCpu(phases={"plan": 0.1, "run": 4.0, "write": 0.1},
                   jobs=[JobCpu("point", i, 1.0) for i in range(4)])
    assert cpu.here_s == pytest.approx(4.2) and cpu.jobs_s == 4.0
    assert cpu.serial_s == pytest.approx(0.2)
    assert predict(cpu, 1) == pytest.approx(4.2)
    assert predict(cpu, 2, 0.0) == pytest.approx(2.2)
    # a -j 2 profile: jobs the worker ran are not this process's
    two = SweepCpu(phases={"run": 2.1}, jobs=[JobCpu("point", i, 1.0, here=i < 2)
                                               for i in range(4)], workers_s=2.05)
    assert two.serial_s == pytest.approx(0.1) and two.total_s == pytest.approx(4.15)
    assert json.loads(json.dumps(two.as_json()))["jobs"][3] == {
        "kind": "point", "index": 3, "cpu_s": 1.0, "here": False, "after": []}


def _dep_job(a):
    """A job for test_pool_runs_jobs_after_the_jobs_they_wait_on (top level: workers
    unpickle it): fails unless the done() of each job it waits on has returned."""
    i, d, deps = a
    (d / f"start-{i}").touch()
    missing = [k for k in deps if not (d / f"done-{k}").exists()]
    if missing or i == 5:
        raise ValueError(f"job {i}: " + (f"done() of {missing} not called" if missing
                                         else "five"))
    return i * 10


def test_pool_runs_jobs_after_the_jobs_they_wait_on(tmp_path):
    """A job starts only after the jobs it waits on have ended and their done() returned
    (here and in a worker); a job after a failed one is reported, not run; halt() hands out
    nothing more; of the ready jobs the least rank goes first."""
    #        0, 1 free; 2 after 0; 3 after 0 and 1; 4 after 3; 5 fails; 6 after 5
    after = [(), (), (0,), (0, 1), (3,), (), (5,)]
    for local in (True, False):
        d = tmp_path / str(local)
        d.mkdir()
        got: dict[int, tuple[bool, object]] = {}

        def done(i, ok, res, d=d, got=got):
            (d / f"done-{i}").touch()
            got[i] = (ok, res if ok else str(res))
        pool = _sweepsafe.Pool(2, spare_cores_only=False)
        pool.LOCAL = local
        try:
            pool.run(_dep_job, [(i, d, after[i]) for i in range(7)], done, after,
                     rank=lambda i: -i if i in (2, 3) else i)
        finally:
            pool.close()
        assert got == {0: (True, 0), 1: (True, 10), 2: (True, 20), 3: (True, 30),
                       4: (True, 40), 5: (False, "job 5: five"),
                       6: (False, "sweep job 6 not run: job 5, which it needs, failed")}
        assert not (d / "start-6").exists()
    pool = _sweepsafe.Pool(1)          # this process only: in rank order, then halted
    order: list[int] = []

    def halting(i, ok, res):
        order.append(res)
        if i == 1:
            pool.halt()
    pool.run(lambda i: i, [0, 1, 2, 3], halting, rank=lambda i: -i)
    assert order == [3, 2, 1]


def _two_workloads(bad_first=False, bad_second=False):
    wls = [{"path": GEMM, "name": "g", "params": {"M": 64, "N": 64, "K": 64},
            "grid": {"BM": [16, 32]}}]
    if bad_first or bad_second:
        bad = {"path": str(ROOT / "capture" / "softmax.py"), "name": "sm",
               "params": {"R": -4}}
        wls = [bad] + wls if bad_first else wls + [bad]
    return {"workloads": wls, "topologies": [SMALL], "grid": {BW: [8, 32]}}


def test_piped_captures_write_the_serial_files_and_account_cpu(tmp_path, monkeypatch):
    """-j 2 with two workloads runs captures and points as one set of jobs (each point
    once its trace is captured) and writes the files -j 1 writes; the CPU decomposition
    lists every capture and point, each point after its own capture."""
    serial = run_sweep(_two_workloads(), tmp_path / "serial")
    monkeypatch.setattr(_sweepsafe, "free_cores", lambda: 2)
    par = run_sweep(_two_workloads(), tmp_path / "par", jobs=2)
    assert serial.ok and par.ok
    assert files(tmp_path / "serial") == files(tmp_path / "par")
    # BM16's trace has more ops (40 against 20): first; -j 2 ranks the points by their
    # predicted cost (_sweepcost: 8 GB/s per channel 0.625x, 32 GB/s 1x), -j 1 by ops
    # alone (too few for workers: no prediction asked for)
    for cpu, here, pts in ((serial.cpu, {True}, (0, 1, 2, 3)),
                           (par.cpu, {True, False}, (1, 0, 3, 2))):
        assert [(j.kind, j.index, j.after) for j in cpu.jobs] == [
            ("capture", 0, ()), ("capture", 1, ())] + [
            ("point", i, (i // 2,)) for i in pts]
        assert all(j.cpu_s > 0 for j in cpu.jobs)
        assert {j.here for j in cpu.jobs} <= here
        assert 0 <= cpu.serial_s < cpu.jobs_s
    assert serial.cpu.workers_s == 0 and set(serial.cpu.phases) == {
        "config", "plan", "capture", "prepare", "run", "write", "close"}
    assert par.cpu.workers_s > 0 and "capture" not in par.cpu.phases
    monkeypatch.setattr(_sweepsafe, "free_cores", lambda: 0)      # every core busy: no worker
    alone = run_sweep(_two_workloads(), tmp_path / "alone", jobs=2)
    assert alone.ok and alone.cpu.workers_s == 0 and all(j.here for j in alone.cpu.jobs)
    assert files(tmp_path / "serial") == files(tmp_path / "alone")
    pj = json.loads(next((tmp_path / "par").rglob("point.json")).read_text())
    assert pj["cpu_s"] > 0
    assert "cpu_s" not in pq.read_schema(tmp_path / "par" / "points.parquet").names


@pytest.mark.parametrize("bad_first", [True, False])
def test_piped_capture_failure_names_the_first_workload(tmp_path, monkeypatch, bad_first):
    """A capture failing in a -j 2 sweep is the sweep's error (the first failing workload
    in config order), as at -j 1, where no point runs; at -j 2 the other workload's points
    may have run meanwhile, and the sweep then says it is running (resume completes it).
    If the failure comes before the other capture is handed out, none starts (``Pool.halt``):
    nothing was written, and the directory the sweep created is gone again."""
    monkeypatch.setattr(_sweepsafe, "free_cores", lambda: 2)
    cfg = _two_workloads(bad_first=bad_first, bad_second=not bad_first)
    for jobs, out in ((1, tmp_path / "s1"), (2, tmp_path / "s2")):
        with pytest.raises(SweepError, match=r"workloads: .*softmax.py on .*small.yaml: "):
            run_sweep(cfg, out, jobs=jobs)
    assert sorted(p.name for p in (tmp_path / "s1").iterdir()) == ["traces"]
    s2 = sorted(p.name for p in (tmp_path / "s2").iterdir()) if (tmp_path / "s2").exists() \
        else None
    if s2 is not None and "sweep.json" in s2:
        assert json.loads((tmp_path / "s2" / "sweep.json").read_text())["status"] == "running"
        assert "points.parquet" not in s2
    else:
        assert s2 in (["traces"], None)


def test_piped_sweep_whose_captures_all_fail_leaves_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(_sweepsafe, "free_cores", lambda: 2)
    bad = [{"path": str(ROOT / "capture" / "softmax.py"), "name": n, "params": {"R": -4}}
           for n in ("a", "b")]
    with pytest.raises(SweepError, match=r"workloads: .*softmax.py on .*small.yaml: "):
        run_sweep({"workloads": bad, "topologies": [SMALL]}, tmp_path / "s", jobs=2)
    assert list(tmp_path.iterdir()) == []


def test_rerun_hands_points_out_by_their_last_cpu_time(tmp_path, monkeypatch):
    """Points of one trace all have its ops; re-run into the same directory, a sweep hands
    them out largest first by the CPU seconds each took last time (point.json cpu_s), and
    writes the same files."""
    from kbtrace.capture import capture
    capture(GEMM, SMALL, {"M": 64, "N": 64, "K": 64}, tmp_path / "t")
    cfg = {"traces": [str(tmp_path / "t")], "topologies": [SMALL], "grid": {BW: [8, 16, 32]}}
    first = run_sweep(cfg, tmp_path / "s")
    assert [j.index for j in first.cpu.jobs] == [0, 1, 2]      # equal ops: config order
    before = files(tmp_path / "s")
    for pj in (tmp_path / "s").rglob("point.json"):
        doc = json.loads(pj.read_text())
        doc["cpu_s"] = {16: 2.0, 32: 3.0, 8: 1.0}[doc["params"][BW]]
        pj.write_text(json.dumps(doc))
    submitted = []
    submit = _sweepsafe.Pool.submit
    monkeypatch.setattr(_sweepsafe.Pool, "submit", lambda self, fn, *a: submitted.append(
        a[0]["point"] if fn.__name__ == "run_point" else None) or submit(self, fn, *a))
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS", 0)
    monkeypatch.setattr(_sweepsafe, "MIN_PARALLEL_OPS_FORK", 0)
    monkeypatch.setattr(_sweepsafe.Pool, "LOCAL", False)
    again = run_sweep(cfg, tmp_path / "s", jobs=2)
    assert [j.index for j in again.cpu.jobs] == [2, 1, 0]      # 32 (3 s), 16 (2 s), 8 (1 s)
    assert [p for p in submitted if p is not None] == [2, 1, 0]
    assert files(tmp_path / "s") == before


def test_sweep_table_prints_without_polars(tmp_path):
    """render_strings gives render's text, md, csv and json of string columns; `kbtrace
    sweep` prints its text table without importing polars (a serial ~0.1 s of the command)."""
    import os
    import subprocess
    import sys

    import polars as pl

    from kbtrace._tables import render, render_strings
    cols = {"point": ["0", "10"], "trace": ["a|b", "c"], "makespan_ns": ["1,234.5", "error"]}
    for f in ("text", "table", "md", "csv", "json"):
        assert render_strings(cols, f) == render(pl.DataFrame(cols), f), f
    from kbtrace.capture import capture
    capture(GEMM, SMALL, {"M": 64, "N": 64, "K": 64}, tmp_path / "t")
    (tmp_path / "s.yaml").write_text(f"traces: [{tmp_path / 't'}]\ntopologies: [{SMALL}]\n"
                                     f"grid: {{{BW}: [8, 16]}}\n")
    code = ("import sys; from kbtrace.cli import main; "
            f"rc = main(['sweep', {str(tmp_path / 's.yaml')!r}, '-o', {str(tmp_path / 'o')!r}]); "
            "print('polars' in sys.modules, rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, check=True).stdout
    assert out.splitlines()[-1] == "False 0"
    assert out.splitlines()[0].split() == ["point", "trace", "topology", "fidelity", BW,
                                           "makespan_ns", "vs", "workload's", "first"]

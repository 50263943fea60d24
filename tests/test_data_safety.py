"""Catalogue of data-safety cases (issue 21, classes 1, 5, 6 and 7): kbtrace never destroys
what it did not write, an output never replaces an input, interrupted outputs are whole or
absent, sweeps stay consistent when traces change or processes die, and a workload cannot
make a failed capture look like a success.

The in-process cases use the harness of ``test_bad_inputs`` (exit code, exactly one
``kbtrace: error:`` line, every other file's bytes unchanged); the fault cases kill real
processes mid-write with SIGKILL and check what is left on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kbtrace._io import atomic_dir, clean_stale_stages
from kbtrace._owned import MARKER, owner, write_marker
from kbtrace.cli import main
from test_bad_inputs import GEMM, TINY, Case, _run_case, base, w  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]
MARK = "kbtrace-output v1 kind={}\n"


def _forged(d: Path, content: str) -> None:
    w(d / MARKER, content)


def _thesis(d: Path, sub: str, name: str) -> Path:
    """A user's folder ``sub`` holding sources, a thesis and a file named ``name``."""
    w(d / sub / "main.c", "int main(void) { return 0; }\n")
    w(d / sub / "thesis.tex", "\\documentclass{article}\n")
    w(d / sub / name, '{"traceEvents": []}\n')
    return d / sub


def _home(d: Path) -> list[str]:
    w(d / "home" / "index.html", "<p>my page</p>")
    w(d / "home" / ".bashrc", "alias ll='ls -l'\n")
    return ["report", "run", "-o", "home"]


def _trace_in_run(d: Path) -> list[str]:
    # a trace kept inside a run directory (the run dir is kbtrace's): replaying it into the
    # run would replace the directory that holds the input
    assert main(["capture", str(GEMM), "-t", str(TINY), "-p", "M=64", "-p", "N=64",
                 "-p", "K=64", "-o", str(d / "run" / "tr2")]) == 0
    return ["replay", "run/tr2", "-t", str(TINY), "-o", "run"]


def _symlink(target: str, link: str, argv: list[str], mine: str | None = None):
    """A case setup: ``link`` -> ``target`` (and, with ``mine``, the target as a file)."""
    def setup(d: Path) -> list[str]:
        if mine:
            w(d / mine, "mine")
        os.symlink(target, d / link)
        return argv
    return setup


def _fifo(d: Path) -> list[str]:
    os.mkfifo(d / "pipe")
    return ["export", "perfetto", "run", "-o", "pipe"]


def _sysexit(where: str) -> str:
    body = {"top": "import sys\nsys.exit(0)\nPARAMS = {}\ndef build(w, p):\n    pass\n",
            "build": "import sys\nPARAMS = {}\ndef build(w, p):\n    sys.exit(0)\n",
            "kernel": textwrap.dedent("""\
                import sys
                import numpy as np
                PARAMS = {}
                def k(tl, x):
                    raise SystemExit(3)
                def build(w, p):
                    x = w.tensor("x", (8,), "f32", init=np.ones(8, np.float32))
                    w.launch(k, grid=(1, 1), args=(x,))
                """)}[where]
    def setup(d: Path) -> list[str]:
        w(d / "wl.py", body)
        return ["capture", "wl.py", "-t", str(TINY), "-o", "out"]
    return setup


_MISMATCH = textwrap.dedent("""\
    import numpy as np
    PARAMS = {}
    def k(tl, x, y):
        tl.store(y, tl.load(x, (8,), "f32"))
    def build(w, p):
        x = w.tensor("x", (8,), "f32", init=np.arange(8, dtype=np.float32))
        y = w.tensor("y", (8,), "f32", init=np.zeros(8, np.float32))
        w.launch(k, grid=(1, 1), args=(x, y))
        w.output(y, reference=lambda v: v["x"] * 2)
    """)


def _mismatch(*extra: str):
    def setup(d: Path) -> list[str]:
        w(d / "wl.py", _MISMATCH)
        return ["capture", "wl.py", "-t", str(TINY), "-o", "out", *extra]
    return setup


CASES = [
    # -- ownership: a file name anyone may have is no marker
    Case("capture-over-folder-with-trace-json",
         lambda d: (_thesis(d, "proj", "trace.json"),
                    ["capture", str(GEMM), "-t", str(TINY), "-o", "proj"])[1],
         2, "proj: exists and was not written by kbtrace"),
    Case("replay-over-folder-with-run-json",
         lambda d: (_thesis(d, "proj", "run.json"), ["replay", "tr", "-t", str(TINY), "-o",
                                                     "proj"])[1],
         2, "proj: exists and was not written by kbtrace"),
    Case("capture-over-a-run", lambda d: ["capture", str(GEMM), "-t", str(TINY), "-o", "run"],
         2, "run: is a kbtrace run directory, not a trace"),
    Case("replay-over-its-trace", lambda d: ["replay", "tr", "-t", str(TINY), "-o", "tr"],
         2, "tr: is a kbtrace trace directory, not a run"),
    Case("replay-over-another-trace",
         lambda d: (main(["capture", str(GEMM), "-t", str(TINY), "-p", "M=64", "-p", "N=64",
                          "-p", "K=64", "-o", str(d / "tr2")]),
                    ["replay", "tr", "-t", str(TINY), "-o", "tr2"])[1],
         2, "tr2: is a kbtrace trace directory, not a run"),
    Case("forged-marker-content",
         lambda d: (_thesis(d, "proj", "x"), _forged(d / "proj", "kbtrace\n"),
                    ["replay", "tr", "-t", str(TINY), "-o", "proj"])[2],
         2, "proj: exists and was not written by kbtrace"),
    Case("marker-of-unknown-kind",
         lambda d: (_thesis(d, "proj", "x"), _forged(d / "proj", MARK.format("thesis")),
                    ["replay", "tr", "-t", str(TINY), "-o", "proj"])[2],
         2, "proj: exists and was not written by kbtrace"),
    Case("marker-is-a-symlink",
         lambda d: (_thesis(d, "proj", "x"), os.symlink(d / "run" / MARKER, d / "proj" / MARKER),
                    ["replay", "tr", "-t", str(TINY), "-o", "proj"])[2],
         2, "proj: exists and was not written by kbtrace"),
    Case("report-into-home", _home, 2, "home: exists and was not written by kbtrace"),
    Case("sweep-into-foreign-folder",
         lambda d: (_thesis(d, "proj", "sweep.json"),
                    w(d / "s.yaml", f"traces: [tr]\ntopologies: [{TINY}]\n"),
                    ["sweep", "s.yaml", "-o", "proj"])[2],
         2, "proj: exists and was not written by kbtrace"),
    Case("baseline-update-over-foreign-folder",
         lambda d: (_thesis(d, "bl/gemm", "summary.json"),
                    ["baseline", "update", "gemm", "-t", str(TINY), "--root", "bl"])[1],
         2, "gemm: exists and was not written by kbtrace"),
    Case("capture-into-the-workloads-folder",
         lambda d: (w(d / "wls" / "g.py", GEMM.read_text()),
                    ["capture", "wls/g.py", "-t", str(TINY), "-o", "wls"])[1],
         2, "wls: exists and was not written by kbtrace"),
    Case("capture-into-empty-marked-workloads-folder",
         lambda d: (w(d / "wls" / "g.py", GEMM.read_text()), write_marker(d / "wls", "trace"),
                    ["capture", "wls/g.py", "-t", str(TINY), "-o", "wls"])[2],
         2, "wls: contains"),
    # -- an output may not be, contain or lie inside an input
    Case("replay-trace-inside-run-into-run", _trace_in_run, 2, "run: contains"),
    Case("export-over-run-json", lambda d: ["export", "perfetto", "run", "-o", "run/run.json"],
         2, "run.json: is an input of this command"),
    Case("export-over-trace-ops",
         lambda d: ["export", "perfetto", "run", "-o", "tr/ops.parquet"],
         2, "ops.parquet: lies inside"),
    Case("sql-parquet-over-op-timing",
         lambda d: ["sql", "run", "SELECT 1 AS x", "--format", "parquet", "-o",
                    "run/op_timing.parquet"],
         2, "op_timing.parquet: is an input of this command"),
    Case("sql-csv-over-hops", lambda d: ["sql", "run", "SELECT 1 AS x", "--format", "csv", "-o",
                                         "run/hops.parquet"],
         2, "hops.parquet: is an input of this command"),
    Case("sql-into-the-trace", lambda d: ["sql", "run", "SELECT 1 AS x", "--format", "csv",
                                          "-o", "tr/q.csv"],
         2, "q.csv: lies inside"),
    Case("report-over-the-run", lambda d: ["report", "run", "-o", "run"], 2,
         "run: is a kbtrace run directory, not a report"),
    Case("report-over-the-trace", lambda d: ["report", "run", "-o", "tr"], 2,
         "tr: is a kbtrace trace directory, not a report"),
    Case("diff-output-over-its-base",
         lambda d: ["diff", "run", "run", "-o", "run/run.json"], 2,
         "run/run.json: lies inside"),
    Case("capture-over-its-topology",
         lambda d: (w(d / "t.yaml", TINY.read_text()),
                    ["capture", str(GEMM), "-t", "t.yaml", "-o", "t.yaml"])[1],
         2, "t.yaml: exists and is a regular file, not a directory"),
    Case("export-through-a-hard-link-to-run-json",
         lambda d: (os.link(d / "run" / "run.json", d / "alias.json"),
                    ["export", "perfetto", "run", "-o", "alias.json"])[1],
         2, "alias.json: is an input of this command"),
    # -- single files: never a symlink or a special file
    Case("export-onto-a-symlink",
         _symlink("notes.txt", "t.json", ["export", "perfetto", "run", "-o", "t.json"],
                  mine="notes.txt"),
         2, "t.json: is a symbolic link"),
    Case("export-onto-a-dangling-symlink",
         _symlink("/nonexistent/x", "t.json", ["export", "perfetto", "run", "-o", "t.json"]),
         2, "t.json: is a symbolic link"),
    Case("sql-onto-a-symlink",
         _symlink("run/run.json", "q.csv", ["sql", "run", "SELECT 1 AS x", "--format", "csv",
                                            "-o", "q.csv"]),
         2, "q.csv: is a symbolic link"),
    Case("export-onto-a-fifo", _fifo, 2, "pipe: is a FIFO, not a regular file"),
    Case("capture-onto-a-symlinked-dir",
         _symlink("run", "link", ["capture", str(GEMM), "-t", str(TINY), "-o", "link"]),
         2, "link: is a symbolic link"),
    Case("replay-onto-a-regular-file",
         lambda d: (w(d / "f.txt", "mine"), ["replay", "tr", "-t", str(TINY), "-o",
                                             "f.txt"])[1],
         2, "f.txt: exists and is a regular file, not a directory"),
    # -- what is allowed stays allowed (rc 0, nothing else changed)
    Case("replay-into-an-empty-dir",
         lambda d: ((d / "empty").mkdir(), ["replay", "tr", "-t", str(TINY), "-o", "empty"])[1],
         0, None, out="empty"),
    Case("replay-over-its-own-run", lambda d: ["replay", "tr", "-t", str(TINY), "-o", "run"],
         0, None, out="run"),
    Case("report-default-twice",
         lambda d: (main(["report", "run"]), ["report", "run"])[1], 0, None, out="run/report"),
    Case("export-beside-the-run-files",
         lambda d: ["export", "perfetto", "run", "-o", "run/timeline.json"], 0, None,
         out="run/timeline.json"),
    # -- exit codes: a workload cannot end the process or hide a wrong result
    Case("sys-exit-at-import", _sysexit("top"), 2, "called sys.exit(0)"),
    Case("sys-exit-in-build", _sysexit("build"), 2, "called sys.exit(0)"),
    Case("system-exit-in-kernel", _sysexit("kernel"), 2, "SystemExit"),
    Case("output-differs-from-reference", _mismatch(), 2,
         "output y (max abs err 7, f32) differs from its numpy reference; nothing written"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_data_safety_case(case: Case, base, tmp_path, monkeypatch, capsys):  # noqa: F811
    _run_case(case, base, tmp_path, monkeypatch, capsys)
    if case.rc == 2:
        assert not (tmp_path / "w" / "out").exists()


def test_allow_mismatch_keeps_the_trace_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    w(tmp_path / "wl.py", _MISMATCH)
    assert main(["capture", "wl.py", "-t", str(TINY), "-o", "out", "--allow-mismatch"]) == 1
    assert "output y (f32) DIFFERS FROM its numpy reference" in capsys.readouterr().out
    meta = json.loads((tmp_path / "out" / "trace.json").read_text())
    assert meta["reference_check"]["y"]["ok"] is False
    assert owner(tmp_path / "out") == "trace"


# ------------------------------------------------------------------- stale staging dirs

def test_stale_staging_dirs_of_dead_processes_are_cleaned(tmp_path):
    dead = 2 ** 22 + 12345                          # above pid_max's default: never alive
    mine = tmp_path / f".run.{dead}.tmp"
    mine.mkdir()
    write_marker(mine, "run")
    (mine / "op_timing.parquet").write_bytes(b"half")
    empty = tmp_path / f".x.{dead}.old"
    empty.mkdir()
    foreign = tmp_path / f".notes.{dead}.tmp"       # looks like ours, is not: kept
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    alive = tmp_path / f".run.{os.getpid()}.tmp"
    alive.mkdir()
    write_marker(alive, "run")
    assert sorted(p.name for p in clean_stale_stages(tmp_path)) == sorted([mine.name, empty.name])
    assert foreign.is_dir() and alive.is_dir()
    with atomic_dir(tmp_path / "run", "run") as stage:   # atomic_dir cleans beside itself too
        (stage / "run.json").write_text("{}")
    assert owner(tmp_path / "run") == "run"


# ------------------------------------------------------------------- killed processes

def _spawn(code: str, cwd: Path) -> subprocess.Popen[bytes]:
    """A child ``python -c code`` (stderr in ``cwd/child.err``), to be killed mid-write."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH", "")])}
    with open(cwd / "child.err", "wb") as err:
        return subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    t0 = time.monotonic()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.args[-1][-300:]}: "
                                 f"{(path.parent / 'child.err').read_text()[-2000:]}")
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.05)


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_killed_report_leaves_the_earlier_report_whole(base, tmp_path):  # noqa: F811
    import shutil
    shutil.copytree(base / "run", tmp_path / "run")
    assert main(["report", str(tmp_path / "run"), "-o", str(tmp_path / "rep")]) == 0
    before = _tree(tmp_path / "rep")
    flag = tmp_path / "halfway"
    proc = _spawn(textwrap.dedent(f"""
        import time, pathlib
        from kbtrace.analysis import plots, reporter
        real = plots.plot_roofline
        def slow(*a, **k):
            out = real(*a, **k)
            pathlib.Path({str(flag)!r}).write_text("x")
            time.sleep(60)
            return out
        plots.plot_roofline = slow
        reporter.report({str(tmp_path / 'run')!r}, {str(tmp_path / 'rep')!r})
        """), tmp_path)
    _wait_for(flag, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _tree(tmp_path / "rep") == before            # the earlier page, whole
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".rep.")]
    assert left, "the killed report's staging directory"
    assert main(["report", str(tmp_path / "run"), "-o", str(tmp_path / "rep")]) == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rep.")]   # cleaned
    assert _tree(tmp_path / "rep") == before            # deterministic


def _sweep_cfg(d: Path, base_dir: Path) -> Path:
    return w(d / "s.yaml", f"traces: [{base_dir / 'tr'}]\ntopologies: [{TINY}]\n"
                           f"grid:\n  cube.hbm.pc_bw_gbps: [8, 16, 32]\n")


def _killed_sweep(cfg: Path, out: Path, flag: Path, after: int, extra: str = "") -> None:
    """Run the sweep in a child process and SIGKILL it once ``after`` points finished."""
    proc = _spawn(textwrap.dedent(f"""
        import time, pathlib
        from kbtrace.replay import sweep
        n = [0]
        def on_point(p, r):
            n[0] += 1
            if n[0] == {after}:
                pathlib.Path({str(flag)!r}).write_text("x")
                time.sleep(60)
        {extra}
        sweep.run_sweep({str(cfg)!r}, {str(out)!r}, on_point=on_point)
        """), out.parent)
    _wait_for(flag, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    flag.unlink()


def test_killed_sweeps_resume_and_never_read_as_complete(base, tmp_path, capsys):  # noqa: F811
    cfg = _sweep_cfg(tmp_path, base)
    out = tmp_path / "sw"
    flag = tmp_path / "flag"
    # 1. killed in its first run: it can be resumed (it used to be "not a sweep directory")
    _killed_sweep(cfg, out, flag, after=1)
    assert json.loads((out / "sweep.json").read_text())["status"] == "running"
    assert not (out / "points.parquet").exists()
    assert main(["report", str(out)]) == 2
    assert "interrupted before it finished" in capsys.readouterr().err
    assert main(["sweep", str(cfg), "-o", str(out), "--resume"]) == 0
    assert "1 reused" in capsys.readouterr().out
    complete = _tree(out)
    assert json.loads(complete["sweep.json"])["status"] == "complete"
    # 2. a re-run of the finished sweep, killed after one point: never reads as complete
    _killed_sweep(cfg, out, flag, after=1)
    assert json.loads((out / "sweep.json").read_text())["status"] == "running"
    assert not (out / "points.parquet").exists()
    for p in (d for d in out.rglob("point.json")):
        assert (p.parent / "run.json").is_file()        # each point whole (old or new)
    assert main(["sweep", str(cfg), "-o", str(out), "--resume"]) == 0
    again = _tree(out)
    for name in ("sweep.json", "points.parquet"):
        assert again[name] == complete[name]


def test_a_trace_recaptured_during_a_sweep_fails_its_points(base, tmp_path):  # noqa: F811
    import shutil

    from kbtrace.replay.sweep import run_sweep
    shutil.copytree(base / "tr", tmp_path / "tr")
    cfg = _sweep_cfg(tmp_path, tmp_path)
    seen = []

    def recapture(point, res):
        seen.append(res["status"])
        if len(seen) == 1:                      # after the first point, the trace changes
            assert main(["capture", str(GEMM), "-t", str(TINY), "-p", "M=32", "-p", "N=64",
                         "-p", "K=64", "-o", str(tmp_path / "tr")]) == 0

    res = run_sweep(cfg, tmp_path / "sw", on_point=recapture)
    assert seen == ["ok", "error", "error"]
    assert [f["point"] for f in res.failed] == [1, 2]
    assert all("the trace changed while the sweep ran" in f["error"] for f in res.failed)


_WORKER_MOD = textwrap.dedent("""
    import os, time, pathlib
    def job(j):
        pathlib.Path(j["pids"], str(os.getpid())).write_text("x")
        time.sleep(120)
        return {}
""")


def test_sweep_workers_die_with_the_sweep(tmp_path):
    w(tmp_path / "mod" / "kbt_sleepy.py", _WORKER_MOD)
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = _spawn(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path / 'mod')!r})
        from kbt_sleepy import job
        from kbtrace.replay._sweepsafe import execute
        if __name__ == "__main__":
            execute(job, [{{"pids": {str(pids)!r}}}] * 2, 2, "local", lambda i, r: None)
        """), tmp_path)
    t0 = time.monotonic()
    while len(list(pids.iterdir())) < 2:
        assert time.monotonic() - t0 < 120 and proc.poll() is None, \
            (tmp_path / "child.err").read_text()
        time.sleep(0.05)
    workers = [int(p.name) for p in pids.iterdir()]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t0 = time.monotonic()
    alive = workers
    while alive and time.monotonic() - t0 < 10:
        time.sleep(0.1)
        alive = [p for p in workers if Path(f"/proc/{p}").exists()
                 and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2]]
    assert alive == [], "workers outlived the sweep"

"""Start-up cost (issue 22, target 6): the commands that neither analyse nor plot --
``--version``, ``topo show``, ``capture``, ``replay`` -- import neither matplotlib nor
DuckDB nor polars (together ~1 s of imports on the project's machine). Each command runs
in a fresh interpreter, which then reports the modules it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("matplotlib", "duckdb", "polars")
_PROBE = ("import json, sys\n"
          "from kbtrace.cli import main\n"
          "rc = main(sys.argv[1:])\n"
          "print(json.dumps({'rc': rc, 'heavy': sorted({m.split('.')[0] for m in sys.modules}"
          " & {'matplotlib', 'duckdb', 'polars'})}))\n")


def _heavy_imports(*argv: str) -> tuple[int, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-c", _PROBE, *argv], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return out["rc"], out["heavy"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A trace and its run on tiny.yaml, written in this process."""
    from kbtrace.capture import capture
    from kbtrace.replay import ReplayOptions, replay

    d = tmp_path_factory.mktemp("startup")
    capture(ROOT / "capture" / "softmax.py", ROOT / "topologies" / "tiny.yaml", {}, d / "trace")
    replay(d / "trace", ROOT / "topologies" / "tiny.yaml", ReplayOptions(out_dir=str(d / "run")))
    return d


@pytest.mark.parametrize("argv", [
    ["topo", "show", "topologies/tiny.yaml"],
    ["capture", "capture/softmax.py", "--topology", "topologies/tiny.yaml", "-o", "{d}/cap"],
    ["replay", "{d}/trace", "--topology", "topologies/tiny.yaml", "-o", "{d}/run2"],
    ["trace", "show", "{d}/trace"],
], ids=["topo", "capture", "replay", "trace"])
def test_commands_that_do_not_analyse_import_no_analysis_library(argv, made):
    rc, heavy = _heavy_imports(*(a.format(d=made) for a in argv))
    assert (rc, heavy) == (0, [])


def test_version_imports_no_analysis_library():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-c", _PROBE.replace("rc = main(sys.argv[1:])",
                                                               "rc = 0\ntry:\n    main(['--version'])\n"
                                                               "except SystemExit as e:\n    rc = e.code"),
                          ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.stdout.splitlines()[0] == "kbtrace 0.1.0"
    assert json.loads(res.stdout.splitlines()[-1]) == {"rc": 0, "heavy": []}


def test_the_probe_sees_an_analysis_import(made):
    """The check can fail: ``sql`` opens a run with DuckDB (and prints with polars)."""
    rc, heavy = _heavy_imports("sql", str(made / "run"), "SELECT 1 AS one")
    assert rc == 0 and "duckdb" in heavy


def test_replaying_a_trace_directory_does_not_import_the_capture_engine(made):
    """``replay(dir)`` opens the trace through ``kbtrace.tracefile``: reading a trace needs
    neither greenlet nor the scheduler and workload loader (~56 ms of imports, measured
    2026-11-28: ~1% of a 100 k-op replay's CPU)."""
    probe = ("import json, sys\n"
             "from kbtrace.replay import ReplayOptions, replay\n"
             "r = replay(sys.argv[1], sys.argv[2], ReplayOptions(out_dir=sys.argv[3]))\n"
             "print(json.dumps({'ops': r.ops, 'capture': sorted(m for m in sys.modules\n"
             "    if m == 'greenlet' or m.startswith('kbtrace.capture'))}))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-c", probe, str(made / "trace"),
                          str(ROOT / "topologies" / "tiny.yaml"), str(made / "run3")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["capture"] == [] and out["ops"] > 0

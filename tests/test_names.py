"""Default trace and run names carry what was varied (kbtrace._names): runs of different
inputs never share a directory; run.json records every override; the stale-run message's
commands reproduce the run."""

from __future__ import annotations

import json
import re
import shlex

import pytest

import kbtrace
from kbtrace._names import param_overrides, tag, variant
from kbtrace.analysis.main import run_workload
from kbtrace.cli import main
from kbtrace.errors import SchemaError

SMALL = ["M=64", "N=64", "K=64"]          # 8 x 2 x 1 tiles: a fast gemm


def test_tag_readable_sorted_or_hashed():
    assert tag(None) == "" and tag({}) == ""
    assert tag({"N": 64, "M": 1024}) == "M_1024-N_64"              # sorted by key
    assert tag({"cube.hbm.pc_bw_gbps": "16"}) == "cube.hbm.pc_bw_gbps_16"
    assert tag({"flag": True}) == "flag_true"
    # a value that would make the readable form ambiguous or unsafe as a file name is hashed
    for bad in ({"dtype": "a-b"}, {"x": "a/b"}, {"x": "a b"}, {"x": "1_2"}):
        t = tag(bad)
        assert re.fullmatch(r"h[0-9a-f]{10}", t), t
    assert tag({"x": "a-b"}) != tag({"x": "a/b"})
    long = {f"k{i}": 10 ** 6 for i in range(12)}
    assert re.fullmatch(r"h[0-9a-f]{10}", tag(long))
    assert param_overrides({"M": 256, "N": 256}, {"M": 256, "N": 64}) == {"N": 64}
    assert variant("gemm", "", "small", "", "fast") == "gemm-small-fast"


def test_runs_of_other_params_do_not_replace_the_default_run(tmp_path):
    a = run_workload("gemm", params=SMALL[:2] + ["K=128"], out=tmp_path, verify_data=False,
                     make_report=False)
    b = run_workload("gemm", params=SMALL, out=tmp_path, verify_data=False, make_report=False)
    c = run_workload("gemm", params=SMALL, sets=["cube.hbm.pc_bw_gbps=16"], out=tmp_path,
                     verify_data=False, make_report=False)
    assert a.run_dir.name == "gemm-M_64-N_64-small-fast"           # K=128 is gemm's default
    assert b.run_dir.name == "gemm-K_64-M_64-N_64-small-fast"
    assert c.run_dir.name == "gemm-K_64-M_64-N_64-small-cube.hbm.pc_bw_gbps_16-fast"
    assert c.trace_dir.name == "gemm-K_64-M_64-N_64-small-cube.hbm.pc_bw_gbps_16"
    assert len({a.trace_dir, b.trace_dir, c.trace_dir}) == 3
    # every run still opens: none of them had its trace replaced by a later one
    for s in (a, b, c):
        with kbtrace.open_run(s.run_dir) as run:
            assert run.makespan_ns == s.makespan_ns
    assert a.makespan_ns != b.makespan_ns != c.makespan_ns
    info = json.loads((c.run_dir / "run.json").read_text())
    assert info["overrides"] == {"params": {"K": 64, "M": 64, "N": 64},
                                 "topology": {"cube.hbm.pc_bw_gbps": "16"},
                                 "capture_topology": {"cube.hbm.pc_bw_gbps": "16"}}
    assert info["topology"]["overrides"] == {"cube.hbm.pc_bw_gbps": "16"}
    assert info["trace"]["workload_file"] == "gemm.py"
    meta = json.loads((c.trace_dir / "trace.json").read_text())
    assert meta["param_overrides"] == {"K": 64, "M": 64, "N": 64}
    assert meta["topology"]["overrides"] == {"cube.hbm.pc_bw_gbps": "16"}


def test_capture_and_replay_default_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["capture", "gemm", *[a for kv in SMALL for a in ("-p", kv)]]) == 0
    assert main(["capture", "gemm", "-p", "M=64", "-p", "N=64", "-p", "K=64",
                 "--set", "cube.mesh.link_bw_gbps=64"]) == 0
    traces = sorted(p.name for p in (tmp_path / "data" / "traces").iterdir())
    assert traces == ["gemm-K_64-M_64-N_64", "gemm-K_64-M_64-N_64-small-cube.mesh.link_bw_gbps_64"]
    assert main(["replay", "gemm-K_64-M_64-N_64", "-t", "small"]) == 0
    assert main(["replay", "gemm-K_64-M_64-N_64", "-t", "small", "--set",
                 "cube.hbm.pc_bw_gbps=16"]) == 0
    runs = sorted(p.name for p in (tmp_path / "data" / "runs").iterdir())
    assert runs == ["gemm-K_64-M_64-N_64-small-cube.hbm.pc_bw_gbps_16-fast",
                    "gemm-K_64-M_64-N_64-small-fast"]
    capsys.readouterr()


def test_stale_run_message_reproduces_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = run_workload("gemm", params=SMALL, sets=["cube.hbm.pc_bw_gbps=16"], fidelity="flit",
                     out=tmp_path / "data", verify_data=False, make_report=False)
    # the trace is re-captured in place with other parameters: the run is now stale
    assert main(["capture", "gemm", "-p", "M=32", "-p", "N=64", "-p", "K=64",
                 "-o", str(s.trace_dir)]) == 0
    with pytest.raises(SchemaError, match="changed since this run was replayed") as ei:
        kbtrace.open_run(s.run_dir)
    assert "characters]..." not in str(ei.value)        # not elided: the commands are the fix
    cmds = re.findall(r"`(kbtrace [^`]+)`", str(ei.value))
    assert len(cmds) == 2 and cmds[0].startswith("kbtrace capture gemm -p K=64 -p M=64 -p N=64")
    assert "--set cube.hbm.pc_bw_gbps=16" in cmds[0] and "--set cube.hbm.pc_bw_gbps=16" in cmds[1]
    assert "--fidelity flit" in cmds[1]
    for cmd in cmds:                      # as printed: capture, then replay
        assert main(shlex.split(cmd)[1:]) == 0
    with kbtrace.open_run(s.run_dir) as run:
        assert run.makespan_ns == s.makespan_ns
        assert run.info["fidelity"] == "flit"

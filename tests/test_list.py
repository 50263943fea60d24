"""kbtrace list: every catalog, read without running workload code."""

from __future__ import annotations

import json

from kbtrace.cli import main
from kbtrace.studies.catalog import catalog


def test_catalog_frames():
    c = catalog()
    w = c["workloads"].filter(c["workloads"]["name"] == "gemm").row(0, named=True)
    assert w["description"].startswith("Tiled GEMM ``C = A @ B``")
    assert "M=256 N=256 K=128" in w["params"]
    t = c["topologies"].filter(c["topologies"]["name"] == "default").row(0, named=True)
    assert t["size"] == "2 SIP x 16 cubes x 8 PEs"
    assert {"hbm_bandwidth", "gemm_tiles"} <= set(c["sweeps"]["name"])
    assert "gemm" in set(c["studies"]["name"])
    base = c["runs"].filter(c["runs"]["name"] == "gemm").row(0, named=True)
    assert base["kind"] == "baseline" and "makespan 10,093.2 ns" in base["description"]


def test_list_cli_lists_new_traces_and_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "softmax", "-p", "R=16", "--no-report", "--no-verify"]) == 0
    capsys.readouterr()
    assert main(["list", "traces", "runs", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # the current directory's catalogs come first (the repository's data/ may hold more)
    # (names carry the non-default parameters: kbtrace._names)
    trace = next(t for t in out["traces"] if t["name"] == "softmax-R_16-small")
    assert trace["path"] == "data/traces/softmax-R_16-small" and trace["ops"] == "6"
    run = next(r for r in out["runs"] if r["name"] == "softmax-R_16-small-fast")
    assert run["kind"] == "run" and "softmax on small (fast)" in run["description"]
    assert main(["list", "workloads", "--format", "md"]) == 0
    assert "| softmax | Row-wise softmax" in capsys.readouterr().out
    assert main(["list", "bogus"]) == 2

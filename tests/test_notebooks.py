"""The notebooks in analysis/ run in a real Jupyter kernel (nbclient + ipykernel, the
`test` extra), as a user runs them: DuckDB settings that only fail under Jupyter, names
resolved from the notebook's directory, every cell's own assertions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import kbtrace
from kbtrace.analysis.main import run_workload
from kbtrace.analysis.synthetic import write_synthetic_run

nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbclient)")
nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]'")
pytest.importorskip("ipykernel", reason="pip install -e '.[test]'")

REPO = Path(__file__).resolve().parents[1]


def _execute(name: str, cwd: Path) -> dict[str, str]:
    """Run analysis/NAME in a python3 kernel started in ``cwd``; cell id -> its text output."""
    nb = nbformat.read(REPO / "analysis" / name, as_version=4)
    nbformat.validate(nb)                          # nbformat 4.5: every cell has an id
    assert all(c.get("id") for c in nb.cells)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}}).execute()
    out = {}
    for c in nb.cells:
        texts = [o.get("text") or o.get("data", {}).get("text/plain", "")
                 for o in c.get("outputs", [])]
        out[c.id] = "\n".join(t for t in texts if t)
    return out


def test_example_notebook_runs_in_a_kernel_on_a_run_named_like_the_cli(tmp_path, monkeypatch):
    s = run_workload("gemm", params=["M=64", "N=64", "K=64"], out=tmp_path / "data",
                     verify_data=False, make_report=False)
    # a run name, relative to the kernel's directory, as `kbtrace sql NAME` takes it
    monkeypatch.setenv("KBTRACE_RUN", s.run_dir.name)
    out = _execute("example.ipynb", tmp_path)
    assert f"Run('{s.run_dir}', makespan_ns={s.makespan_ns})" in out["c01"]
    assert "sip0.cube0.hbm_ctrl" in out["c03"]       # the hot spot of a memory-bound gemm
    assert "critical_path" in out["c01"] and "roofline" in out["c01"]


def test_sweep_notebook_compares_the_points_in_a_kernel(tmp_path, monkeypatch):
    monkeypatch.delenv("KBTRACE_SWEEP", raising=False)
    out = _execute("sweep.ipynb", tmp_path)
    assert out["s01"].rstrip().endswith("6 points")
    # makespan falls as HBM bandwidth rises (the gemm is HBM-bound); the mesh matters less
    assert "9497.7" in out["s03"] and "4889.7" in out["s03"]
    assert "cube.mesh.link_bw_gbps" in out["s07"]
    assert "1536" in out["s11"]                      # the same hops at every point


def test_open_run_resolves_names_like_the_cli(tmp_path, monkeypatch):
    src = write_synthetic_run(tmp_path / "syn")
    monkeypatch.chdir(tmp_path)
    shutil.copytree(src, tmp_path / "data" / "runs" / "synrun")
    with kbtrace.open_run("synrun") as run:          # data/runs/synrun under the cwd
        assert run.path == tmp_path / "data" / "runs" / "synrun" and run.makespan_ns == 180.0
    with kbtrace.open_run("syn/run") as run:         # a relative path is still a path
        assert run.makespan_ns == 180.0
    from kbtrace.errors import UsageError
    with pytest.raises(UsageError, match="did you mean 'synrun'"):
        kbtrace.open_run("synrn")

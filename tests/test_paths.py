"""Path arguments: a path as given, or a bare name looked up in its kind's catalog
(current directory first, then the repository); unknown names list what exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbtrace._paths import REPO_ROOT, catalog_names, resolve
from kbtrace.cli import main
from kbtrace.errors import UsageError


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "capture").mkdir()
    (tmp_path / "capture" / "mine.py").write_text("")
    (tmp_path / "capture" / "gemm.py").write_text("")          # shadows the repository's
    for d in ("data/runs/r1", "data/baselines/b1", "data/baselines/r1"):
        (tmp_path / d).mkdir(parents=True)
    return tmp_path


def test_existing_paths_are_taken_as_given(here):
    assert resolve("capture/mine.py", "workload") == Path("capture/mine.py")
    assert resolve(REPO_ROOT / "topologies" / "tiny.yaml", "topology") == \
        REPO_ROOT / "topologies" / "tiny.yaml"
    # relative to the repository when not under the current directory
    assert resolve("topologies/small.yaml", "topology") == REPO_ROOT / "topologies" / "small.yaml"


def test_bare_names_resolve_in_catalogs_current_directory_first(here):
    assert resolve("mine", "workload") == here / "capture" / "mine.py"
    assert resolve("mine.py", "workload") == here / "capture" / "mine.py"
    assert resolve("gemm", "workload") == here / "capture" / "gemm.py"       # cwd wins
    assert resolve("softmax", "workload") == REPO_ROOT / "capture" / "softmax.py"
    assert resolve("default", "topology") == REPO_ROOT / "topologies" / "default.yaml"
    assert resolve("hbm_bandwidth", "sweep") == REPO_ROOT / "replay" / "hbm_bandwidth.yaml"
    # run catalogs in order: data/runs before data/baselines
    assert resolve("r1", "run") == here / "data" / "runs" / "r1"
    assert resolve("b1", "run") == here / "data" / "baselines" / "b1"
    names = catalog_names("workload")
    assert names[:2] == ["gemm", "mine"] and "softmax" in names and names.count("gemm") == 1


def test_unknown_names_list_the_catalog_and_the_closest_match(here):
    with pytest.raises(UsageError) as ei:
        resolve("sofmax", "workload")
    msg = str(ei.value)
    assert msg.startswith("workload 'sofmax': no such path, and no workload of that name in "
                          "capture/ under ")
    assert "did you mean 'softmax'?" in msg and "known: gemm, mine, " in msg
    with pytest.raises(UsageError, match=r"did you mean 'tiny'\?"):
        resolve("tinny", "topology")
    with pytest.raises(UsageError, match="no such path"):              # a path is not a name
        resolve("nowhere/small", "topology")


def test_cli_takes_names_and_reports_unknown_ones_in_one_line(here, capsys):
    assert main(["topo", "show", "tiny"]) == 0
    assert "topology 'tiny'" in capsys.readouterr().out
    assert main(["replay", "nosuchtrace", "-t", "small"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kbtrace: error: trace 'nosuchtrace': ")
    assert main(["run", "gemm_composit", "--no-report"]) == 2
    assert "did you mean 'gemm_composite'?" in capsys.readouterr().err

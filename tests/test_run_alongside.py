"""``kbtrace run`` verifying alongside: verify in a second process while the headline and the
report run gives the same result as verifying after them, re-raises what verify raised, and
leaves no process or file behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import kbtrace.analysis.alongside as alongside
from kbtrace.analysis.alongside import VerifyAlongside
from kbtrace.analysis.main import run_workload
from kbtrace.analysis.verifier import verify
from kbtrace.errors import AnalysisError, SchemaError


def _leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("kbtrace-verify-*")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """softmax on small.yaml, run with verify alongside and after the report."""
    root = tmp_path_factory.mktemp("alongside")
    got = {}
    for va in (True, False):
        got[va] = run_workload("softmax", topology="small", out=root / str(va),
                               verify_alongside=va, attribute=False)
    return got


def test_alongside_gives_the_same_result_and_files(runs):
    a, b = runs[True], runs[False]
    assert a.verify.ok and b.verify.ok
    da, db = a.verify.to_dict(), b.verify.to_dict()
    da.pop("run_dir"), db.pop("run_dir")
    assert da == db and da["n_ops"] == 96
    assert a.seconds["verify"] > 0
    for name in ("op_timing.parquet", "hops.parquet"):     # (run.json: its path, wall time)
        assert (a.run_dir / name).read_bytes() == (b.run_dir / name).read_bytes(), name
    # the lines printed are the same but for the seconds
    assert a.lines("verify")[0].split(")")[0] == b.lines("verify")[0].split(")")[0]


def test_what_verify_raises_is_raised_as_inline(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[False].run_dir, run, ignore=shutil.ignore_patterns("report"))
    f = run / "op_timing.parquet"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF            # a flipped byte: the digest no longer matches
    f.write_bytes(bytes(data))
    with pytest.raises(SchemaError) as inline:
        verify(run)
    before = _leftovers()
    with pytest.raises(SchemaError) as child:
        VerifyAlongside(run).result()
    assert str(child.value) == str(inline.value) and "changed since kbtrace wrote it" in str(
        child.value)
    assert _leftovers() == before


def test_a_child_that_writes_nothing_is_one_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", shutil.which("true"))
    before = _leftovers()
    va = VerifyAlongside(tmp_path)
    with pytest.raises(AnalysisError, match=r"ended without a result \(exit status 0"):
        va.result()
    assert _leftovers() == before
    with pytest.raises(AnalysisError, match="already collected"):
        va.result()


def test_cancel_stops_the_child_and_removes_its_directory(runs):
    before = _leftovers()
    va = VerifyAlongside(runs[False].run_dir)
    proc = va._proc
    va.cancel()
    assert proc.poll() is not None
    assert _leftovers() == before


def test_the_automatic_choice(monkeypatch, tmp_path):
    started = []

    class Spy(VerifyAlongside):
        def __init__(self, run_dir, verbosity=0):
            started.append(Path(run_dir).name)
            super().__init__(run_dir, verbosity)

    monkeypatch.setattr(alongside, "VerifyAlongside", Spy)
    monkeypatch.setattr(alongside, "cores", lambda: 2)
    s = run_workload("softmax", topology="tiny", out=tmp_path / "a", make_report=False,
                     attribute=False)          # 96 ops: under ALONGSIDE_MIN_OPS
    assert s.verify.ok and started == []
    monkeypatch.setattr(alongside, "ALONGSIDE_MIN_OPS", 96)
    s = run_workload("softmax", topology="tiny", out=tmp_path / "b", make_report=False,
                     attribute=False)
    assert s.verify.ok and started == [s.run_dir.name]
    monkeypatch.setattr(alongside, "cores", lambda: 1)
    run_workload("softmax", topology="tiny", out=tmp_path / "c", make_report=False,
                 attribute=False)              # one core: nothing to run it beside
    s = run_workload("softmax", topology="tiny", out=tmp_path / "d", make_report=False,
                     attribute=False, verify_data=False)
    assert s.verify is None and len(started) == 1


def test_no_interpreter_to_start_verifies_inline(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    before = _leftovers()
    s = run_workload("softmax", topology="tiny", out=tmp_path / "a", make_report=False,
                     attribute=False, verify_alongside=True)
    assert s.verify.ok and s.verify.n_ops == 96 and s.seconds["verify"] > 0
    assert _leftovers() == before


def _alive(pid: int) -> bool:
    """The process runs (a zombie, dead and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_child_dies_with_its_parent():
    # a parent that starts a child as the alongside one arms itself, then dies at once
    parent = (
        "import subprocess, sys\n"
        "c = subprocess.Popen([sys.executable, '-c', 'from kbtrace.analysis.alongside import "
        "_die_with_parent; import time; _die_with_parent(); print(1, flush=True); "
        "time.sleep(60)'], stdout=subprocess.PIPE)\n"
        "c.stdout.readline()\n"
        "print(c.pid, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    pid = int(out.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)

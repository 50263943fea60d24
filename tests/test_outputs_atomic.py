"""Outputs are written whole or not at all, and an unwritable output path is one line.

A trace or run directory is built beside its destination and swapped in whole
(``_io.atomic_dir``): re-replaying over a run replaces every file of it (a report written
into the old run does not survive next to the new numbers), a failed capture or replay
leaves the earlier output as it was (or no directory at all), and kbtrace never replaces
a directory it did not write. Paths that cannot be written are ``OutputError`` lines,
malformed JSON metadata a ``SchemaError`` line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kbtrace._io import atomic_dir, atomic_path, check_replaceable, read_json_object, write_json
from kbtrace._owned import owner, write_marker
from kbtrace.capture import capture, open_trace
from kbtrace.cli import main
from kbtrace.errors import CaptureError, InvariantError, OutputError, SchemaError
from kbtrace.replay import ReplayOptions, engine, replay
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR, SynthTrace, hbm, load

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small():
    return compile_topology(TOPO_DIR / "small.yaml")


def _entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


# ---------------------------------------------------------------------------- atomic_dir
def test_atomic_dir_replaces_an_earlier_output_whole(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    write_marker(out, "run")
    (out / "run.json").write_text("{}")
    (out / "stale.txt").write_text("old")
    with atomic_dir(out, "run") as stage:
        assert stage.parent == tmp_path and stage.name.startswith(".run.")
        assert owner(stage) == "run"                   # marked from the start
        (stage / "a.txt").write_text("new")
        (stage / "run.json").write_text("{}")
    assert _entries(out) == [".kbtrace", "a.txt", "run.json"]
    assert _entries(tmp_path) == ["run"]                  # no staging or old copy left


def test_atomic_dir_failure_keeps_the_earlier_output(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    write_marker(out, "run")
    (out / "run.json").write_text('{"old": 1}')
    with pytest.raises(RuntimeError), atomic_dir(out, "run") as stage:
        (stage / "run.json").write_text('{"new": 1}')
        raise RuntimeError("boom")
    assert json.loads((out / "run.json").read_text()) == {"old": 1}
    assert _entries(tmp_path) == ["run"]


def test_atomic_dir_failure_leaves_no_directory_where_there_was_none(tmp_path):
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "a" / "b", "run"):
        raise RuntimeError("boom")
    assert not (tmp_path / "a" / "b").exists()
    assert _entries(tmp_path / "a") == []


def test_atomic_dir_takes_an_empty_directory(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    with atomic_dir(out, "run") as stage:
        (stage / "run.json").write_text("{}")
    assert _entries(out) == [".kbtrace", "run.json"]


def test_atomic_dir_refuses_what_kbtrace_did_not_write(tmp_path):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    (mine / "run.json").write_text("{}")      # a file name anyone may have is no marker
    with pytest.raises(OutputError, match=r"notes: exists and was not written by kbtrace \(no "
                                          r"kbtrace marker \.kbtrace\)"):
        check_replaceable(mine, "run")
    assert _entries(mine) == ["run.json", "thesis.tex"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputError, match="afile: exists and is a regular file, not a directory"):
        check_replaceable(afile, "run")


# ---------------------------------------------------------------------------- atomic_path
def test_unwritable_file_paths_are_output_errors(tmp_path):
    with pytest.raises(OutputError, match=r"cannot write .*it is a directory; give a file path"):
        write_json(tmp_path, {"a": 1})
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(OutputError, match=r"cannot write .*blocker/x\.json: .*blocker or a "
                                          r"directory above it is a file"):
        write_json(blocker / "x.json", {"a": 1})     # its parent is a file
    assert _entries(tmp_path) == ["blocker"]


def test_an_oserror_on_another_path_is_not_blamed_on_the_output(tmp_path):
    with pytest.raises(FileNotFoundError), atomic_path(tmp_path / "out.txt"):
        (tmp_path / "missing-input").read_text()


# ---------------------------------------------------------------------------- JSON
@pytest.mark.parametrize("text, why", [
    ("{x", r"corrupt or truncated JSON \(Expecting property name .* at line 1, column 2\)"),
    ("[]", r"corrupt \(a JSON array, not an object\)")])
def test_malformed_json_metadata_is_a_schema_error(tmp_path, text, why):
    f = tmp_path / "m.json"
    f.write_text(text)
    with pytest.raises(SchemaError, match=f"m.json: {why}.*; fix it"):
        read_json_object(f, "fix it")


# ---------------------------------------------------------------------------- replay
def _trace():
    small = compile_topology(TOPO_DIR / "small.yaml")
    return SynthTrace([load(hbm(0, 0, 1, small), 4096)], "atomic")


def test_rereplay_replaces_the_run_and_whatever_was_written_into_it(tmp_path, small):
    out = tmp_path / "run"
    replay(_trace(), small, ReplayOptions(out_dir=str(out)))
    (out / "report").mkdir()
    (out / "report" / "summary.md").write_text("makespan of the old run")
    first = (out / "hops.parquet").read_bytes()
    replay(_trace(), small, ReplayOptions(out_dir=str(out)))
    assert _entries(out) == [".kbtrace", "hops.parquet", "links.parquet", "nodes.parquet",
                             "op_timing.parquet", "run.json"]
    assert (out / "hops.parquet").read_bytes() == first
    assert _entries(tmp_path) == ["run"]


def test_replay_refuses_a_foreign_directory_before_simulating(tmp_path, small):
    (tmp_path / "mine.txt").write_text("x")
    with pytest.raises(OutputError, match="exists and was not written by kbtrace"):
        replay(_trace(), small, ReplayOptions(out_dir=str(tmp_path)))
    assert _entries(tmp_path) == ["mine.txt"]


def test_failed_replay_keeps_the_earlier_run(tmp_path, small, monkeypatch):
    out = tmp_path / "run"
    replay(_trace(), small, ReplayOptions(out_dir=str(out)))
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def violated(sim, makespan):      # fails after the hops were written to the staging dir
        raise InvariantError("link x: over 100%")

    monkeypatch.setattr(engine.invariants, "check", violated)
    with pytest.raises(InvariantError, match="replay finalize: link x: over 100%"):
        replay(_trace(), small, ReplayOptions(out_dir=str(out)))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _entries(tmp_path) == ["run"]


# ---------------------------------------------------------------------------- capture
def test_failed_capture_leaves_no_directory_and_an_earlier_trace_intact(tmp_path, small):
    wl = ROOT / "capture" / "softmax.py"
    with pytest.raises(CaptureError):
        capture(wl, small, params=["R=-4"], out_dir=tmp_path / "new")
    assert not (tmp_path / "new").exists()
    good = capture(wl, small, params=["R=8", "C=64"], out_dir=tmp_path / "t")
    with pytest.raises(CaptureError):
        capture(wl, small, params=["R=-4"], out_dir=tmp_path / "t")
    assert open_trace(tmp_path / "t").meta == good.meta      # hashes checked: files intact
    assert _entries(tmp_path) == ["t"]


@pytest.mark.parametrize("text", ["{bad", "[]"])
def test_malformed_trace_json_is_one_line(tmp_path, small, capsys, text):
    capture(ROOT / "capture" / "softmax.py", small, params=["R=8", "C=64"],
            out_dir=tmp_path / "t")
    (tmp_path / "t" / "trace.json").write_text(text)
    assert main(["replay", str(tmp_path / "t"), "-t", "small", "-o", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trace.json: " in err[0] and "re-capture the workload" in err[0]
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------------------- CLI
def test_cli_unwritable_output_is_one_line(tmp_path, small, capsys):
    run = tmp_path / "run"
    replay(_trace(), small, ReplayOptions(out_dir=str(run)))
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    assert main(["export", "perfetto", str(run), "-o", str(blocker / "t.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kbtrace: error: cannot write {blocker / 't.json'}: {blocker} or a "
                   f"directory above it is a file; choose another output path (-o)"]


def test_cli_reports_an_unforeseen_oserror_in_one_line(monkeypatch, capsys):
    from kbtrace import cli

    def vanished(args):
        raise PermissionError(13, "Permission denied", "/some/where")

    class Parser:
        def parse_args(self, argv):
            return argparse.Namespace(func=vanished, command="x")

    monkeypatch.setattr(cli, "build_parser", Parser)
    assert cli.main(["x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kbtrace: error: /some/where: Permission denied; check the path, its "
                   "permissions and free space"]



def test_cli_warns_when_a_capture_records_no_ops(tmp_path, capsys):
    assert main(["capture", "softmax", "-p", "R=0", "-o", str(tmp_path / "t")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kbtrace: warning: softmax (")
    assert "R=0" in err[0] and "recorded no ops" in err[0]


def test_atomic_dir_refuses_to_replace_the_current_directory(tmp_path, monkeypatch):
    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    with (pytest.raises(OutputError, match=r"\.: is the current directory .* give a subdirectory"),
          atomic_dir(".", "run")):
        pass
    assert here.is_dir() and _entries(tmp_path) == ["empty"]

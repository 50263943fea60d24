"""Analysis commands on damaged or stale inputs: one actionable line and exit 2, never a
traceback and never a PASS (stale trace, corrupt run files, bad SQL arguments, baselines)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kbtrace.analysis.baseline import check_baselines, update_command
from kbtrace.analysis.differ import diff
from kbtrace.analysis.formats import resolve_query
from kbtrace.analysis.main import capture_and_replay
from kbtrace.analysis.run import open_run
from kbtrace.analysis.summary import summarize, write_summary
from kbtrace.analysis.synthetic import write_synthetic_run
from kbtrace.analysis.verifier import verify
from kbtrace.cli import main
from kbtrace.errors import AnalysisError, SchemaError, UsageError
from test_replay_util import copy_run

REPO = Path(__file__).resolve().parents[1]
SMALL = REPO / "topologies" / "small.yaml"
GEMM = REPO / "capture" / "gemm.py"
P128 = {"M": 128, "N": 128, "K": 128}          # 128 ops
P64 = {"M": 64, "N": 64, "K": 64}              # 20 ops: another trace at the same path


@pytest.fixture(scope="module")
def gemm_run(tmp_path_factory):
    """A real capture + replay (gemm, 128 ops); tests copy it before damaging it."""
    root = tmp_path_factory.mktemp("inputs")
    capture_and_replay(GEMM, SMALL, P128, "fast", root / "trace", root / "run")
    return root / "run"


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- 1. a trace re-captured after the replay -------------------------------------------------

def test_stale_trace_is_refused_everywhere(gemm_run, tmp_path, capsys):
    run = copy_run(gemm_run, tmp_path / "g")
    assert verify(run).ok                          # the untouched copy is fine
    want = json.loads((run / "run.json").read_text())["trace"]["hash"]
    from kbtrace.capture import capture
    capture(GEMM, SMALL, params=P64, out_dir=run.parent / "trace")   # overwrite the trace
    with pytest.raises(SchemaError) as ei:
        verify(run)
    msg = str(ei.value)
    assert msg.startswith(f"{run / 'run.json'}: the trace at {run.parent / 'trace'} changed "
                          "since this run was replayed (hash ")
    assert f"run has {want})" in msg and "then `kbtrace replay" in msg
    assert "-t small " in msg and "re-capture the original trace" in msg
    for argv in (["verify", str(run)], ["sql", str(run), "SELECT count(*) FROM ops"],
                 ["report", str(run), "-o", str(tmp_path / "rep")],
                 ["export", "perfetto", str(run), "-o", str(tmp_path / "t.json")]):
        assert main(argv) == 2, argv
        line = _err(capsys)
        assert "changed since this run was replayed" in line and "PASS" not in line
    assert not (tmp_path / "t.json").exists()
    # diff reads only the run's own files: still allowed, and unchanged against itself
    assert diff(run, run).unchanged
    # the original trace back: accepted again (the check is on content, not on time)
    capture(GEMM, SMALL, params=P128, out_dir=run.parent / "trace")
    res = verify(run)
    assert res.ok and res.n_ops == 128


def test_run_without_recorded_hash_is_not_checked(tmp_path):
    run = write_synthetic_run(tmp_path / "s")     # an older run.json: trace_dir, no trace.hash
    with open_run(run) as r:
        assert r.sql("SELECT count(*) AS n FROM ops")["n"][0] == 9


def test_verify_refuses_timing_rows_of_another_trace(gemm_run, tmp_path):
    # no hash to compare (older run.json): the op ids themselves give it away
    run = copy_run(gemm_run, tmp_path / "g")
    from kbtrace.capture import capture
    capture(GEMM, SMALL, params=P64, out_dir=run.parent / "trace")
    meta = json.loads((run / "run.json").read_text())
    del meta["trace"]["hash"]
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(AnalysisError, match=r"op_timing has 108 rows for ops the trace does not "
                                            r"have \(first: op 20\); the run was replayed from "
                                            r"another trace"):
        verify(run)


# -- 2. corrupt files in a run directory ------------------------------------------------------

def _forget_digests(run: Path) -> None:
    """Drop run.json ``files``, as in runs written before digests were recorded: readers
    then decode the damaged file itself (and still name it)."""
    meta = json.loads((run / "run.json").read_text())
    del meta["files"]
    (run / "run.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["op_timing", "hops", "nodes", "links"])
def test_truncated_parquet_is_one_line(gemm_run, tmp_path, capsys, name):
    run = copy_run(gemm_run, tmp_path / "g")
    f = run / f"{name}.parquet"
    with open(f, "r+b") as fh:
        fh.truncate(300)
    assert main(["sql", str(run), "SELECT 1"]) == 2     # the digest run.json records
    line = _err(capsys)
    assert line.startswith(f"kbtrace: error: {f}: changed since kbtrace wrote it (digest ")
    assert line.endswith("); re-run `kbtrace replay` to regenerate the run")
    _forget_digests(run)
    cmds = [["sql", str(run), "SELECT 1"], ["report", str(run), "-o", str(tmp_path / "rep")],
            ["export", "perfetto", str(run), "-o", str(tmp_path / "t.json")],
            ["diff", str(run), str(gemm_run)]]
    if name == "op_timing":             # the one run file verify reads
        cmds.append(["verify", str(run)])
    for argv in cmds:
        assert main(argv) == 2, argv
        assert _err(capsys) == (f"kbtrace: error: {f}: corrupt or truncated Parquet file "
                                "(Parquet magic bytes not found in footer); re-run `kbtrace "
                                "replay` to regenerate the run")


def test_corrupt_pages_behind_an_intact_footer_name_the_file(gemm_run, tmp_path, capsys):
    run = copy_run(gemm_run, tmp_path / "g")
    f = run / "hops.parquet"
    data = bytearray(f.read_bytes())
    data[8:len(data) // 2] = b"\xab" * (len(data) // 2 - 8)     # footer (schema) intact
    f.write_bytes(bytes(data))
    pq.read_schema(f)
    _forget_digests(run)
    for argv in (["sql", str(run), "SELECT sum(t_leave_ns) FROM hops"],
                 ["report", str(run), "-o", str(tmp_path / "rep")], ["diff", str(run), str(run)]):
        assert main(argv) == 2, argv
        line = _err(capsys)
        assert line.startswith(f"kbtrace: error: {f}: corrupt or truncated Parquet file (")
        assert line.endswith("); re-run `kbtrace replay` to regenerate the run")


@pytest.mark.parametrize("text, detail", [
    ("{x", "corrupt or truncated JSON (Expecting property name enclosed in double quotes at "
           "line 1, column 2)"),
    ("", "corrupt or truncated JSON (Expecting value at line 1, column 1)"),
    ("[]", "corrupt (a JSON array, not an object)"),
    ('"run"', "corrupt (a JSON string, not an object)"),
])
def test_malformed_run_json(gemm_run, tmp_path, capsys, text, detail):
    run = copy_run(gemm_run, tmp_path / "g")
    (run / "run.json").write_text(text)
    for argv in (["verify", str(run)], ["sql", str(run), "top_hotspots"],
                 ["report", str(run)], ["export", "perfetto", str(run), "-o", str(tmp_path / "t")],
                 ["diff", str(run), str(gemm_run)]):
        assert main(argv) == 2, argv
        assert _err(capsys) == (f"kbtrace: error: {run / 'run.json'}: {detail}; re-run "
                                "`kbtrace replay` to regenerate the run")


@pytest.mark.parametrize("edit, detail", [
    (lambda m: m.update(makespan_ns="abc"), "makespan_ns is a JSON string, expected a number"),
    (lambda m: m.update(trace=[1]), "trace is a JSON array, expected an object"),
    (lambda m: m["trace"].update(path=7), "trace.path is a JSON number, expected a string"),
    (lambda m: m.update(peaks=[]), "peaks is a JSON array, expected an object"),
])
def test_mistyped_run_json_fields(gemm_run, tmp_path, capsys, edit, detail):
    run = copy_run(gemm_run, tmp_path / "g")
    meta = json.loads((run / "run.json").read_text())
    edit(meta)
    (run / "run.json").write_text(json.dumps(meta))
    for argv in (["verify", str(run)], ["sql", str(run), "SELECT 1"]):
        assert main(argv) == 2, argv
        assert _err(capsys) == (f"kbtrace: error: {run / 'run.json'}: corrupt: {detail}; "
                                "re-run `kbtrace replay` to regenerate the run")


def test_corrupt_baseline_files(tmp_path, capsys):
    run = write_synthetic_run(tmp_path / "s")
    bl = write_summary(summarize(run), tmp_path / "bl" / "gemm")
    (bl / "summary.json").write_text("{")
    assert main(["diff", str(bl), str(run)]) == 2
    line = _err(capsys)
    assert line.startswith(f"kbtrace: error: {bl / 'summary.json'}: corrupt or truncated JSON")
    assert line.endswith(f"re-create it with `kbtrace baseline update gemm --root "
                         f"{tmp_path / 'bl'}`")
    write_summary(summarize(run), bl)
    with open(bl / "ops.parquet", "r+b") as fh:
        fh.truncate(100)
    assert main(["diff", str(bl), str(run)]) == 2
    assert _err(capsys).startswith(f"kbtrace: error: {bl / 'ops.parquet'}: changed since kbtrace "
                                   "wrote it (digest ")
    doc = json.loads((bl / "summary.json").read_text())
    del doc["files"]                          # a baseline written before digests were recorded
    (bl / "summary.json").write_text(json.dumps(doc))
    assert main(["diff", str(bl), str(run)]) == 2
    assert _err(capsys).startswith(f"kbtrace: error: {bl / 'ops.parquet'}: corrupt or truncated "
                                   "Parquet file (")


# -- 3. sql arguments -----------------------------------------------------------------------

def test_sql_empty_query_and_missing_file(tmp_path, capsys, monkeypatch):
    run = write_synthetic_run(tmp_path / "s")
    for q in ("", "   "):
        assert main(["sql", str(run), q]) == 2
        assert _err(capsys) == ("kbtrace: error: the SQL query is empty; pass SQL text in quotes, "
                                "a saved query name (e.g. top_hotspots) or a .sql file")
    for q in (str(tmp_path / "nope.sql"), "nope.sql", str(tmp_path / "dir" / "q")):
        assert main(["sql", str(run), q]) == 2
        assert _err(capsys) == (f"kbtrace: error: {q}: no such file; check the path of the .sql "
                                "file, or pass SQL text in quotes or a saved query name "
                                "(e.g. top_hotspots)")
    (tmp_path / "empty.sql").write_text("\n")
    with pytest.raises(UsageError, match=r"empty.sql: the SQL file is empty"):
        resolve_query(str(tmp_path / "empty.sql"))
    (tmp_path / "q.sql").write_text("SELECT 6 * 7 AS answer")
    assert main(["sql", str(run), str(tmp_path / "q.sql"), "-f", "csv"]) == 0
    assert capsys.readouterr().out == "answer\n42\n"
    # SQL text with a slash is still SQL
    assert main(["sql", str(run), "SELECT 1/2 AS half", "-f", "csv"]) == 0
    assert capsys.readouterr().out == "half\n0.5\n"
    with open_run(run) as r, pytest.raises(UsageError, match="the SQL query is empty"):
        r.sql(" ")


# -- 4. verify without op_timing ------------------------------------------------------------

def test_verify_missing_op_timing_says_replay(gemm_run, tmp_path, capsys):
    run = copy_run(gemm_run, tmp_path / "g")
    (run / "op_timing.parquet").unlink()
    assert main(["verify", str(run)]) == 2
    assert _err(capsys) == (f"kbtrace: error: {run / 'op_timing.parquet'}: missing; re-run "
                            "`kbtrace replay` to regenerate the run")
    shutil.copy(gemm_run / "op_timing.parquet", run / "op_timing.parquet")
    (run.parent / "trace" / "memory.parquet").unlink()     # a trace file: re-capture
    assert main(["verify", str(run)]) == 2
    assert "memory.parquet: missing; verify needs the run's trace (re-capture it" in _err(capsys)


# -- 6. baseline check keeps --root -----------------------------------------------------------

def test_missing_baseline_suggests_the_same_root(tmp_path, capsys):
    root = tmp_path / "bl"
    with pytest.raises(AnalysisError) as ei:
        next(check_baselines(["gemm"], root=root))
    assert str(ei.value) == (f"no baseline for gemm in {root}; create it with "
                             f"`kbtrace baseline update gemm --root {root}`")
    assert main(["baseline", "check", "gemm", "--root", str(root)]) == 2
    assert f"`kbtrace baseline update gemm --root {root}`" in _err(capsys)
    assert update_command("gemm") == "kbtrace baseline update gemm"
    assert update_command("gemm", REPO / "data" / "baselines") == "kbtrace baseline update gemm"


# -- 7. report --help -----------------------------------------------------------------------

def test_report_help_names_sweeps(capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert ("run directory, sweep directory or directory of runs (a per-point report), or its "
            "name in data/runs/ or data/sweeps/") in out

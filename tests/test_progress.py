"""What commands show while they work: summary lines of `kbtrace run` as each stage ends
(also through a pipe), progress through rich on a terminal only, -q / -v, diagnostics
through logging."""

from __future__ import annotations

import io
import subprocess
import sys

from kbtrace._progress import progress, replay_task, setup_logging
from kbtrace.cli import main
from kbtrace.replay.options import Progress

SMALL = ["-p", "M=64", "-p", "N=64", "-p", "K=64"]


def test_run_summary_streams_through_a_pipe(tmp_path):
    """The header and the capture line arrive before the report exists (they used to
    arrive all at once at the end: stdout is block-buffered in a pipe)."""
    proc = subprocess.Popen([sys.executable, "-m", "kbtrace", "run", "gemm", *SMALL, "-o",
                             str(tmp_path / "data")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        header = proc.stdout.readline()
        capture = proc.stdout.readline()
        report_dir = tmp_path / "data" / "runs" / "gemm-K_64-M_64-N_64-small-fast" / "report"
        streamed = not report_dir.exists()          # the report is the last stage
        rest, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert header.startswith("kbtrace run: gemm-K_64-M_64-N_64 on small (fast)")
    assert capture.startswith("  capture   20 ops")
    assert streamed, "the summary arrived only after the report was written"
    assert proc.returncode == 0 and "  verify    PASS" in rest and (report_dir / "index.html").is_file()
    assert err == ""                                 # no progress output through a pipe


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_rich_on_a_terminal_lines_on_request_else_nothing():
    p = Progress(ops_done=20, ops=20, events=325, sim_ns=606.1, wall_s=0.1)
    tty = _Tty()
    with progress(None, tty) as bars:
        assert bars.mode == "rich"
        update = replay_task(bars)
        update(Progress(ops_done=10, ops=20, events=100, sim_ns=300.0, wall_s=0.05))
        bars.rich.refresh()                        # what the display thread draws
        update(p)
    shown = tty.getvalue()
    assert "replay" in shown and "10/20" in shown and "t = 300.0 ns, 100 events" in shown
    pipe = io.StringIO()
    with progress(None, pipe) as bars:             # not a terminal: nothing by default
        replay_task(bars)(p)
    assert pipe.getvalue() == ""
    with progress(True, pipe) as bars:             # --progress through a pipe: plain lines
        replay_task(bars)(p)
    assert pipe.getvalue().splitlines() == [
        "replay: 20/20 ops (100%), t = 606.1 ns, 325 events, 0.1 s"] * 2   # first and final
    setup_logging(-1)
    try:
        with progress(None, tty) as bars:          # -q: no bars even on a terminal
            assert bars.mode == "off"
    finally:
        setup_logging(0)


def test_quiet_and_verbose(tmp_path, capsys):
    args = ["capture", "softmax", "-p", "R=0", "-o", str(tmp_path / "t")]
    assert main(args) == 0
    assert capsys.readouterr().err.startswith("kbtrace: warning: softmax (")
    for quiet in (["-q", *args], [*args, "--quiet"]):    # before or after the subcommand
        assert main(quiet) == 0
        assert capsys.readouterr().err == ""
    assert main(["run", "gemm", *SMALL, "-o", str(tmp_path / "d"), "--no-report", "-v"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(" took ")[0] for ln in err if " took " in ln] == [
        "kbtrace: info: capture", "kbtrace: info: replay", "kbtrace: info: verify",
        "kbtrace: info: run"]                 # each stage, then the whole command
    assert err[-1].endswith("s (exit 0)")
    topo = [ln for ln in err if ln.startswith("kbtrace: info: topology ")]
    assert topo and all(ln.endswith(".pkl)") or ": compiled" in ln for ln in topo)


def test_verbose_says_what_its_help_says(tmp_path, capsys):
    """-v: the command's wall time and topology cache use; -vv: each analysis view
    materialised; neither without -v (the help text promised cache use, and -vv, that no
    code logged)."""
    from kbtrace.analysis.synthetic import write_synthetic_run
    from kbtrace.cli import build_parser

    run = write_synthetic_run(tmp_path / "s")
    assert main(["report", str(run), "-o", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().err == ""
    assert main(["-v", "report", str(run), "-o", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(" took ")[0] for ln in err] == ["kbtrace: info: report"]
    assert main(["report", str(run), "-o", str(tmp_path / "r"), "-vv"]) == 0
    err = capsys.readouterr().err
    for view in ("_pe_segments", "_busy_islands", "utilisation", "_crit_pred", "critical_path"):
        assert f"kbtrace: debug: run: view {view} materialised in " in err, view
    assert main(["-v", "topo", "show", "small"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("kbtrace: info: topology ") and "small.yaml" in err[0]
    assert err[-1].startswith("kbtrace: info: topo show took ")
    help_v = next(a.help for a in build_parser()._actions if "-v" in a.option_strings)
    assert "wall time" in help_v and "cache" in help_v and "-vv" in help_v

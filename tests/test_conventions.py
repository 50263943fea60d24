"""CLI and package conventions: `python -m kbtrace`, one spelling of the output option,
`--format` (text/csv/md/json) wherever a table is printed, Markdown cells escaped,
`dir(kbtrace)` listing the public API."""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys

import polars as pl
import pytest

import kbtrace
from kbtrace._tables import TABLE_FORMATS, render
from kbtrace.analysis.main import run_workload
from kbtrace.analysis.synthetic import write_synthetic_run
from kbtrace.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for every leaf subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for sub in subs:
        for name, p in sub.choices.items():
            yield from _commands(p, (*path, name))


def test_python_dash_m_kbtrace():
    res = subprocess.run([sys.executable, "-m", "kbtrace", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == f"kbtrace {kbtrace.__version__}"


def test_output_option_is_spelled_one_way():
    seen = []
    for path, p in _commands(build_parser()):
        for a in p._actions:
            if any(s in ("-o", "--out", "--output") for s in a.option_strings):
                assert a.option_strings == ["-o", "--out"], (path, a.option_strings)
                seen.append(" ".join(path))
    assert set(seen) >= {"capture", "diff", "export perfetto", "replay", "report", "run",
                         "sql", "sweep", "topo draw"}


def test_every_table_command_has_format():
    fmts = {" ".join(path): next((a.choices for a in p._actions if "--format" in a.option_strings),
                                 None)
            for path, p in _commands(build_parser())}
    for cmd in ("sql", "verify", "diff", "baseline check", "sweep", "topo route", "list",
                "probe"):
        assert set(TABLE_FORMATS) <= set(fmts[cmd]), cmd
    assert "parquet" in fmts["sql"]


def test_list_and_probe_take_format_and_json_is_a_deprecated_alias(capsys):
    """`kbtrace list` / `probe` had --json where every other table command has --format."""
    import json

    assert main(["list", "topologies", "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "topologies (3)" and out[1] == "name,description,size"
    assert main(["list", "topologies", "-f", "json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert {t["name"] for t in js["topologies"]} == {"default", "small", "tiny"}
    assert main(["list", "topologies", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out) == js
    assert cap.err == "kbtrace: note: --json is deprecated and will go; use --format json\n"
    assert main(["list", "topologies"]) == 0                 # text, as every table command
    assert capsys.readouterr().out.splitlines()[2].startswith("-------")
    assert main(["probe", "--case", "h2d-1hop", "-f", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("case,src,dst,actual_ns,")


def test_markdown_escapes_pipes_and_newlines():
    df = pl.DataFrame({"a|b": ["x | y", "two\nlines"], "n": [1, 2]})
    assert render(df, "md") == ("| a\\|b | n |\n|---|---|\n| x \\| y | 1 |\n"
                                "| two<br>lines | 2 |\n")
    assert json.loads(render(pl.DataFrame({"v": [1.5, float("nan")]}), "json")) == [
        {"v": 1.5}, {"v": None}]
    assert render(df.select("n"), "table") == render(df.select("n"), "text")


def test_dir_lists_the_public_api():
    names = dir(kbtrace)
    for n in ("open_run", "replay", "capture", "compile_topology", "verify", "diff", "report",
              "KbtraceError", "__version__"):
        assert n in names


def test_table_formats_of_verify_diff_sql(tmp_path, capsys):
    s = run_workload("gemm", params=["M=64", "N=64", "K=64"], out=tmp_path / "data",
                     verify_data=False, make_report=False)
    assert main(["verify", str(s.run_dir), "--format", "json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ok"] is True and res["n_ops"] == 20 and res["tensors"][0]["tensor"] == "c"
    assert main(["verify", str(s.run_dir), "-f", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["tensor"], r["shape"], r["ok"]) for r in rows] == [("c", "64x64", "true")]
    run = write_synthetic_run(tmp_path)
    assert main(["diff", str(run), str(run), "-f", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[0]["metric"] == "makespan" and float(rows[0]["base"]) == 180.0
    assert main(["sql", str(run), "SELECT 'a|b' AS x", "-f", "md"]) == 0
    assert capsys.readouterr().out == "| x |\n|---|\n| a\\|b |\n"
    assert main(["sql", str(run), "SELECT 1 AS x", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"x": 1}]
    with pytest.raises(SystemExit):
        main(["sql", str(run), "SELECT 1", "-f", "xml"])


def test_topo_route_formats(capsys):
    assert main(["topo", "route", "small", "sip0.cube0.pe0.dma", "sip0.cube0.hbm_ctrl.pe0",
                 "-f", "json"]) == 0
    hops = json.loads(capsys.readouterr().out)
    assert hops[0]["hop"] == 0 and hops[0]["link_kind"] is None
    assert hops[-1]["node"] == "sip0.cube0.hbm_ctrl.pe0"

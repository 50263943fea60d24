"""Topology input the YAML parser alone would accept or crash on: malformed ``--set`` values,
repeated keys, empty files, non-mapping sections, and checks failing on an overridden value.
Each is one TopologyError line naming the file (and the override), the YAML path and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbtrace.cli import main
from kbtrace.errors import TopologyError
from kbtrace.topology import compile_topology

TOPO = Path(__file__).resolve().parents[1] / "topologies"
SMALL = TOPO / "small.yaml"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KBTRACE_CACHE_DIR", str(tmp_path / "cache"))


def _error(path, overrides=None) -> str:
    with pytest.raises(TopologyError) as exc:
        compile_topology(path, overrides=overrides, use_cache=False)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


# ----------------------------------------------------------------------------- 1. --set values

@pytest.mark.parametrize("key, value, reason", [
    ("cube.hbm.pc_bw_gbps", "[1", "expected ',' or ']', but got '<stream end>' at column 3"),
    ("cube.hbm.pc_bw_gbps", "{a", "expected ',' or '}', but got '<stream end>' at column 3"),
    ("sip.io_chiplets", "[{side: N, side: S}]", "duplicate key [0].side"),
])
def test_malformed_override_value(key, value, reason):
    msg = _error(SMALL, {key: value})
    assert msg == (f"{SMALL}: --set {key}={value}: the value is not valid YAML ({reason}); write a "
                   "YAML scalar, list or mapping, e.g. 16, [1, 2] or [{side: N}], and quote it "
                   "for the shell")


def test_yaml_override_values_still_parse():
    t = compile_topology(SMALL, overrides={"sip.io_chiplets": "[{side: N}, {side: S}]"}, use_cache=False)
    assert [io.side for io in t.params.sip.io_chiplets] == ["N", "S"]


@pytest.mark.parametrize("command, value", [
    (["topo", "show", "small"], "cube.hbm.pc_bw_gbps=[1"),
    (["capture", "gemm"], "cube.hbm.pc_bw_gbps={a"),
])
def test_cli_malformed_set_is_one_line_exit_2(command, value, capsys, tmp_path):
    out = ["-o", str(tmp_path / "trace")] if command[0] == "capture" else []
    assert main([*command, "--set", value, *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"small.yaml: --set {value}: the value is not valid YAML" in err


# ----------------------------------------------------------------------------- 2. duplicates, empty

@pytest.mark.parametrize("text, message", [
    ("cube: {hbm: {pc_bw_gbps: 32, pc_bw_gbps: 16}}",
     "cube.hbm.pc_bw_gbps: duplicate key at line 1, column 30 (first set at column 14); keep only one"),
    ("cube:\n  hbm:\n    pc_bw_gbps: 32\n    pc_bw_gbps: 16",
     "cube.hbm.pc_bw_gbps: duplicate key at line 4 (first set at line 3); keep only one of them"),
    ("name: a\ncube: {}\nname: b", "name: duplicate key at line 3 (first set at line 1)"),
    ("cube:\n  mesh: {rows: 6}\ncube:\n  hbm: {pc_bw_gbps: 8}", "cube: duplicate key at line 3"),
    ("sip:\n  io_chiplets:\n    - {side: W}\n    - {side: E, side: N}",
     "sip.io_chiplets[1].side: duplicate key at line 4"),
])
def test_duplicate_keys_are_refused(tmp_path, text, message):
    f = tmp_path / "dup.yaml"
    f.write_text(text + "\n")
    msg = _error(f)
    assert msg.startswith(f"{f}: ") and message in msg, msg


def test_merge_keys_and_aliases_are_not_duplicates(tmp_path):
    f = tmp_path / "merge.yaml"
    f.write_text("pe:\n  ipcq:\n    sram: &tier {bw_gbps: 100, overhead_ns: 3}\n"
                 "    hbm: {<<: *tier, bw_gbps: 50}\n")
    ipcq = compile_topology(f, use_cache=False).params.pe.ipcq
    assert (ipcq.sram.bw_gbps, ipcq.hbm.bw_gbps, ipcq.hbm.overhead_ns) == (100.0, 50.0, 3.0)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "null\n", "---\n"])
def test_empty_file_is_an_error(tmp_path, text):
    f = tmp_path / "empty.yaml"
    f.write_text(text)
    assert _error(f) == (f"{f}: the topology file is empty (no keys, only comments or null); "
                         "start from a copy of topologies/small.yaml")


def test_explicit_empty_mapping_means_defaults(tmp_path):
    f = tmp_path / "defaults.yaml"
    f.write_text("{}\n")
    assert compile_topology(f, use_cache=False).params == compile_topology(TOPO / "default.yaml").params


# ----------------------------------------------------------------------------- 3. section paths

@pytest.mark.parametrize("text, path", [
    ("cube: 5", "cube must be a mapping, got 5"),
    ("cube: {hbm: 5}", "cube.hbm must be a mapping, got 5"),
    ("sip: {io_chiplets: [5]}", "sip.io_chiplets[0] must be a mapping, got 5"),
])
def test_non_mapping_section_path(tmp_path, text, path):
    f = tmp_path / "sectype.yaml"
    f.write_text(text + "\n")
    assert _error(f) == f"{f}: {path}; write its keys indented under it, or as {{key: value, ...}}"


# ----------------------------------------------------------------------------- 4. overrides named

def test_cross_field_check_names_the_override():
    msg = _error(SMALL, {"pe.tcm.size_kb": "1"})
    assert msg == (f"{SMALL} with --set pe.tcm.size_kb=1: pe.tcm.scratch_kb = 1024: exceeds "
                   "pe.tcm.size_kb = 1; raise pe.tcm.size_kb or lower pe.tcm.scratch_kb")


def test_cross_field_check_without_override_says_how_to_fix(tmp_path):
    f = tmp_path / "tcm.yaml"
    f.write_text("pe: {tcm: {size_kb: 64, scratch_kb: 128}}\n")
    assert _error(f) == (f"{f}: pe.tcm.scratch_kb = 128: exceeds pe.tcm.size_kb = 64; "
                         "raise pe.tcm.size_kb or lower pe.tcm.scratch_kb")


@pytest.mark.parametrize("overrides, subject, message", [
    ({"cube.mesh.rows": "six", "cube.hbm.pc_bw_gbps": 8}, "--set cube.mesh.rows=six",
     "cube.mesh.rows = 'six': must be an integer"),
    ({"cube.mesh.rows": 2, "cube.mesh.cols": 2}, "--set cube.mesh.cols=2 --set cube.mesh.rows=2",
     "cube.mesh.hbm_zone[0] = [2, 2]: off the 2x2 mesh; remove it"),
    ({"sip.cube_mesh_h": 9}, "--set sip.cube_mesh_h=9",
     "sip.cube_mesh_w = 2: 2x9 = 18 cubes; at most 16 per SIP (die ids 0..15); lower "
     "sip.cube_mesh_w or sip.cube_mesh_h"),
    ({"sip.io_chiplets": [{"side": "W"}] * 3}, '--set sip.io_chiplets=[{"side": "W"}, {"side": '
     '"W"}, {"side": "W"}]', "sip.io_chiplets[2].side = 'W': at most 2"),
    ({"cube.mesh.pitch_mm": 0, "cube.mesh.router_overhead_ns": 0, "pe.tcm.scratch_kb": 8},
     "--set cube.mesh.pitch_mm=0 --set cube.mesh.router_overhead_ns=0", "a zero-latency hop"),
])
def test_only_the_overrides_a_check_reads_are_named(overrides, subject, message):
    msg = _error(SMALL, overrides)
    assert msg.startswith(f"{SMALL} with {subject}: ") and message in msg, msg


def test_cli_capture_names_the_override(capsys, tmp_path):
    assert main(["capture", "gemm", "--set", "pe.tcm.size_kb=1", "-o", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "small.yaml with --set pe.tcm.size_kb=1: pe.tcm.scratch_kb = 1024: exceeds " \
           "pe.tcm.size_kb = 1; raise pe.tcm.size_kb or lower pe.tcm.scratch_kb" in err


def test_the_same_set_key_twice_is_refused_unless_equal():
    from kbtrace.topology.cli import parse_sets
    assert parse_sets(["a.b=1", "a.b=1"]) == {"a.b": "1"}
    with pytest.raises(TopologyError, match=r"--set cube\.hbm\.pc_bw_gbps is given twice \(16 and "
                                            r"32\); keep one"):
        parse_sets(["cube.hbm.pc_bw_gbps=16", "cube.hbm.pc_bw_gbps=32"])

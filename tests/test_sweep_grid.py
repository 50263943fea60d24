"""``kbtrace sweep --grid KEY=V1,V2``: values are YAML scalars; a malformed one is one SweepError
line naming the --grid item and the value (no traceback)."""

from __future__ import annotations

import pytest

from kbtrace.cli import main
from kbtrace.errors import SweepError
from kbtrace.replay.sweep_config import parse_grid_items


def test_grid_values_parse_as_yaml_scalars():
    assert parse_grid_items(["cube.hbm.pc_bw_gbps=8, 16.5", "pe.ipcq.buffer_kind=tcm,sram"]) == {
        "cube.hbm.pc_bw_gbps": [8, 16.5], "pe.ipcq.buffer_kind": ["tcm", "sram"]}


@pytest.mark.parametrize("item, value, reason", [
    ("cube.hbm.pc_bw_gbps=[1,2", "[1", "expected ',' or ']', but got '<stream end>'"),
    ("cube.hbm.pc_bw_gbps=8,{a", "{a", "expected ',' or '}', but got '<stream end>'"),
    ("cube.hbm.pc_bw_gbps='8", "'8", "found unexpected end of stream"),
])
def test_malformed_grid_value(item, value, reason):
    with pytest.raises(SweepError) as exc:
        parse_grid_items([item])
    assert str(exc.value) == (f"--grid {item}: value {value!r} is not valid YAML ({reason}); give "
                              "plain values separated by commas, e.g. --grid cube.hbm.pc_bw_gbps=8,16,32")


def test_cli_malformed_grid_is_one_line_exit_2(capsys, tmp_path):
    rc = main(["sweep", "hbm_bandwidth", "--grid", "cube.hbm.pc_bw_gbps=[1,2", "-o", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "--grid cube.hbm.pc_bw_gbps=[1,2: value '[1' is not valid YAML" in err
    assert not (tmp_path / "s").exists()


def test_sweep_config_refuses_a_repeated_key(tmp_path):
    from kbtrace.replay.sweep_config import load_config
    cfg = tmp_path / "s.yaml"
    cfg.write_text("workloads: [capture/gemm.py]\ntopologies: [small]\n"
                   "grid:\n  cube.hbm.pc_bw_gbps: [16]\n  cube.hbm.pc_bw_gbps: [32]\n")
    with pytest.raises(SweepError, match=r"s\.yaml: grid\.cube\.hbm\.pc_bw_gbps: duplicate key at "
                                         r"line 5 \(first set at line 4\); keep only one"):
        load_config(cfg)


def test_sweep_whose_capture_fails_leaves_no_directories(tmp_path):
    from pathlib import Path

    from kbtrace.replay.sweep import run_sweep
    root = Path(__file__).resolve().parents[1]
    cfg = {"workloads": [{"path": str(root / "capture" / "softmax.py"), "params": {"R": -4}}],
           "topologies": [str(root / "topologies" / "small.yaml")]}
    with pytest.raises(SweepError, match="softmax"):
        run_sweep(cfg, tmp_path / "sw")
    assert list(tmp_path.iterdir()) == []

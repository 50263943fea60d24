"""`kbtrace topo show|route|draw` end to end through kbtrace.cli.main."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbtrace.cli import main

TOPO = Path(__file__).resolve().parents[1] / "topologies"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KBTRACE_CACHE_DIR", str(tmp_path / "cache"))


def test_show_default(capsys):
    assert main(["topo", "show", str(TOPO / "default.yaml")]) == 0
    out = capsys.readouterr().out
    assert "SIPs          2" in out
    assert "cubes         32" in out
    assert "PEs           256" in out
    assert "HBM per cube  2048 GB/s" in out
    assert "router       1024" in out and "ucie_mesh       96" in out


def test_route_table_and_lower_bound(capsys):
    path = str(TOPO / "small.yaml")
    lbs = []
    for dst, nbytes in (("sip0.cube0.hbm_ctrl.pe0", 4096), ("sip0.cube0.hbm_ctrl.pe7", 4096),
                        ("sip0.cube1.hbm_ctrl.pe0", 4096), ("sip0.cube1.hbm_ctrl.pe0", 65536)):
        assert main(["topo", "route", path, "sip0.cube0.pe0.dma", dst, "--nbytes", str(nbytes)]) == 0
        out = capsys.readouterr().out
        lines = out.strip().splitlines()
        lb = next(ln for ln in lines if ln.startswith("lower_bound_ns("))
        floor = next(ln for ln in lines if ln.startswith("floor_ns("))
        lbs.append(float(lb.split("=")[-1]))
        assert float(floor.split("=")[1].split()[0]) <= lbs[-1]
    assert lbs == sorted(lbs) and len(set(lbs)) == 4
    assert main(["topo", "route", path, "sip0.cube0.pe0.dma", "sip0.cube1.hbm_ctrl.pe0"]) == 0
    out = capsys.readouterr().out
    assert "ucie_mesh" in out and "sip0.cube1.ucie_w" in out and "bottleneck=128 GB/s" in out


def test_route_unknown_node(capsys):
    rc = main(["topo", "route", str(TOPO / "tiny.yaml"), "sip0.cube0.pe0.dmx", "sip0.cube0.sram"])
    err = capsys.readouterr().err
    assert rc != 0 and err.count("\n") == 1
    assert "unknown node id 'sip0.cube0.pe0.dmx'" in err and "did you mean 'sip0.cube0.pe0.dma'" in err


def test_show_with_set(capsys):
    assert main(["topo", "show", str(TOPO / "tiny.yaml"), "--set", "cube.hbm.pc_bw_gbps=64"]) == 0
    assert "HBM per cube  1024 GB/s" in capsys.readouterr().out   # 2 PEs x 8 PCs x 64


def test_draw(tmp_path, capsys):
    out = tmp_path / "draw"
    assert main(["topo", "draw", str(TOPO / "small.yaml"), "-o", str(out)]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["cube_view__small.png", "sip_view__small.png"]
    for f in out.iterdir():
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 10_000

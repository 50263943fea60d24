"""Bad topology YAML: one-line TopologyError naming file + key; CLI exits non-zero, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbtrace.cli import main
from kbtrace.errors import TopologyError
from kbtrace.topology import compile_topology

TOPO = Path(__file__).resolve().parents[1] / "topologies"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KBTRACE_CACHE_DIR", str(tmp_path / "cache"))


CASES = [
    ("cube: {mesh: {link_bw_gbs: 128}}", "cube.mesh.link_bw_gbs: unknown key; did you mean 'link_bw_gbps'?"),
    ("cube: {sram: {banks: 4}}", "cube.sram.banks was removed: the SRAM attaches by one link "
                                 "(ADR-0041 D5); set cube.sram.router_bw_gbps"),
    ("cube: {hbm: {pc_bw_gbps: -32}}", "cube.hbm.pc_bw_gbps = -32.0: bandwidth must be > 0"),
    ("cube: {pes: {count: 9}}", "cube.pes.count = 9: 9 PEs do not fit"),
    ("cube: {pes: {count: 17}}", "cube.pes.count = 17: at most 16 PEs"),
    ("cube: {pes: {count: 2, routers: [[0, 0], [2, 3]]}}", "cube.pes.routers[1] = [2, 3]: PE 1's router sits in the HBM zone"),
    ("cube: {pes: {count: 1, routers: [[6, 0]]}}", "cube.pes.routers[0] = [6, 0]: PE 0's router is off the 6x6 mesh"),
    ("system: {sips: {count: 17}}", "system.sips.count = 17: at most 16 SIPs"),
    ("sip: {cube_mesh_w: 5, cube_mesh_h: 4}", "sip.cube_mesh_w = 5: 5x4 = 20 cubes; at most 16"),
    ("cube: {hbm: {pcs_per_pe: 6}}", "cube.hbm.pcs_per_pe = 6: must be a power of 2"),
    ("cube: {hbm: {burst_bytes: 100}}", "cube.hbm.burst_bytes = 100: must be a power of 2"),
    ("system: {sips: {topology: ring}}", "system.sips.topology = 'ring': use one of ring_1d, torus_2d, mesh_2d"),
    ("system: {sips: {count: 3, topology: torus_2d, w: 2, h: 2}}", "system.sips.w = 2: a 2x2 SIP grid"),
    ("system: {sips: {count: 6, topology: torus_2d}}", "system.sips.count = 6: 6 SIPs are not a "
     "square, so a torus_2d grid needs explicit system.sips.w and system.sips.h with w * h = 6"),
    ("system: {sips: {count: 2, topology: mesh_2d}}", "system.sips.count = 2: 2 SIPs are not a square"),
    ("cube: {mesh: {rows: six}}", "cube.mesh.rows = 'six': must be an integer"),
    ("cube: {hbm: {efficiency: 1.5}}", "cube.hbm.efficiency = 1.5: must be in (0, 1]"),
    ("cube: {sram: {router: [2, 2]}}", "cube.sram.router = [2, 2]: the SRAM router sits in the HBM zone"),
    ("sip: {io_chiplets: [{side: Q}]}", "sip.io_chiplets[0].side = 'Q': use one of N, S, E, W"),
    ("sip: {io_chiplets: [{side: W}, {side: W}, {side: W}]}", "sip.io_chiplets[2].side = 'W': at most 2"),
    ("cube: {mesh: {rows: 3, cols: 3, hbm_zone: [[0, 1], [1, 1], [2, 1]]}, pes: {count: 1, routers: [[0, 0]]},"
     " sram: {router: [0, 0]}, m_cpu: {router: [0, 0]}}", "splits the router mesh (r0c2 unreachable)"),
    ("pe: {tcm: {size_kb: 4096}}", "pe.tcm.size_kb = 4096: exceeds the 2048 KB PE_TCM address budget"),
    ("system: {ns_per_mm: 0}", "system.ns_per_mm = 0.0: must be > 0"),
    ("pe: {ipcq: {buffer_kind: dram}}", "pe.ipcq.buffer_kind = 'dram': use one of tcm, sram, hbm"),
    ("cube: {mesh: [rows: 6", "malformed YAML at line 2, column 1"),
    ("- 1\n- 2", "top level must be a mapping"),
    ("cube: {mesh: {router_overhead_ns: 0, pitch_mm: 0}}", "zero-latency hop"),
]


@pytest.mark.parametrize("text, message", CASES)
def test_bad_yaml_one_line(tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text + "\n")
    with pytest.raises(TopologyError) as exc:
        compile_topology(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}: ") and message in msg and "\n" not in msg, msg


@pytest.mark.parametrize("text, key", [
    ("cube: {mesh: {link_bw_gbs: 128}}", "cube.mesh.link_bw_gbs"),    # typo
    ("cube: {hbm: {pc_bw_gbps: -32}}", "cube.hbm.pc_bw_gbps"),        # negative bandwidth
    ("cube: {pes: {count: 12}}", "cube.pes.count"),                   # PE count does not fit
])
def test_cli_exits_nonzero_with_one_line(tmp_path, capsys, text, key):
    f = tmp_path / "typo.yaml"
    f.write_text(text + "\n")
    rc = main(["topo", "show", str(f)])
    err = capsys.readouterr().err
    assert rc != 0
    assert err.count("\n") == 1 and key in err and "Traceback" not in err, err


@pytest.mark.parametrize("overrides, message", [
    ({"cube.mesh.link_bw_gbs": 1}, "override 'cube.mesh.link_bw_gbs': unknown key 'link_bw_gbs' under "
                                   "cube.mesh; did you mean 'link_bw_gbps'?"),
    ({"cube.mesh": 1}, "names a section"),
    ({"cube.sram.bank_bw_gbps": 64}, "cube.sram.bank_bw_gbps was removed: .* set "
                                     "cube.sram.router_bw_gbps"),
    ({"cube.mesh.link_bw_gbps": "-4"}, "cube.mesh.link_bw_gbps = -4.0: bandwidth must be > 0"),
])
def test_bad_overrides(overrides, message):
    with pytest.raises(TopologyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compile_topology(TOPO / "tiny.yaml", overrides=overrides)


def test_overrides_coerce_cli_strings():
    t = compile_topology(TOPO / "tiny.yaml", overrides={"cube.mesh.link_bw_gbps": "128",
                                                        "cube.pes.count": "1"})
    assert t.params.cube.mesh.link_bw_gbps == 128.0 and t.pes_per_cube == 1


def test_missing_file(tmp_path):
    with pytest.raises(TopologyError, match="no such topology file"):
        compile_topology(tmp_path / "nope.yaml")


def test_yaml_change_rebuilds(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text((TOPO / "tiny.yaml").read_text())
    a = compile_topology(f)
    b = compile_topology(f)
    assert b.from_cache
    f.write_text((TOPO / "tiny.yaml").read_text().replace("sips: {count: 1}", "sips: {count: 2}"))
    c = compile_topology(f)
    assert not c.from_cache and c.n_sips == 2 and c.content_hash != a.content_hash


def test_partial_section_keeps_section_defaults(tmp_path):
    """pe.ipcq.sram defaults (512 GB/s, 2 ns) differ from IpcqTierParams' class defaults."""
    f = tmp_path / "t.yaml"
    f.write_text("pe: {ipcq: {sram: {bw_gbps: 100}}}\n")
    t = compile_topology(f)
    assert (t.params.pe.ipcq.sram.bw_gbps, t.params.pe.ipcq.sram.overhead_ns) == (100.0, 2.0)
    assert (t.params.pe.ipcq.hbm.bw_gbps, t.params.pe.ipcq.hbm.overhead_ns) == (256.0, 6.0)


def test_default_yaml_equals_param_defaults():
    """topologies/default.yaml spells out exactly the params.py defaults."""
    from kbtrace.topology import TopologyParams
    assert compile_topology(TOPO / "default.yaml").params == TopologyParams()


def test_docs_reference_is_current():
    from kbtrace.topology import yaml_reference_markdown
    doc = (TOPO.parent / "docs" / "topology.md").read_text()
    assert yaml_reference_markdown() in doc, "regenerate the table in docs/topology.md"

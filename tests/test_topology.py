"""Topology compile + routing: the issue-2 checks on the real topology files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbtrace import schema
from kbtrace.errors import AddressError, RoutingError
from kbtrace.topology import CACHE_STATS, PeCoord, address, compile_topology

TOPO = Path(__file__).resolve().parents[1] / "topologies"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KBTRACE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def default():
    return compile_topology(TOPO / "default.yaml", use_cache=False)


@pytest.fixture(scope="module")
def small():
    return compile_topology(TOPO / "small.yaml", use_cache=False)


def ids(topo, route):
    return [topo.nodes[n].id for n in route.nodes]


def kinds(topo, route):
    return [topo.links[i].kind for i in route.links]


def test_default_counts(default):
    t = default
    assert (t.n_sips, t.cubes_per_sip, t.pes_per_cube) == (2, 16, 8)
    assert len(t.pes) == 256 and t.pes[0] == PeCoord(0, 0, 0) and t.pes[-1] == PeCoord(1, 15, 7)
    assert t.hbm_bw_per_cube_gbps == 2048.0
    assert t.hbm_slice_bytes == 6 * (1 << 30)
    by_kind = {}
    for n in t.nodes:
        by_kind[n.kind] = by_kind.get(n.kind, 0) + 1
    assert set(by_kind) == set(schema.NODE_KINDS)
    assert by_kind["router"] == 2 * 16 * 32          # 6x6 minus 4 HBM-zone slots
    assert by_kind["ucie"] == 2 * 16 * 4 and by_kind["ucie_conn"] == 2 * 16 * 16
    assert by_kind["hbm_ctrl"] == by_kind["dma"] == 256
    assert by_kind["io_ucie"] == 2 * 4                  # W shoreline of a 4x4 cube mesh
    assert {ln.kind for ln in t.links} == set(schema.LINK_KINDS)
    with pytest.raises(RoutingError, match="did you mean 'sip0.cube3.pe5.dma'"):
        t.node("sip0.cube3.pe5.dmaa")
    with pytest.raises(RoutingError):
        t.node("sip0.cube0.r2c2")                       # HBM zone: no router


def test_tables_match_schema(small):
    nt, lt = small.nodes_table(), small.links_table()
    assert nt.schema.equals(schema.NODES) and lt.schema.equals(schema.LINKS)
    assert nt.num_rows == len(small.nodes) and lt.num_rows == len(small.links)
    assert nt.column("node_id")[0].as_py() == "host"
    assert lt.column("link_idx").to_pylist() == list(range(lt.num_rows))


def test_own_slice_has_no_mesh_link(default):
    t = default
    pe = PeCoord(0, 3, 6)
    r = t.route(t.pe_node(pe, "dma").idx, t.hbm_ctrl(pe).idx)
    assert ids(t, r) == ["sip0.cube3.pe6.dma", "sip0.cube3.r4c5", "sip0.cube3.hbm_ctrl.pe6"]
    assert kinds(t, r) == ["pe_to_router", "router_to_hbm"]
    assert r.overhead_ns == 2.0                         # the router's switching overhead only
    assert r.lower_bound_ns(0) > 0


def test_mesh_links_grow_with_distance(default):
    t = default
    src = "sip0.cube0.pe0.dma"                           # r0c0
    near = t.route(src, "sip0.cube0.hbm_ctrl.pe1")       # r1c0: 1 mesh hop
    far = t.route(src, "sip0.cube0.hbm_ctrl.pe7")        # r5c5: 10 mesh hops
    own = t.route(src, "sip0.cube0.hbm_ctrl.pe0")
    assert kinds(t, near).count("router_mesh") == 1
    assert kinds(t, far).count("router_mesh") == 10
    assert "ucie" not in {t.nodes[n].kind for n in far.nodes}
    adj = t.route(src, "sip0.cube1.hbm_ctrl.pe0")        # cube1 is east of cube0
    assert [t.nodes[n].kind for n in adj.nodes].count("ucie") == 2
    assert kinds(t, adj).count("ucie_mesh") == 1
    for nbytes in (0, 4096, 65536):
        lbs = [r.lower_bound_ns(nbytes) for r in (own, near, far, adj)]
        assert lbs == sorted(lbs) and len(set(lbs)) == 4, lbs
    assert own.lower_bound_ns(4096) < own.lower_bound_ns(65536)
    assert adj.bottleneck_gbps == 128.0                  # one UCIe connection lane
    # exact figure: 64 KiB over the 128 GB/s lane = 512 ns drain + 8 ns HBM commit + path
    assert adj.lower_bound_ns(65536) == pytest.approx(adj.overhead_ns + adj.wire_ns + 512 + 8)


def test_xy_order_and_hbm_zone_detour(default):
    t = default
    r = t.route("sip0.cube0.pe0.dma", "sip0.cube0.hbm_ctrl.pe7")
    slots = [t.router_slot(n) for n in r.nodes if t.nodes[n].kind == "router"]
    assert slots == [(0, c) for c in range(6)] + [(r_, 5) for r_ in range(1, 6)]   # X first, then Y
    r = t.route("sip0.cube0.r2c0", "sip0.cube0.r3c5")   # row 2/3 blocked by the HBM zone
    slots = [t.router_slot(n) for n in r.nodes]
    assert (2, 2) not in slots and (3, 2) not in slots and len(slots) == 9


def test_lookups_accept_node_objects(small):
    # README: topo.router_of(node); topo.router_slot(router) -- chaining the returned Nodes works
    t = small
    dma = t.pe_node(PeCoord(0, 0, 6), "dma")
    router = t.router_of(dma)
    assert router.id == "sip0.cube0.r4c5" and t.router_slot(router) == (4, 5)
    assert t.node(dma) is dma
    assert t.route(dma, t.hbm_ctrl(PeCoord(0, 0, 6))) == t.route(dma.id, "sip0.cube0.hbm_ctrl.pe6")
    with pytest.raises(RoutingError, match="is a dma, not a router"):
        t.router_slot(dma)


def test_io_and_inter_sip_paths(default):
    t = default
    r = t.route("host", "sip1.cube5.hbm_ctrl.pe0")
    k = [t.nodes[n].kind for n in r.nodes]
    assert k[:5] == ["host", "switch", "pcie_ep", "io_noc", "io_conn"]
    assert "io_cpu" not in k                              # memory ops bypass IO_CPU
    launch = t.route(t.io_cpu(0).idx, t.m_cpu(0, 15).idx)
    assert [t.nodes[n].kind for n in launch.nodes][:3] == ["io_cpu", "io_noc", "io_conn"]
    x = t.route("sip0.cube0.pe0.dma", "sip1.cube0.hbm_ctrl.pe0")
    xk = [t.nodes[n].kind for n in x.nodes]
    assert xk.count("switch") == 1 and xk.count("pcie_ep") == 2
    assert x.bottleneck_gbps == 64.0


def test_routes_cached_and_deterministic(default, small):
    r1 = default.route("sip0.cube0.pe1.tcm", "sip0.cube9.sram")
    assert default.route("sip0.cube0.pe1.tcm", "sip0.cube9.sram") is r1
    again = compile_topology(TOPO / "default.yaml", use_cache=False)
    assert again.route("sip0.cube0.pe1.tcm", "sip0.cube9.sram") == r1
    with pytest.raises(RoutingError):
        small.route("sip0.cube0.pe0.dma", "sip0.cube0.pe0.dma")


def test_route_caches_are_bounded_and_summaries_outlive_routes(monkeypatch):
    """All-pairs traffic must not grow the route cache without bound; the summaries the
    replay invariants use (lower bounds) are kept for more pairs, and equal the routes'."""
    from kbtrace.topology import topology as T
    t = compile_topology(TOPO / "small.yaml", use_cache=False)
    monkeypatch.setattr(T, "ROUTE_CACHE_MAX", 8)
    dma = [n.idx for n in t.nodes if n.kind == "dma"]
    mem = [n.idx for n in t.nodes if n.kind == "hbm_ctrl"]
    pairs = [(a, b) for a in dma[:5] for b in mem[:5]]
    routes = {p: t.route(*p) for p in pairs}
    assert len(t._routes) <= 8 and len(t._summaries) == len(pairs)
    for p, r in routes.items():
        sm = t.route_summary(*p)
        assert sm.nodes == () and sm.links == ()
        for nb in (0, 100, 4096, 65536):
            assert sm.lower_bound_ns(nb) == r.lower_bound_ns(nb)
    assert t.route(*pairs[0]) == routes[pairs[0]]     # routed again, the same
    by_name = t.route_summary("host", "sip0.io0.ucie0")   # names, like route()
    assert by_name.lower_bound_ns(64) == t.route("host", "sip0.io0.ucie0").lower_bound_ns(64)


def test_lane_spread_by_source_pe(small):
    t = small
    lanes = {t.nodes[n].id for pe in range(8)
             for n in t.route(f"sip0.cube0.pe{pe}.dma", "sip0.cube1.sram").nodes
             if t.nodes[n].kind == "ucie_conn" and t.nodes[n].cube == 0}
    assert lanes == {f"sip0.cube0.ucie_e.conn{k}" for k in range(4)}


def test_resolve(small):
    t = small
    sl = t.hbm_slice_bytes
    assert t.resolve(address.hbm_addr(0, 2, 0)).id == "sip0.cube2.hbm_ctrl.pe0"
    assert t.resolve(address.hbm_addr(0, 2, 3 * sl + 17)).id == "sip0.cube2.hbm_ctrl.pe3"
    assert t.resolve(address.hbm_addr(0, 2, 8 * sl - 1)).id == "sip0.cube2.hbm_ctrl.pe7"
    assert t.resolve(t.hbm_base(PeCoord(0, 1, 6))).id == "sip0.cube1.hbm_ctrl.pe6"
    assert t.resolve(address.pe_tcm_addr(0, 3, 4, 100)).id == "sip0.cube3.pe4.tcm"
    assert t.resolve(address.sram_addr(0, 1, 0)).id == "sip0.cube1.sram"
    assert t.resolve(address.mcpu_addr(0, 1, 5, 0)).id == "sip0.cube1.m_cpu"
    assert t.resolve(address.iocpu_addr(0, 16, 2, 0)).id == "sip0.io0.io_cpu"
    for bad in (address.hbm_addr(0, 0, 8 * sl), address.hbm_addr(1, 0, 0), address.hbm_addr(0, 4, 0),
                address.pe_tcm_addr(0, 0, 8, 0), address.iocpu_addr(0, 17, 0, 0)):
        with pytest.raises(AddressError):
            t.resolve(bad)


def test_cache_is_keyed_by_the_compiler_source(monkeypatch):
    """A changed default or compiler (an upgrade, an edit in a checkout) never gets a topology
    compiled by other code from the cache: the key hashes the topology package's source."""
    from kbtrace.topology import topology as T
    path = TOPO / "small.yaml"
    compile_topology(path)
    assert compile_topology(path).from_cache
    monkeypatch.setattr(T, "_code_hash", lambda: "edited")
    assert not compile_topology(path).from_cache


def test_cache_hit_and_identical_tables():
    path = TOPO / "default.yaml"
    h0 = CACHE_STATS["hits"]
    a = compile_topology(path)
    b = compile_topology(path)
    assert not a.from_cache and b.from_cache and CACHE_STATS["hits"] == h0 + 1
    assert a.nodes_table().equals(b.nodes_table()) and a.links_table().equals(b.links_table())
    assert a.content_hash == b.content_hash
    assert a.route("sip0.cube0.pe0.dma", "sip1.cube3.sram") == \
        b.route("sip0.cube0.pe0.dma", "sip1.cube3.sram")


def test_tiny_and_overrides():
    t = compile_topology(TOPO / "tiny.yaml")
    assert (t.n_sips, t.cubes_per_sip, t.pes_per_cube, len(t.pes)) == (1, 1, 2, 2)
    o = compile_topology(TOPO / "tiny.yaml", overrides={"cube.mesh.link_bw_gbps": 128})
    assert o.params.cube.mesh.link_bw_gbps == 128.0 and o.content_hash != t.content_hash
    r = o.route("sip0.cube0.pe0.dma", "sip0.cube0.hbm_ctrl.pe1")
    assert r.bottleneck_gbps == 128.0
    with pytest.raises(AttributeError):
        o.params = None


def _sips_topo(tmp_path, count: int, pattern: str, w: int = 0, h: int = 0):
    from kbtrace.topology import compile_topology
    y = tmp_path / f"sips_{pattern}_{count}.yaml"
    grid = f"\n    w: {w}\n    h: {h}" if w else ""
    y.write_text(f"name: s\nsystem:\n  sips:\n    count: {count}\n    topology: {pattern}{grid}\n"
                 "sip:\n  cube_mesh_w: 1\n  cube_mesh_h: 1\n")
    return compile_topology(y, use_cache=False)


def test_sip_neighbors_follow_sips_topology(tmp_path) -> None:
    ring = _sips_topo(tmp_path, 4, "ring_1d").sip_neighbors()
    assert ring[0] == {"global_E": 1, "global_W": 3}
    assert ring[3] == {"global_E": 0, "global_W": 2}
    assert _sips_topo(tmp_path, 1, "ring_1d").sip_neighbors() == {0: {}}
    torus = _sips_topo(tmp_path, 4, "torus_2d", 2, 2).sip_neighbors()
    assert torus[0] == {"global_E": 1, "global_W": 1, "global_N": 2, "global_S": 2}
    mesh = _sips_topo(tmp_path, 4, "mesh_2d", 2, 2).sip_neighbors(prefix="")
    assert mesh[0] == {"E": 1, "S": 2}
    assert mesh[3] == {"W": 2, "N": 1}


@pytest.mark.parametrize("count, pattern, w, h, grid", [
    (2, "ring_1d", 0, 0, (2, 1)), (4, "ring_1d", 0, 0, (4, 1)), (6, "ring_1d", 0, 0, (6, 1)),
    (2, "torus_2d", 2, 1, (2, 1)), (4, "torus_2d", 0, 0, (2, 2)), (6, "torus_2d", 3, 2, (3, 2)),
    (2, "mesh_2d", 1, 2, (1, 2)), (4, "mesh_2d", 0, 0, (2, 2)), (6, "mesh_2d", 2, 3, (2, 3)),
])
def test_multi_sip_systems(tmp_path, count, pattern, w, h, grid) -> None:
    """2, 4 and 6 SIPs on every fabric (ADR-0024 D5): each SIP is built, the grid is explicit."""
    t = _sips_topo(tmp_path, count, pattern, w, h)
    assert t.n_sips == count and t.sip_grid() == grid
    assert {n.sip for n in t.nodes if n.sip is not None} == set(range(count))
    nb = t.sip_neighbors()
    for s, table in nb.items():         # every link is matched by one back (symmetric fabric)
        for peer in table.values():
            assert s in nb[peer].values()
    t6 = _sips_topo(tmp_path, 6, "torus_2d", 3, 2).sip_neighbors()
    assert t6[0] == {"global_E": 1, "global_W": 2, "global_N": 3, "global_S": 3}
    m6 = _sips_topo(tmp_path, 6, "mesh_2d", 3, 2).sip_neighbors()
    assert m6[4] == {"global_E": 5, "global_W": 3, "global_N": 1}

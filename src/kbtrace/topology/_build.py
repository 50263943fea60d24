"""Validated params -> node/link graph (phase 2 of compile).

Construction order (and therefore ``idx`` order) is fixed: tray nodes, then per
SIP its IO chiplets, then per cube: routers (row-major), UCIe ports N/S/E/W
with their connections, HBM controller slices, SRAM, M_CPU, then per PE its
eight components. Links follow the same order. ``Graph`` also carries the
index maps the router needs, so routing never parses ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kbtrace.errors import TopologyError
from kbtrace.topology._spec import SIDES, router_slots, ucie_conn_routers
from kbtrace.topology.model import Link, Node
from kbtrace.topology.params import TopologyParams

__all__ = ["Graph", "build_graph", "PE_COMPONENTS", "OPPOSITE", "STEP"]

PE_COMPONENTS = ("pe_cpu", "scheduler", "dma", "fetch_store", "gemm", "math", "tcm", "ipcq")
OPPOSITE = {"N": "S", "S": "N", "E": "W", "W": "E"}
#: cube-grid step (dx, dy) of leaving a cube through a port; y grows southwards
STEP = {"N": (0, -1), "S": (0, 1), "E": (1, 0), "W": (-1, 0)}


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    by_id: dict[str, int] = field(default_factory=dict)
    link_of: dict[tuple[int, int], int] = field(default_factory=dict)
    host: int = -1
    switch: int = -1
    slot_pos: dict[tuple[int, int], int] = field(default_factory=dict)     # (r, c) -> position
    router_base: dict[tuple[int, int], int] = field(default_factory=dict)  # (sip, cube) -> idx of slot 0
    router_slot: dict[int, tuple[int, int]] = field(default_factory=dict)  # router idx -> (r, c)
    attach: dict[int, int] = field(default_factory=dict)                   # cube node -> its router idx
    ucie_ep: dict[tuple[int, int, str], int] = field(default_factory=dict)
    ucie_conn: dict[tuple[int, int, str], list[int]] = field(default_factory=dict)
    hbm: dict[tuple[int, int, int], int] = field(default_factory=dict)
    sram: dict[tuple[int, int], int] = field(default_factory=dict)
    mcpu: dict[tuple[int, int], int] = field(default_factory=dict)
    pe_comp: dict[tuple[int, int, int, str], int] = field(default_factory=dict)
    io_of: dict[int, tuple[int, int]] = field(default_factory=dict)        # io node -> (sip, chiplet)
    pcie_ep: dict[tuple[int, int], int] = field(default_factory=dict)
    io_noc: dict[tuple[int, int], int] = field(default_factory=dict)
    io_cpu: dict[tuple[int, int], int] = field(default_factory=dict)
    io_ucie: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    io_conn: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)
    io_shore: dict[int, list[int]] = field(default_factory=dict)           # chiplet -> cube per io ucie
    io_side: dict[int, str] = field(default_factory=dict)                  # chiplet -> side


class _Builder:
    def __init__(self, p: TopologyParams, where: str) -> None:
        self.p, self.where, self.g = p, where, Graph()
        self.ns_per_mm = p.system.ns_per_mm

    def node(self, nid: str, kind: str, sip: int | None, cube: int | None, pe: int | None,
             overhead_ns: float, x: float = 0.0, y: float = 0.0) -> int:
        idx = len(self.g.nodes)
        self.g.nodes.append(Node(idx, nid, kind, sip, cube, pe, float(overhead_ns), float(x), float(y)))
        self.g.by_id[nid] = idx
        return idx

    def link(self, a: int, b: int, kind: str, bw: float, dist: float, both: bool = True,
             bw_back: float | None = None) -> None:
        for s, d, w in ((a, b, bw), (b, a, bw if bw_back is None else bw_back))[: 2 if both else 1]:
            lat = dist * self.ns_per_mm
            if lat <= 0 and self.g.nodes[d].overhead_ns <= 0:
                src, dst = self.g.nodes[s].id, self.g.nodes[d].id
                raise TopologyError(
                    f"{self.where}: link {src} -> {dst} ({kind}) has 0 mm and {dst} has 0 ns overhead: "
                    "a zero-latency hop (ADR-0002 D4); give that link a distance or the node an overhead_ns > 0")
            idx = len(self.g.links)
            self.g.links.append(Link(idx, s, d, kind, float(w), float(dist), lat))
            self.g.link_of[(s, d)] = idx

    # ------------------------------------------------------------------ build
    def build(self) -> Graph:
        p, g = self.p, self.g
        g.host = self.node("host", "host", None, None, None, p.system.host.overhead_ns)
        g.switch = self.node("fabric.switch0", "switch", None, None, None, p.system.pcie.switch_overhead_ns, 0, 1)
        self.link(g.host, g.switch, "pcie", p.system.pcie.bw_gbps, p.system.pcie.distance_mm)
        g.slot_pos = {rc: i for i, rc in enumerate(router_slots(p))}
        self._assign_shores()
        for s in range(p.system.sips.count):
            for i in range(len(p.sip.io_chiplets)):
                self._io_chiplet(s, i)
            for c in range(p.sip.cube_mesh_w * p.sip.cube_mesh_h):
                self._cube(s, c)
            self._seams(s)
        return g

    def _assign_shores(self) -> None:
        p, g = self.p, self.g
        w, h = p.sip.cube_mesh_w, p.sip.cube_mesh_h
        shore = {"N": [x for x in range(w)], "S": [(h - 1) * w + x for x in range(w)],
                 "W": [y * w for y in range(h)], "E": [y * w + w - 1 for y in range(h)]}
        on_side: dict[str, list[int]] = {}
        for i, io in enumerate(p.sip.io_chiplets):
            on_side.setdefault(io.side, []).append(i)
        for side, chips in on_side.items():
            cubes = shore[side]
            per = len(cubes) // len(chips)
            for j, i in enumerate(chips):
                g.io_shore[i] = cubes[j * per:(j + 1) * per] if j < len(chips) - 1 else cubes[j * per:]
                g.io_side[i] = side

    def _io_chiplet(self, s: int, i: int) -> None:
        p, g = self.p, self.g
        io = p.sip.io_chiplets[i]
        pre = f"sip{s}.io{i}"
        pitch = p.sip.cube_pitch_mm
        ys = [c // p.sip.cube_mesh_w for c in g.io_shore[i]]
        xs = [c % p.sip.cube_mesh_w for c in g.io_shore[i]]
        cx, cy = sum(xs) / len(xs) * pitch, sum(ys) / len(ys) * pitch
        dx, dy = STEP[io.side]
        cx, cy = cx + dx * pitch * 0.8, cy + dy * pitch * 0.8
        key = (s, i)
        ep = g.pcie_ep[key] = self.node(f"{pre}.pcie_ep", "pcie_ep", s, None, None, io.pcie_ep_overhead_ns, cx, cy - 2)
        noc = g.io_noc[key] = self.node(f"{pre}.io_noc", "io_noc", s, None, None, io.io_noc_overhead_ns, cx, cy)
        cpu = g.io_cpu[key] = self.node(f"{pre}.io_cpu", "io_cpu", s, None, None, io.io_cpu_overhead_ns, cx, cy + 2)
        for n in (ep, noc, cpu):
            g.io_of[n] = key
        g.io_ucie[key] = []
        for j, _cube in enumerate(g.io_shore[i]):
            u = self.node(f"{pre}.ucie{j}", "io_ucie", s, None, None, io.ucie_overhead_ns, cx, cy + j)
            g.io_of[u] = key
            g.io_ucie[key].append(u)
            conns = g.io_conn[(s, i, j)] = []
            for c in range(p.sip.ucie.connections):
                cn = self.node(f"{pre}.ucie{j}.conn{c}", "io_conn", s, None, None, 0.0, cx, cy + j)
                g.io_of[cn] = key
                conns.append(cn)
        self.link(ep, noc, "io_internal", io.noc_bw_gbps, io.noc_distance_mm)
        self.link(cpu, noc, "io_internal", io.noc_bw_gbps, io.noc_distance_mm)
        for j, u in enumerate(g.io_ucie[key]):
            for cn in g.io_conn[(s, i, j)]:
                self.link(noc, cn, "io_internal", p.sip.ucie.conn_bw_gbps, io.noc_distance_mm)
                self.link(cn, u, "io_internal", p.sip.ucie.conn_bw_gbps, p.sip.ucie.conn_distance_mm)
        self.link(ep, g.switch, "pcie", p.system.pcie.bw_gbps, p.system.pcie.distance_mm)

    def _cube(self, s: int, c: int) -> None:
        p, g = self.p, self.g
        mesh, ucie = p.cube.mesh, p.sip.ucie
        pitch = mesh.pitch_mm
        pre = f"sip{s}.cube{c}"
        g.router_base[(s, c)] = len(g.nodes)
        for (r, col) in g.slot_pos:
            idx = self.node(f"{pre}.r{r}c{col}", "router", s, c, None, mesh.router_overhead_ns,
                            col * pitch, r * pitch)
            g.router_slot[idx] = (r, col)
        rid = self.router
        for (r, col) in g.slot_pos:
            for nb in ((r, col + 1), (r + 1, col)):
                if nb in g.slot_pos:
                    self.link(rid(s, c, (r, col)), rid(s, c, nb), "router_mesh", mesh.link_bw_gbps, pitch)
        mid_x, mid_y = (mesh.cols - 1) * pitch / 2, (mesh.rows - 1) * pitch / 2
        for side in SIDES:
            dx, dy = STEP[side]
            ex = mid_x + dx * (mid_x + pitch)
            ey = mid_y + dy * (mid_y + pitch)
            ep = g.ucie_ep[(s, c, side)] = self.node(f"{pre}.ucie_{side.lower()}", "ucie", s, c, None,
                                                     ucie.overhead_ns, ex, ey)
            conns = g.ucie_conn[(s, c, side)] = []
            for k, rc in enumerate(ucie_conn_routers(p, side)):
                rx, ry = rc[1] * pitch, rc[0] * pitch
                cn = self.node(f"{pre}.ucie_{side.lower()}.conn{k}", "ucie_conn", s, c, None, 0.0,
                               rx + dx * pitch * 0.5, ry + dy * pitch * 0.5)
                conns.append(cn)
                g.attach[cn] = rid(s, c, rc)
                self.link(rid(s, c, rc), cn, "router_to_ucie", ucie.conn_bw_gbps, ucie.conn_distance_mm)
                self.link(cn, ep, "ucie_internal", ucie.conn_bw_gbps, ucie.conn_distance_mm)
            g.attach[ep] = g.attach[conns[0]]
        hbm = p.cube.hbm
        for pe in range(p.cube.pes.count):
            rc = p.cube.pes.routers[pe]
            h = g.hbm[(s, c, pe)] = self.node(f"{pre}.hbm_ctrl.pe{pe}", "hbm_ctrl", s, c, pe, hbm.overhead_ns,
                                              rc[1] * pitch + (mid_x - rc[1] * pitch) * 0.3,
                                              rc[0] * pitch + (mid_y - rc[0] * pitch) * 0.3)
            g.attach[h] = rid(s, c, rc)
            self.link(rid(s, c, rc), h, "router_to_hbm", hbm.router_bw_gbps * hbm.efficiency, hbm.distance_mm)
        sr = p.cube.sram
        rc = sr.router
        n = g.sram[(s, c)] = self.node(f"{pre}.sram", "sram", s, c, None, sr.overhead_ns,
                                       rc[1] * pitch - 0.6 * pitch, rc[0] * pitch)
        g.attach[n] = rid(s, c, rc)
        self.link(rid(s, c, rc), n, "router_to_sram", sr.router_bw_gbps, 0.0)
        rc = p.cube.m_cpu.router
        n = g.mcpu[(s, c)] = self.node(f"{pre}.m_cpu", "m_cpu", s, c, None, p.cube.m_cpu.overhead_ns,
                                       rc[1] * pitch - 0.6 * pitch, rc[0] * pitch)
        g.attach[n] = rid(s, c, rc)
        self.link(rid(s, c, rc), n, "router_to_mcpu", 0.0, 0.0)
        for pe in range(p.cube.pes.count):
            self._pe(s, c, pe, mid_x, mid_y)

    def router(self, s: int, c: int, rc: tuple[int, int]) -> int:
        return self.g.router_base[(s, c)] + self.g.slot_pos[rc]

    def _pe(self, s: int, c: int, pe: int, mid_x: float, mid_y: float) -> None:
        p, g = self.p, self.g
        pp = p.pe
        rc = p.cube.pes.routers[pe]
        pitch = p.cube.mesh.pitch_mm
        bx, by = rc[1] * pitch, rc[0] * pitch
        ox, oy = (-1.0 if bx <= mid_x else 1.0), (-1.0 if by <= mid_y else 1.0)
        over = {"pe_cpu": pp.pe_cpu.dispatch_cycles / pp.pe_cpu.clock_ghz,
                "scheduler": pp.scheduler.overhead_ns, "dma": 0.0,
                "fetch_store": 0.0, "gemm": 0.0, "math": 0.0, "tcm": 0.0,
                "ipcq": getattr(pp.ipcq, pp.ipcq.buffer_kind).overhead_ns}
        idx = {}
        for k, comp in enumerate(PE_COMPONENTS):
            idx[comp] = g.pe_comp[(s, c, pe, comp)] = self.node(
                f"sip{s}.cube{c}.pe{pe}.{comp}", comp, s, c, pe, over[comp],
                bx + ox * pitch * (0.35 + 0.08 * (k % 4)), by + oy * pitch * (0.35 + 0.08 * (k // 4)))
        r = self.router(s, c, rc)
        for comp in PE_COMPONENTS:          # every component reaches the fabric via this router
            g.attach[idx[comp]] = r
        d = pp.link_distance_mm
        L = self.link
        L(idx["pe_cpu"], idx["scheduler"], "pe_internal", 0.0, d)
        for eng in ("dma", "fetch_store", "gemm", "math", "ipcq"):
            L(idx["scheduler"], idx[eng], "pe_internal", 0.0, d)
        L(idx["dma"], idx["tcm"], "pe_internal", pp.tcm.write_bw_gbps, d, bw_back=pp.tcm.read_bw_gbps)
        L(idx["fetch_store"], idx["tcm"], "pe_internal", pp.tcm.write_bw_gbps, d, bw_back=pp.tcm.read_bw_gbps)
        L(idx["gemm"], idx["fetch_store"], "pe_internal", pp.fetch_store.bw_gbps, d)
        L(idx["math"], idx["fetch_store"], "pe_internal", pp.fetch_store.bw_gbps, d)
        tier = getattr(pp.ipcq, pp.ipcq.buffer_kind)
        L(idx["dma"], idx["ipcq"], "pe_internal", tier.bw_gbps, d)
        L(idx["ipcq"], idx["tcm"], "pe_internal", tier.bw_gbps, d)
        dist = p.cube.pes.distance_mm
        L(idx["dma"], r, "pe_to_router", p.cube.pes.bw_gbps, dist)
        L(idx["pe_cpu"], r, "pe_to_router", 0.0, dist)

    def _seams(self, s: int) -> None:
        p, g = self.p, self.g
        w, h = p.sip.cube_mesh_w, p.sip.cube_mesh_h
        u = p.sip.ucie
        for c in range(w * h):
            x, y = c % w, c // w
            if x + 1 < w:
                self.link(g.ucie_ep[(s, c, "E")], g.ucie_ep[(s, c + 1, "W")], "ucie_mesh",
                          u.connections * u.conn_bw_gbps, u.seam_mm)
            if y + 1 < h:
                self.link(g.ucie_ep[(s, c, "S")], g.ucie_ep[(s, c + w, "N")], "ucie_mesh",
                          u.connections * u.conn_bw_gbps, u.seam_mm)
        for i, io in enumerate(p.sip.io_chiplets):
            for j, cube in enumerate(g.io_shore[i]):
                self.link(g.io_ucie[(s, i)][j], g.ucie_ep[(s, cube, io.side)], "io_to_cube",
                          u.connections * u.conn_bw_gbps, io.distance_mm)


def build_graph(p: TopologyParams, where: str) -> Graph:
    return _Builder(p, where).build()

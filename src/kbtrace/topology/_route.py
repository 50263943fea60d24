"""Deterministic routing over the compiled graph.

Policy (documented in docs/topology.md):

* inside a PE: breadth-first over ``pe_internal`` links (fixed neighbour order);
  a PE leaves/enters the fabric through its DMA (data) or PE_CPU (command);
* inside a cube: dimension-ordered XY (columns first, then rows); if the HBM
  zone blocks the XY path, YX; if both are blocked, the shortest path that
  prefers X moves (BFS, fixed neighbour order). Cached per (from, to) slot pair;
* between cubes of a SIP: XY over the cube grid, each step an explicit UCIe
  crossing ``router -> conn k -> ucie_D (cube A) -> seam -> ucie_D' (cube B) ->
  conn k -> router``. The connection lane ``k = key % connections`` with
  ``key`` = the source PE index (else the source router row), so flows from
  different PEs spread over the lanes;
* cube <-> IO chiplet: through the chiplet's shoreline cube nearest to the cube
  (ties: lowest cube index), ``io_ucie{j} <-> conn k <-> io_noc``;
* between SIPs and to the host: up to the nearest IO chiplet's PCIe EP, across
  the tray switch, down from the destination SIP's nearest IO chiplet.
"""

from __future__ import annotations

from collections import deque

from kbtrace.errors import RoutingError
from kbtrace.topology._build import OPPOSITE, STEP, Graph
from kbtrace.topology.model import Node
from kbtrace.topology.params import TopologyParams

__all__ = ["Router"]

_IO_KINDS = ("pcie_ep", "io_cpu", "io_noc", "io_ucie", "io_conn")
_PE_KINDS = ("pe_cpu", "scheduler", "dma", "fetch_store", "gemm", "math", "tcm", "ipcq")


def _sip_of(nd: Node) -> int:
    """The SIP of a node that sits on one (every node but the host and the tray switch)."""
    assert nd.sip is not None, nd.id
    return nd.sip


def _cube_of(nd: Node) -> tuple[int, int]:
    """(sip, cube) of a node inside a cube."""
    assert nd.sip is not None and nd.cube is not None, nd.id
    return nd.sip, nd.cube


def _pe_of(nd: Node) -> tuple[int, int, int]:
    """(sip, cube, pe) of a PE component node."""
    assert nd.sip is not None and nd.cube is not None and nd.pe is not None, nd.id
    return nd.sip, nd.cube, nd.pe


class Router:
    """Computes node paths; ``Topology.route`` turns them into cached ``Route`` objects."""

    def __init__(self, g: Graph, p: TopologyParams) -> None:
        self.g, self.p = g, p
        self.w = p.sip.cube_mesh_w
        self.n_conn = p.sip.ucie.connections
        self._xy: dict[tuple[tuple[int, int], tuple[int, int]], tuple[tuple[int, int], ...]] = {}
        self._slots = frozenset(g.slot_pos)
        self._local: dict[tuple[int, int], tuple[int, ...]] = {}   # PE / IO chiplet pairs
        self._adj: dict[int, list[int]] = {}
        for ln in g.links:
            self._adj.setdefault(ln.src, []).append(ln.dst)

    # ------------------------------------------------------------------ public
    def path(self, s: int, d: int) -> list[int]:
        return _cut_loops(self._path(s, d))

    def _path(self, s: int, d: int) -> list[int]:
        g = self.g
        if s == d:
            raise RoutingError(f"route from {g.nodes[s].id} to itself: a transfer needs two different nodes")
        ns, nd = g.nodes[s], g.nodes[d]
        key = ns.pe if ns.pe is not None else (g.router_slot.get(g.attach.get(s, s), (0, 0))[0])
        if ns.kind in _PE_KINDS and nd.kind in _PE_KINDS and (ns.sip, ns.cube, ns.pe) == (nd.sip, nd.cube, nd.pe):
            return self._local_bfs(s, d, _PE_KINDS)
        if ns.kind in _IO_KINDS and nd.kind in _IO_KINDS and g.io_of[s] == g.io_of[d]:
            return self._local_bfs(s, d, _IO_KINDS)
        out = [s]
        if ns.sip is not None and nd.sip == ns.sip:
            self._within_sip(out, d, key)
            return out
        # different SIPs, or host/switch at either end: go through the tray switch
        if ns.sip is not None:
            io = self._nearest_io(s)
            self._within_sip(out, g.pcie_ep[(ns.sip, io)], key)
        if ns.kind != "switch":
            self._extend(out, g.switch)
        if nd.kind == "host":
            out.append(d)
        elif nd.kind != "switch":
            out.append(g.pcie_ep[(_sip_of(nd), self._nearest_io(d))])
            if d != out[-1]:
                self._within_sip(out, d, key)
        return out     # every hop has a link: Topology.route looks each one up

    # ------------------------------------------------------------------ helpers
    def _extend(self, out: list[int], n: int) -> None:
        if out[-1] != n:
            out.append(n)

    def _local_bfs(self, s: int, d: int, kinds: tuple[str, ...]) -> list[int]:
        """Shortest path inside one PE or one IO chiplet (first-found in link order);
        memoised per (s, d): a fresh list each call, since callers extend it."""
        hit = self._local.get((s, d))
        if hit is None:
            hit = self._local[(s, d)] = tuple(self._bfs(s, d, kinds))
        return list(hit)

    def _bfs(self, s: int, d: int, kinds: tuple[str, ...]) -> list[int]:
        nodes = self.g.nodes
        prev = {s: -1}
        todo = deque([s])
        while todo:
            n = todo.popleft()
            if n == d:
                break
            for m in self._adj.get(n, ()):
                if m not in prev and nodes[m].kind in kinds and nodes[m].pe == nodes[s].pe:
                    prev[m] = n
                    todo.append(m)
        if d not in prev:
            raise RoutingError(f"no route from {nodes[s].id} to {nodes[d].id}")
        path = [d]
        while path[-1] != s:
            path.append(prev[path[-1]])
        return path[::-1]

    def _cube_of(self, n: int) -> int | None:
        nd = self.g.nodes[n]
        return nd.cube

    def _nearest_io(self, n: int) -> int:
        """IO chiplet used by node ``n`` to leave/enter its SIP."""
        g = self.g
        if n in g.io_of:
            return g.io_of[n][1]
        c = self._cube_of(n)
        if c is None:
            return 0
        return min(range(len(self.p.sip.io_chiplets)),
                   key=lambda i: (min(self._cdist(c, t) for t in g.io_shore[i]), i))

    def _cdist(self, a: int, b: int) -> int:
        w = self.w
        return abs(a % w - b % w) + abs(a // w - b // w)

    # up/down legs between a cube node and its router
    def _up(self, out: list[int], n: int) -> None:
        g = self.g
        kind = g.nodes[n].kind
        if kind == "router":
            return
        if kind in _PE_KINDS and kind not in ("dma", "pe_cpu"):
            dma = g.pe_comp[(*_pe_of(g.nodes[n]), "dma")]
            out.extend(self._local_bfs(n, dma, _PE_KINDS)[1:])
        elif kind == "ucie":
            side = g.nodes[n].id.rsplit("_", 1)[1].upper()
            out.append(g.ucie_conn[(*_cube_of(g.nodes[n]), side)][0])
        out.append(g.attach[out[-1]])

    def _down(self, out: list[int], n: int) -> None:
        g = self.g
        nd = g.nodes[n]
        if nd.kind == "router":
            return
        if nd.kind in _PE_KINDS and nd.kind not in ("dma", "pe_cpu"):
            dma = g.pe_comp[(*_pe_of(nd), "dma")]
            out.append(dma)
            out.extend(self._local_bfs(dma, n, _PE_KINDS)[1:])
        elif nd.kind == "ucie":
            side = nd.id.rsplit("_", 1)[1].upper()
            out.append(g.ucie_conn[(*_cube_of(nd), side)][0])
            out.append(n)
        else:
            out.append(n)

    def _within_sip(self, out: list[int], d: int, key: int) -> None:
        """Extend ``out`` (ending at a node of the same SIP as ``d``) to ``d``."""
        g = self.g
        s = out[-1]
        ns, nd = g.nodes[s], g.nodes[d]
        sip = nd.sip
        assert sip is not None and ns.sip == sip
        if ns.kind in _IO_KINDS and nd.kind in _IO_KINDS and g.io_of[s] == g.io_of[d]:
            out.extend(self._local_bfs(s, d, _IO_KINDS)[1:])
            return
        # leave the source: either its router, or (IO) into a shoreline cube's router
        if ns.kind in _IO_KINDS:
            i = g.io_of[s][1]
            tgt_cube = nd.cube if nd.cube is not None else g.io_shore[g.io_of[d][1]][0]
            j = min(range(len(g.io_shore[i])), key=lambda j: (self._cdist(g.io_shore[i][j], tgt_cube), j))
            cube = g.io_shore[i][j]
            k = key % self.n_conn
            ucie = g.io_ucie[(sip, i)][j]
            if s != ucie:
                out.extend(self._local_bfs(s, ucie, _IO_KINDS)[1:])
            side = g.io_side[i]
            conn = g.ucie_conn[(sip, cube, side)][k]
            out += [g.ucie_ep[(sip, cube, side)], conn, g.attach[conn]]
        else:
            self._up(out, s)
            cube = _cube_of(ns)[1]
        # walk the cube grid to the destination cube (or the IO chiplet's shoreline cube)
        if nd.kind in _IO_KINDS:
            i = g.io_of[d][1]
            j = min(range(len(g.io_shore[i])), key=lambda j: (self._cdist(cube, g.io_shore[i][j]), j))
            dst_cube = g.io_shore[i][j]
        else:
            dst_cube = _cube_of(nd)[1]
        self._cube_walk(out, sip, cube, dst_cube, key)
        if nd.kind in _IO_KINDS:
            side = g.io_side[i]
            k = key % self.n_conn
            conn = g.ucie_conn[(sip, dst_cube, side)][k]
            self._mesh(out, sip, dst_cube, g.attach[conn])
            ucie = g.io_ucie[(sip, i)][j]
            out += [conn, g.ucie_ep[(sip, dst_cube, side)], ucie]
            if d != ucie:
                out.extend(self._local_bfs(ucie, d, _IO_KINDS)[1:])
            return
        tgt_router = g.attach.get(d, d)
        self._mesh(out, sip, dst_cube, tgt_router)
        self._down(out, d)

    def _cube_walk(self, out: list[int], sip: int, a: int, b: int, key: int) -> None:
        g, w = self.g, self.w
        k = key % self.n_conn
        while a != b:
            ax, ay, bx, by = a % w, a // w, b % w, b // w
            side = ("E" if bx > ax else "W") if ax != bx else ("S" if by > ay else "N")
            dx, dy = STEP[side]
            nxt = a + dx + dy * w
            conn = g.ucie_conn[(sip, a, side)][k]
            self._mesh(out, sip, a, g.attach[conn])
            opp = OPPOSITE[side]
            conn_b = g.ucie_conn[(sip, nxt, opp)][k]
            out += [conn, g.ucie_ep[(sip, a, side)], g.ucie_ep[(sip, nxt, opp)], conn_b, g.attach[conn_b]]
            a = nxt

    def _mesh(self, out: list[int], sip: int, cube: int, dst_router: int) -> None:
        g = self.g
        src_slot, dst_slot = g.router_slot[out[-1]], g.router_slot[dst_router]
        base = g.router_base[(sip, cube)]
        for rc in self._slot_path(src_slot, dst_slot):
            out.append(base + g.slot_pos[rc])

    def _slot_path(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        hit = self._xy.get((a, b))
        if hit is None:
            hit = self._xy[(a, b)] = self._compute_slot_path(a, b)
        return hit

    def _compute_slot_path(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        (r0, c0), (r1, c1) = a, b
        sx = 1 if c1 > c0 else -1
        sy = 1 if r1 > r0 else -1
        xy = [(r0, c) for c in range(c0 + sx, c1 + sx, sx)] if c0 != c1 else []
        xy += [(r, c1) for r in range(r0 + sy, r1 + sy, sy)] if r0 != r1 else []
        if all(rc in self._slots for rc in xy):
            return tuple(xy)
        yx = [(r, c0) for r in range(r0 + sy, r1 + sy, sy)] if r0 != r1 else []
        yx += [(r1, c) for c in range(c0 + sx, c1 + sx, sx)] if c0 != c1 else []
        if all(rc in self._slots for rc in yx):
            return tuple(yx)
        prev = {a: a}
        todo = deque([a])
        while todo:
            r, c = todo.popleft()
            if (r, c) == b:
                break
            for nb in ((r, c + sx), (r, c - sx), (r + sy, c), (r - sy, c)):
                if nb in self._slots and nb not in prev:
                    prev[nb] = (r, c)
                    todo.append(nb)
        path = [b]
        while path[-1] != a:
            path.append(prev[path[-1]])
        return tuple(path[::-1][1:])


def _cut_loops(path: list[int]) -> list[int]:
    """Drop any cycle (a boundary node such as a UCIe endpoint visited twice); keeps link validity."""
    if len(set(path)) == len(path):
        return path
    seen: dict[int, int] = {}
    out: list[int] = []
    for n in path:
        if n in seen:
            del out[seen[n] + 1:]
            seen = {m: i for i, m in enumerate(out)}
        else:
            seen[n] = len(out)
            out.append(n)
    return out

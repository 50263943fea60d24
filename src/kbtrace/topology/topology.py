"""``compile_topology`` and the frozen ``Topology`` it returns.

Phases: read YAML -> apply overrides -> validate into ``TopologyParams``
(``_spec``) -> build nodes/links (``_build``) -> freeze. The compiled object
is pickled under ``$KBTRACE_CACHE_DIR`` (default ``~/.cache/kbtrace/topology``)
keyed by sha256(YAML text, overrides, kbtrace version, compiler version);
editing the YAML changes the key, so a stale entry is never used.
"""

from __future__ import annotations

import difflib
import logging
import os
import pickle
from dataclasses import asdict, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa

from kbtrace import __version__, schema
from kbtrace._io import atomic_path, stable_hash
from kbtrace._yaml import YamlProblem
from kbtrace._yaml import read_text as read_yaml_text
from kbtrace.errors import AddressError, OutputError, RoutingError, TopologyError
from kbtrace.topology import address
from kbtrace.topology._build import PE_COMPONENTS, Graph, build_graph
from kbtrace.topology._route import Router
from kbtrace.topology._spec import apply_overrides, build_params, describe, load_yaml, sip_grid
from kbtrace.topology.model import Link, Node, PeCoord, Route
from kbtrace.topology.params import TopologyParams

_log = logging.getLogger("kbtrace.topology")

__all__ = ["Topology", "compile_topology", "cache_dir", "CACHE_STATS", "COMPILER_VERSION"]

#: bump when the compiled form changes for the same YAML (invalidates caches)
COMPILER_VERSION = "1"


@lru_cache(maxsize=1)
def _code_hash() -> str:
    """Hash of the topology package's source: part of the cache key, so a change of a
    default or of the compiler (an upgrade, or an edit in a development checkout) never
    serves a topology compiled by other code (~1 ms, once per process)."""
    return stable_hash(*(f.read_bytes() for f in sorted(Path(__file__).parent.glob("*.py"))))

#: process-wide cache counters (tests assert a second compile hits the cache)
CACHE_STATS = {"hits": 0, "misses": 0}
#: routes ``Topology.route`` keeps (the cache is emptied when full)
ROUTE_CACHE_MAX = 1 << 14
#: pairs ``Topology.route_summary`` keeps (~0.2 KiB each against ~1.5 KiB for a whole route)
SUMMARY_CACHE_MAX = 1 << 18

_PE_SUB_NODE = {0: "pe_cpu", 1: "math", 2: "ipcq", 3: "pe_cpu", 4: "math", 5: "dma", 6: "tcm"}


def cache_dir() -> Path:
    env = os.environ.get("KBTRACE_CACHE_DIR")
    base = Path(env) if env else Path.home() / ".cache" / "kbtrace"
    return base / "topology"


class Topology:
    """A compiled, validated, immutable topology. Build it with ``compile_topology``."""

    __slots__ = ("params", "nodes", "links", "content_hash", "source", "overrides", "from_cache",
                 "_g", "_out", "_router", "_routes", "_summaries", "_pes", "_rt_consts", "_frozen")
    # the slots' types (set once in __init__ through object.__setattr__: the class is frozen)
    params: TopologyParams
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    content_hash: str
    source: str
    overrides: dict[str, Any]
    from_cache: bool
    _g: Graph
    _out: tuple[tuple[Link, ...], ...]
    _router: Router
    _routes: dict[tuple[int, int], Any]
    _summaries: dict[Any, Any]
    _pes: tuple[PeCoord, ...]
    _rt_consts: tuple[list[float], list[float], list[float]]
    _frozen: bool

    def __init__(self, params: TopologyParams, g: Graph, source: str,
                 overrides: dict[str, Any] | None = None) -> None:
        s = object.__setattr__
        s(self, "params", params)
        s(self, "nodes", tuple(g.nodes))
        s(self, "links", tuple(g.links))
        s(self, "content_hash", stable_hash(asdict(params), COMPILER_VERSION))
        s(self, "source", source)
        #: the ``--set`` overrides applied to the YAML (key -> value as given), sorted by key
        s(self, "overrides", dict(sorted((overrides or {}).items())))
        s(self, "from_cache", False)
        s(self, "_g", g)
        out: list[list[Link]] = [[] for _ in g.nodes]
        for ln in g.links:
            out[ln.src].append(ln)
        s(self, "_out", tuple(tuple(x) for x in out))
        s(self, "_pes", tuple(PeCoord(si, c, pe) for (si, c, pe) in sorted(g.hbm)))
        s(self, "_router", Router(g, params))
        s(self, "_routes", {})
        s(self, "_summaries", {})
        # per node overhead, per link latency and bandwidth: what route() sums along a path
        s(self, "_rt_consts", ([n.overhead_ns for n in g.nodes], [ln.latency_ns for ln in g.links],
                               [ln.bw_gbps for ln in g.links]))
        s(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Topology is frozen; cannot set {name!r} (compile a new one with overrides)")

    def __getstate__(self) -> dict[str, Any]:
        # plain tuples unpickle ~10x faster than thousands of slotted dataclass instances
        g = self._g
        rest = {f.name: getattr(g, f.name) for f in fields(g) if f.name not in ("nodes", "links")}
        return {"params": self.params, "source": self.source, "overrides": self.overrides,
                "graph": rest,
                "nodes": [astuple_node(n) for n in g.nodes], "links": [astuple_link(ln) for ln in g.links]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        g = Graph(nodes=[Node(*t) for t in state["nodes"]], links=[Link(*t) for t in state["links"]],
                  **state["graph"])
        Topology.__init__(self, state["params"], g, state["source"], state.get("overrides"))

    def __repr__(self) -> str:
        return (f"Topology({self.params.name!r}, sips={self.n_sips}, cubes/sip={self.cubes_per_sip}, "
                f"pes/cube={self.pes_per_cube}, nodes={len(self.nodes)}, links={len(self.links)})")

    # ------------------------------------------------------------------ sizes
    @property
    def n_sips(self) -> int:
        return self.params.system.sips.count

    @property
    def cubes_per_sip(self) -> int:
        return self.params.sip.cube_mesh_w * self.params.sip.cube_mesh_h

    @property
    def pes_per_cube(self) -> int:
        return self.params.cube.pes.count

    @property
    def n_io_chiplets(self) -> int:
        return len(self.params.sip.io_chiplets)

    @property
    def pes(self) -> tuple[PeCoord, ...]:
        return self._pes

    @property
    def hbm_slice_bytes(self) -> int:
        return self.params.cube.hbm.capacity_gb * (1 << 30) // self.pes_per_cube

    @property
    def hbm_bw_per_cube_gbps(self) -> float:
        """Spec HBM bandwidth of one cube (PEs x PCs x PC bandwidth), before efficiency."""
        h = self.params.cube.hbm
        return self.pes_per_cube * h.pcs_per_pe * h.pc_bw_gbps

    def peaks(self) -> dict[str, float]:
        """Per-PE peak rates, the roofs of a roofline: ``gemm_gflops_per_pe`` (2 FLOP per MAC:
        2 x mac_rows x mac_cols x clock), ``math_gops_per_pe`` (SIMD lanes x clock, element
        operations), ``hbm_gbps_per_pe`` (the PE's own HBM slice: PCs x PC bandwidth x
        efficiency), and ``pes`` (PEs in the system)."""
        p = self.params
        g, m, h = p.pe.gemm, p.pe.math, p.cube.hbm
        return {"gemm_gflops_per_pe": 2.0 * g.mac_rows * g.mac_cols * g.clock_ghz,
                "math_gops_per_pe": float(m.simd_lanes * m.clock_ghz),
                "hbm_gbps_per_pe": float(h.pcs_per_pe * h.pc_bw_gbps * h.efficiency),
                "pes": float(len(self._pes))}

    # ------------------------------------------------------------------ lookups
    def node(self, node_id: str | int | Node) -> Node:
        if isinstance(node_id, Node):
            node_id = node_id.idx
        if isinstance(node_id, int):
            if not 0 <= node_id < len(self.nodes):
                raise RoutingError(f"node index {node_id} out of range (0..{len(self.nodes) - 1})")
            return self.nodes[node_id]
        idx = self._g.by_id.get(node_id)
        if idx is None:
            close = difflib.get_close_matches(node_id, self._g.by_id, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else "see `kbtrace topo show` for the id grammar"
            raise RoutingError(f"unknown node id {node_id!r} in topology {self.params.name!r}; {hint}")
        return self.nodes[idx]

    def _idx(self, node: str | int | Node) -> int:
        """``node(n).idx`` with a fast path for an index already in range (route lookups)."""
        return node if isinstance(node, int) and 0 <= node < len(self.nodes) else self.node(node).idx

    def out_links(self, node_idx: int) -> tuple[Link, ...]:
        return self._out[node_idx]

    def link_between(self, src: int, dst: int) -> Link:
        idx = self._g.link_of.get((src, dst))
        if idx is None:
            raise RoutingError(f"no link {self.nodes[src].id} -> {self.nodes[dst].id}")
        return self.links[idx]

    def _check_pe(self, pe: PeCoord) -> None:
        if (pe.sip, pe.cube, pe.pe) not in self._g.hbm:
            raise RoutingError(f"PE {pe} does not exist in topology {self.params.name!r} "
                               f"({self.n_sips} SIPs x {self.cubes_per_sip} cubes x {self.pes_per_cube} PEs)")

    def pe_node(self, pe: PeCoord, component: str) -> Node:
        if component not in PE_COMPONENTS:
            raise RoutingError(f"unknown PE component {component!r}; use one of {', '.join(PE_COMPONENTS)}")
        self._check_pe(pe)
        return self.nodes[self._g.pe_comp[(pe.sip, pe.cube, pe.pe, component)]]

    def hbm_ctrl(self, pe: PeCoord) -> Node:
        self._check_pe(pe)
        return self.nodes[self._g.hbm[(pe.sip, pe.cube, pe.pe)]]

    def _cube_node(self, table: dict[tuple[int, int], int], sip: int, cube: int, what: str) -> Node:
        idx = table.get((sip, cube))
        if idx is None:
            raise RoutingError(f"no {what} for sip{sip}.cube{cube}: topology has {self.n_sips} SIPs x "
                               f"{self.cubes_per_sip} cubes")
        return self.nodes[idx]

    def sram(self, sip: int, cube: int) -> Node:
        return self._cube_node(self._g.sram, sip, cube, "SRAM")

    def m_cpu(self, sip: int, cube: int) -> Node:
        return self._cube_node(self._g.mcpu, sip, cube, "M_CPU")

    def pcie_ep(self, sip: int, io: int = 0) -> Node:
        return self._cube_node(self._g.pcie_ep, sip, io, "PCIe EP")

    def io_cpu(self, sip: int, io: int = 0) -> Node:
        return self._cube_node(self._g.io_cpu, sip, io, "IO_CPU")

    @property
    def host(self) -> Node:
        return self.nodes[self._g.host]

    @property
    def switch(self) -> Node:
        return self.nodes[self._g.switch]

    def router_of(self, node: str | int | Node) -> Node | None:
        """The cube router a cube-level node attaches to (None outside cubes)."""
        n = self.node(node)
        idx = self._g.attach.get(n.idx, n.idx if n.kind == "router" else None)
        return None if idx is None else self.nodes[idx]

    def router_slot(self, node: str | int | Node) -> tuple[int, int]:
        """(row, col) of a router node."""
        n = self.node(node)
        slot = self._g.router_slot.get(n.idx)
        if slot is None:
            raise RoutingError(f"{n.id!r} is a {n.kind}, not a router; pass a router, e.g. topo.router_of({n.id!r})")
        return slot

    # ------------------------------------------------------------------ routing
    def route(self, src: str | int | Node, dst: str | int | Node) -> Route:
        """Deterministic route; cached per (src, dst) (the cache is emptied when it holds
        ``ROUTE_CACHE_MAX`` routes, so all-pairs traffic does not grow it without bound)."""
        s, d = self._idx(src), self._idx(dst)
        hit = self._routes.get((s, d))
        if hit is not None:
            return hit
        path = self._router.path(s, d)
        node_ov, link_lat, link_bw = self._rt_consts
        try:
            lidx = tuple(map(self._g.link_of.__getitem__, zip(path, path[1:], strict=False)))
        except KeyError as exc:      # a router bug, not bad input
            a, b = exc.args[0]
            raise AssertionError(f"router produced a hop without a link: {self.nodes[a].id} -> "
                                 f"{self.nodes[b].id}") from None
        overhead = sum(map(node_ov.__getitem__, path[1:]))
        wire = sum(map(link_lat.__getitem__, lidx))
        bws = [b for b in map(link_bw.__getitem__, lidx) if b > 0]
        commit, burst = 0.0, 0
        if self.nodes[d].kind == "hbm_ctrl":
            h = self.params.cube.hbm
            commit, burst = h.burst_bytes / (h.pc_bw_gbps * h.efficiency), h.burst_bytes
        drains = []     # backwards: keep link j if it is slower than every later link
        slowest = float("inf")
        before = overhead
        for j in range(len(lidx) - 1, -1, -1):
            before -= node_ov[path[j + 1]]          # overheads of path[1 .. j]
            bw = link_bw[lidx[j]]
            if 0 < bw < slowest:
                slowest = bw
                drains.append((before, bw))
        route = Route(tuple(path), lidx, overhead, wire, min(bws) if bws else 0.0, commit, burst,
                      tuple(drains))
        if len(self._routes) >= ROUTE_CACHE_MAX:
            self._routes.clear()
        self._routes[(s, d)] = route
        if len(self._summaries) >= SUMMARY_CACHE_MAX:
            self._summaries.clear()
        self._summaries[(s, d)] = Route((), (), overhead, wire, route.bottleneck_gbps, commit, burst,
                                        route.drains)
        return route

    def route_summary(self, src: str | int | Node, dst: str | int | Node) -> Route:
        """``route(src, dst)`` without its node and link lists: what ``lower_bound_ns`` needs.
        Kept for many more pairs than whole routes (``SUMMARY_CACHE_MAX``), so a check over
        every transfer of an all-pairs trace does not route each pair again."""
        s, d = self._idx(src), self._idx(dst)
        hit = self._summaries.get((s, d))
        if hit is None:
            self.route(s, d)
            hit = self._summaries[(s, d)]
        return hit

    # ------------------------------------------------------------------ addresses
    def resolve(self, addr: int) -> Node:
        """Physical address -> owning node (hbm_ctrl slice, PE unit, sram, m_cpu, io_cpu, pcie_ep)."""
        pa_ = address.decode(addr)
        if pa_.sip >= self.n_sips:
            raise AddressError(f"address {addr:#x}: SIP {pa_.sip} not in this topology ({self.n_sips} SIPs)")
        g = self._g
        if pa_.die >= address.IO_DIE_BASE:
            io = pa_.die - address.IO_DIE_BASE
            if io >= self.n_io_chiplets:
                raise AddressError(f"address {addr:#x}: IO chiplet die {pa_.die} not in this topology "
                                   f"({self.n_io_chiplets} chiplets = dies 16..{15 + self.n_io_chiplets})")
            return self.nodes[(g.io_cpu if pa_.target == "iocpu" else g.pcie_ep)[(pa_.sip, io)]]
        if pa_.die >= self.cubes_per_sip:
            raise AddressError(f"address {addr:#x}: cube {pa_.die} not in this topology "
                               f"({self.cubes_per_sip} cubes per SIP)")
        if pa_.target == "hbm":
            pe = pa_.offset // self.hbm_slice_bytes
            if pe >= self.pes_per_cube:
                raise AddressError(f"address {addr:#x}: HBM offset {pa_.offset:#x} beyond the "
                                   f"{self.params.cube.hbm.capacity_gb} GB implemented per cube")
            return self.nodes[g.hbm[(pa_.sip, pa_.die, pe)]]
        if pa_.target == "pe_local":
            assert pa_.pe is not None and pa_.sub_unit is not None
            if pa_.pe >= self.pes_per_cube:
                raise AddressError(f"address {addr:#x}: PE {pa_.pe} not in this topology "
                                   f"({self.pes_per_cube} PEs per cube)")
            if pa_.sub_unit == address.PE_TCM and pa_.offset >= self.params.pe.tcm.size_kb * 1024:
                raise AddressError(f"address {addr:#x}: TCM offset {pa_.offset:#x} beyond "
                                   f"pe.tcm.size_kb = {self.params.pe.tcm.size_kb}")
            return self.nodes[g.pe_comp[(pa_.sip, pa_.die, pa_.pe, _PE_SUB_NODE[pa_.sub_unit])]]
        if pa_.target == "cube_sram":
            if pa_.offset >= self.params.cube.sram.size_mb << 20:
                raise AddressError(f"address {addr:#x}: SRAM offset {pa_.offset:#x} beyond "
                                   f"cube.sram.size_mb = {self.params.cube.sram.size_mb}")
            return self.nodes[g.sram[(pa_.sip, pa_.die)]]
        return self.nodes[g.mcpu[(pa_.sip, pa_.die)]]

    def sip_grid(self) -> tuple[int, int]:
        """(w, h) of the SIP grid: ``system.sips.w/h`` (a square grid when both are omitted and
        the count is square, ADR-0024 D5); ``ring_1d`` is one row of ``count`` SIPs."""
        sips = self.params.system.sips
        if sips.topology == "ring_1d":
            return sips.count, 1
        return sip_grid(self.params)

    def sip_neighbors(self, prefix: str = "global_") -> dict[int, dict[str, int]]:
        """SIP -> {direction: neighbour SIP} for inter-SIP collectives (``system.sips.topology``).

        ``ring_1d``: E = next SIP, W = previous (one SIP: none). ``torus_2d`` / ``mesh_2d``:
        row-major ``w`` x ``h`` grid (``system.sips.w/h``, else square-ish), E/W along a row,
        N/S along a column, wrapping for the torus; grid slots beyond ``count`` are empty.
        Directions carry ``prefix`` (``global_E`` ...), matching IPCQ direction names.
        """
        sips = self.params.system.sips
        n = sips.count
        if sips.topology == "ring_1d":
            w, h, wrap = n, 1, True
        else:
            w, h = sip_grid(self.params)
            wrap = sips.topology == "torus_2d"
        table: dict[int, dict[str, int]] = {}
        for sip in range(n):
            y, x = divmod(sip, w)
            nb: dict[str, int] = {}
            for d, dx, dy in (("E", 1, 0), ("W", -1, 0), ("N", 0, -1), ("S", 0, 1)):
                nx, ny = x + dx, y + dy
                if wrap:
                    nx, ny = nx % w, ny % h
                peer = ny * w + nx
                if 0 <= nx < w and 0 <= ny < h and peer < n and peer != sip:
                    nb[prefix + d] = peer
            table[sip] = nb
        return table

    def hbm_base(self, pe: PeCoord) -> int:
        """Physical address of the first byte of a PE's HBM slice."""
        self._check_pe(pe)
        return address.hbm_addr(pe.sip, pe.cube, pe.pe * self.hbm_slice_bytes)

    # ------------------------------------------------------------------ tables
    def nodes_table(self) -> pa.Table:
        ns = self.nodes
        cols = [
            pa.array([n.idx for n in ns], pa.int32()),
            pa.array([n.id for n in ns], pa.string()),
            _dict([n.kind for n in ns]),
            pa.array([n.sip for n in ns], pa.int16()),
            pa.array([n.cube for n in ns], pa.int16()),
            pa.array([n.pe for n in ns], pa.int16()),
            pa.array([n.overhead_ns for n in ns], pa.float64()),
            pa.array([n.x_mm for n in ns], pa.float64()),
            pa.array([n.y_mm for n in ns], pa.float64()),
        ]
        return pa.Table.from_arrays(cols, schema=schema.NODES)

    def links_table(self) -> pa.Table:
        ls, ns = self.links, self.nodes
        cols = [
            pa.array([ln.idx for ln in ls], pa.int32()),
            pa.array([ln.src for ln in ls], pa.int32()),
            pa.array([ln.dst for ln in ls], pa.int32()),
            pa.array([ns[ln.src].id for ln in ls], pa.string()),
            pa.array([ns[ln.dst].id for ln in ls], pa.string()),
            _dict([ln.kind for ln in ls]),
            pa.array([ln.bw_gbps for ln in ls], pa.float64()),
            pa.array([ln.distance_mm for ln in ls], pa.float64()),
            pa.array([ln.latency_ns for ln in ls], pa.float64()),
        ]
        return pa.Table.from_arrays(cols, schema=schema.LINKS)


def astuple_node(n: Node) -> tuple[Any, ...]:
    return (n.idx, n.id, n.kind, n.sip, n.cube, n.pe, n.overhead_ns, n.x_mm, n.y_mm)


def astuple_link(ln: Link) -> tuple[Any, ...]:
    return (ln.idx, ln.src, ln.dst, ln.kind, ln.bw_gbps, ln.distance_mm, ln.latency_ns)


def _dict(values: list[str]) -> pa.Array:
    return pa.array(values, pa.string()).dictionary_encode().cast(pa.dictionary(pa.int16(), pa.string()))


# ----------------------------------------------------------------------------- compile

def compile_topology(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None,
                     *, use_cache: bool = True) -> Topology:
    """Validate and compile a topology YAML (+ dotted-key overrides); cached on disk by content."""
    where = str(path)
    try:
        text = read_yaml_text(path)
    except FileNotFoundError:
        raise TopologyError(f"{where}: no such topology file; see topologies/*.yaml") from None
    except OSError as exc:
        raise TopologyError(f"{where}: cannot read topology file ({exc.strerror})") from None
    except YamlProblem as bad:
        raise TopologyError(f"{where}: {bad.message()}") from None
    ov = dict(overrides or {})
    key = stable_hash(text, sorted((k, repr(v)) for k, v in ov.items()), __version__, COMPILER_VERSION,
                      _code_hash())
    cfile = cache_dir() / f"{key}.pkl"
    if use_cache and cfile.is_file():
        try:
            with open(cfile, "rb") as fh:
                topo = pickle.load(fh)
            if isinstance(topo, Topology):
                object.__setattr__(topo, "source", where)
                object.__setattr__(topo, "from_cache", True)
                CACHE_STATS["hits"] += 1
                _log.info(f"topology {where}: from the cache ({cfile})")
                return topo
        except Exception:  # noqa: BLE001 - a corrupt cache entry is rebuilt, never trusted
            pass
    raw = apply_overrides(load_yaml(text, where), ov, where)
    params = build_params(raw, where, ov)
    # the graph builder's one check (no zero-latency hop) reads distances and overheads
    hop_where = describe(where, {k: v for k, v in ov.items() if k.endswith(("_mm", "_ns"))})
    topo = Topology(params, build_graph(params, hop_where), where, ov)
    CACHE_STATS["misses"] += 1
    cached = False
    if use_cache:
        try:
            cfile.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(cfile) as tmp:
                tmp.write_bytes(pickle.dumps(topo, protocol=pickle.HIGHEST_PROTOCOL))
            cached = True
        except (OSError, OutputError) as exc:   # a read-only or full cache dir costs speed only
            _warn_cache_once(cfile.parent, exc)
    _log.info(f"topology {where}: compiled" + (f", cached as {cfile}" if cached else ""))
    return topo


_CACHE_WARNED: set[str] = set()


def _warn_cache_once(where: Path, exc: Exception) -> None:
    """One warning per process and cache directory that cannot be written (read-only home,
    full disk): compiles still work, they are just not reused."""
    if str(where) in _CACHE_WARNED:
        return
    _CACHE_WARNED.add(str(where))
    import warnings
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "cannot write there"
    warnings.warn(f"topology cache {where} is not writable ({why}); compiling without it "
                  "(set KBTRACE_CACHE_DIR to a writable directory to reuse compiled "
                  "topologies)", RuntimeWarning, stacklevel=3)

"""The compiled, frozen topology: nodes, directed links, routes, parameters.

Produced only by ``compile_topology`` (which validates everything); every other
stage trusts it. Nodes and links have dense integer ids (``idx``) for hot paths
and dotted string ids for humans, logs, hop rows and SQL.

Node id grammar (dotted scopes)::

    host                                  fabric.switch0
    sip{S}.io{I}.pcie_ep|io_noc|io_cpu    sip{S}.io{I}.ucie{k}   sip{S}.io{I}.ucie{k}.conn{c}
    sip{S}.cube{C}.r{R}c{C}               (routers)
    sip{S}.cube{C}.ucie_{n|s|e|w}         sip{S}.cube{C}.ucie_{n|s|e|w}.conn{c}
    sip{S}.cube{C}.hbm_ctrl.pe{P}         sip{S}.cube{C}.sram   sip{S}.cube{C}.m_cpu
    sip{S}.cube{C}.pe{P}.pe_cpu|scheduler|dma|fetch_store|gemm|math|tcm|ipcq
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Node", "Link", "PeCoord", "Route"]


@dataclass(frozen=True, slots=True)
class Node:
    idx: int
    id: str
    kind: str            # one of schema.NODE_KINDS
    sip: int | None
    cube: int | None
    pe: int | None
    overhead_ns: float
    x_mm: float = 0.0
    y_mm: float = 0.0


@dataclass(frozen=True, slots=True)
class Link:
    idx: int
    src: int             # node idx
    dst: int             # node idx
    kind: str            # one of schema.LINK_KINDS
    bw_gbps: float       # 0 = command-only
    distance_mm: float
    latency_ns: float    # distance_mm * ns_per_mm


@dataclass(frozen=True, slots=True, order=True)
class PeCoord:
    """A PE's place in the tray; the order is (sip, cube, pe)."""
    sip: int
    cube: int
    pe: int

    def __str__(self) -> str:
        return f"sip{self.sip}.cube{self.cube}.pe{self.pe}"


@dataclass(frozen=True, slots=True)
class Route:
    """A deterministic path: ``nodes[i] --links[i]--> nodes[i+1]``.

    ``overhead_ns`` sums the overheads of every node on the path except the
    source (the source's own cost is charged by the component that issues the
    transfer); ``wire_ns`` sums link propagation; ``bottleneck_gbps`` is the
    minimum bandwidth of the payload-carrying links.
    """
    nodes: tuple[int, ...]
    links: tuple[int, ...]
    overhead_ns: float
    wire_ns: float
    bottleneck_gbps: float
    commit_ns_per_burst: float = 0.0   # HBM commit of a whole burst when the route ends at HBM
    burst_bytes: int = 0               # HBM burst size (0: the route does not end at HBM)
    # (overheads charged before link j, bw of link j) for the links no later link is as slow
    # as: what ``floor_ns`` needs
    drains: tuple[tuple[float, float], ...] = ()

    def _commit_ns(self, nbytes: int) -> float:
        """HBM commit of the transfer's last burst (short when ``nbytes`` is not a multiple
        of the burst size)."""
        commit = self.commit_ns_per_burst if nbytes > 0 else 0.0
        b = self.burst_bytes
        if commit and b and nbytes % b:
            commit *= (nbytes % b) / b
        return commit

    def lower_bound_ns(self, nbytes: int) -> float:
        """``Σ overhead + Σ distance·ns_per_mm + nbytes / bottleneck + HBM commit``: the
        predecessor's probe formula (ADR-0049), exact for a transfer whose every overhead
        precedes its bottleneck link."""
        drain = nbytes / self.bottleneck_gbps if nbytes > 0 and self.bottleneck_gbps > 0 else 0.0
        return self.overhead_ns + self.wire_ns + drain + self._commit_ns(nbytes)

    def floor_ns(self, nbytes: int) -> float:
        """A bound no transfer of ``nbytes`` can beat, with wormhole pipelining:
        ``Σ wire + commit + max(Σ overhead, max over links j of (overheads before j +
        nbytes / bw_j))``. Node overheads delay the head flit only, so those after the
        bottleneck can overlap its drain and ``lower_bound_ns`` is not a bound when a
        slower link precedes an overhead (e.g. PCIe ahead of UCIe endpoints)."""
        drain = 0.0
        if nbytes > 0:
            for ov, bw in self.drains:
                d = ov + nbytes / bw
                if d > drain:
                    drain = d
        return self.wire_ns + self._commit_ns(nbytes) + max(self.overhead_ns, drain)

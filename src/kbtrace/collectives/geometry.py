"""Who takes part in a collective, where each PE sits, and its IPCQ neighbours.

A collective is a sparse launch on exactly the taking-part PEs (``members()``: PE lanes
``0..P-1`` of the cubes ``cubes`` of every SIP), so program index ``i`` is the i-th of them in
(SIP, cube, PE) order (``index``) and no program runs where no shard lives. Neighbour
tables map program index -> {direction: program index}; they are derived from
the topology: the cube mesh (``sip.cube_mesh_w/h``, no wrap), the SIP fabric
(``Topology.sip_neighbors``: ring_1d / torus_2d / mesh_2d on ``system.sips.w/h``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Geometry", "SIP_TOPOLOGIES", "Table"]

SIP_TOPOLOGIES = ("ring_1d", "torus_2d", "mesh_2d")
Table = dict[int, dict[str, int]]


@dataclass(frozen=True, slots=True)
class Geometry:
    """The shape of one collective: sizes of each level and where the root is."""
    n_sips: int
    cubes_per_sip: int
    cube_w: int
    cube_h: int
    pes: int                       # PE lanes 0..pes-1 of each cube take part
    cubes: tuple[int, ...]         # cubes (per SIP) taking part: all, or one
    sip_topology: str              # ring_1d | torus_2d | mesh_2d
    sip_w: int                     # SIP grid (ring_1d: n_sips x 1)
    sip_h: int
    root: tuple[int, int]          # (col, row) of the root cube on the cube mesh (lrab)
    sip_table: tuple[tuple[tuple[str, int], ...], ...]   # per SIP: (direction, SIP) pairs

    @classmethod
    def of(cls, topo: Any, pes: int, cubes: tuple[int, ...], root: str = "centre") -> Geometry:
        p = topo.params
        w, h = p.sip.cube_mesh_w, p.sip.cube_mesh_h
        sips = p.system.sips
        sw, sh = topo.sip_grid()
        rc = (w // 2, h // 2) if root == "centre" else (w - 1, h - 1)
        table = topo.sip_neighbors()
        return cls(sips.count, topo.cubes_per_sip, w, h, pes, tuple(cubes), sips.topology,
                   sw, sh, rc, tuple(tuple(sorted(table[s].items())) for s in range(sips.count)))

    @property
    def single_cube(self) -> bool:
        return len(self.cubes) == 1

    @property
    def root_cube(self) -> int:
        return self.root[1] * self.cube_w + self.root[0]

    def index(self, sip: int, cube: int, pe: int) -> int:
        """Program index of (sip, cube, pe) in the collective's launch (``members`` order)."""
        return (sip * len(self.cubes) + self.cubes.index(cube)) * self.pes + pe

    def members(self) -> list[tuple[int, int, int]]:
        """(sip, cube, pe) of every taking-part PE, in (SIP, cube, PE) order."""
        return [(s, c, e) for s in range(self.n_sips) for c in self.cubes for e in range(self.pes)]

    # ------------------------------------------------------------------ neighbour tables
    def pe_ring(self, table: Table) -> None:
        """``intra_E`` / ``intra_W``: next / previous PE lane of the same cube (a ring)."""
        if self.pes < 2:
            return
        for s, c, e in self.members():
            t = table.setdefault(self.index(s, c, e), {})
            t["intra_E"] = self.index(s, c, (e + 1) % self.pes)
            t["intra_W"] = self.index(s, c, (e - 1) % self.pes)

    def cube_mesh(self, table: Table) -> None:
        """``E/W/N/S``: the same PE lane of the neighbouring cube on the cube mesh (no wrap)."""
        if self.single_cube:
            return
        for s, c, e in self.members():
            y, x = divmod(c, self.cube_w)
            t = table.setdefault(self.index(s, c, e), {})
            for d, dx, dy in (("E", 1, 0), ("W", -1, 0), ("N", 0, -1), ("S", 0, 1)):
                nx, ny = x + dx, y + dy
                if 0 <= nx < self.cube_w and 0 <= ny < self.cube_h:
                    t[d] = self.index(s, ny * self.cube_w + nx, e)

    def cube_ring(self, table: Table) -> None:
        """``S`` / ``N``: the same PE lane of the next / previous cube of the SIP (a ring)."""
        n = len(self.cubes)
        if n < 2:
            return
        for s, c, e in self.members():
            i = self.cubes.index(c)
            t = table.setdefault(self.index(s, c, e), {})
            t["S"] = self.index(s, self.cubes[(i + 1) % n], e)
            t["N"] = self.index(s, self.cubes[(i - 1) % n], e)

    def sip_fabric(self, table: Table) -> None:
        """``global_*``: the same cube and PE lane on the neighbouring SIP (system.sips)."""
        for s, c, e in self.members():
            t = table.setdefault(self.index(s, c, e), {})
            for d, peer in self.sip_table[s]:
                t[d] = self.index(peer, c, e)

    def flat_ring(self, table: Table) -> None:
        """``E`` / ``W``: next / previous taking-part PE in (SIP, cube, PE) order."""
        m = self.members()
        n = len(m)
        for i, who in enumerate(m):
            t = table.setdefault(self.index(*who), {})
            if n > 1:
                t["E"] = self.index(*m[(i + 1) % n])
                t["W"] = self.index(*m[(i - 1) % n])

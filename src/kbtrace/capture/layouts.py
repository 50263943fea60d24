"""Neighbour tables for IPCQ launches: program index -> {direction: peer program index}.

Pass one to ``Workload.launch(..., neighbors=...)``. Directions are kbtrace's
IPCQ names (``schema.DIRECTIONS``); ``prefix`` picks the namespace: ``"intra_"``
(PE to PE inside a cube, the default), ``""`` (cube to cube) or ``"global_"``
(SIP to SIP).
"""

from __future__ import annotations

__all__ = ["ring", "mesh", "torus"]

Table = dict[int, dict[str, int]]


def ring(n: int, prefix: str = "intra_", bidirectional: bool = True) -> Table:
    """Programs 0..n-1 in a ring: E = next, W = previous (W omitted if not bidirectional)."""
    table: Table = {}
    for i in range(n):
        table[i] = {f"{prefix}E": (i + 1) % n}
        if bidirectional:
            table[i][f"{prefix}W"] = (i - 1) % n
    return table


def mesh(w: int, h: int, prefix: str = "intra_", wrap: bool = False) -> Table:
    """Row-major ``w`` x ``h`` grid: E/W along a row, N/S along a column (``wrap`` = torus)."""
    table: Table = {}
    for y in range(h):
        for x in range(w):
            nb: dict[str, int] = {}
            for d, dx, dy in (("E", 1, 0), ("W", -1, 0), ("N", 0, -1), ("S", 0, 1)):
                nx, ny = x + dx, y + dy
                if wrap:
                    nx, ny = nx % w, ny % h
                if 0 <= nx < w and 0 <= ny < h and (nx, ny) != (x, y):
                    nb[prefix + d] = ny * w + nx
            table[y * w + x] = nb
    return table


def torus(w: int, h: int, prefix: str = "intra_") -> Table:
    """``mesh`` with wrap-around links."""
    return mesh(w, h, prefix, wrap=True)

"""Intra-SIP data placement: ``DPPolicy`` -> ``ShardSpec`` list (ADR-0026).

A ``DPPolicy`` says how one SIP's copy of a tensor is spread over cubes (level 1)
and, inside each cube's part, over PEs (level 2). Which SIP holds it is *not*
part of the policy (ADR-0026 D1): the host program chooses the SIP (rank), and
``resolve_dp_policy(..., target_sip=)`` stamps it on every shard.

The tensor is seen as a matrix ``(rows, cols)``: a 2-D tensor as itself, a 1-D
tensor of ``n`` elements as ``(1, n)``. At each level the part is split by one of

``replicate``           every target gets the whole part (a copy each)
``row_wise``            target ``i`` of ``n`` gets rows ``[i*R/n, (i+1)*R/n)``
``column_wise``         target ``i`` of ``n`` gets columns ``[i*C/n, (i+1)*C/n)``
``tiled_row_major``     a ``gr x gc`` grid of blocks (``gr * gc = n``, ``gr`` the largest
                        divisor of ``n`` not above ``sqrt(n)``); block ``(i, j)`` goes to
                        target ``i*gc + j``
``tiled_column_major``  the same grid; block ``(i, j)`` goes to target ``j*gr + i``

(the reference names the tiled variants but not their layout; this block layout is
kbtrace's choice). A split that does not divide the part evenly is an error naming
the dimension, the count and the fix. ``num_cubes`` / ``num_pes`` (default: every
cube of the SIP / every PE of a cube) say how many targets each level uses: cubes
``0 .. num_cubes-1``, PEs ``0 .. num_pes-1``.

Every ``ShardSpec`` carries the reference's five fields ``(sip, cube, pe,
offset_bytes, nbytes)`` -- ``offset_bytes`` is the byte offset of the shard's first
element in the row-major full tensor -- plus its element ``offset`` and ``shape``
(a column shard is not contiguous in the full tensor, so offset and size alone do
not say which elements it holds) and ``replica``: the shards of one replica tile
the tensor exactly once; replicating at a level multiplies the replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kbtrace.errors import CaptureError

__all__ = ["DPPolicy", "ShardSpec", "POLICIES", "resolve_dp_policy", "tile_grid", "picture"]

POLICIES = ("replicate", "column_wise", "row_wise", "tiled_row_major", "tiled_column_major")


class PlacementError(CaptureError):
    """A placement policy is malformed or does not divide a tensor."""


@dataclass(frozen=True, slots=True)
class DPPolicy:
    """How one SIP's copy of a tensor spreads over its cubes and their PEs (see module doc)."""
    cube: str = "replicate"
    pe: str = "replicate"
    num_cubes: int | None = None
    num_pes: int | None = None

    def __post_init__(self) -> None:
        for level in ("cube", "pe"):
            v = getattr(self, level)
            if v not in POLICIES:
                raise PlacementError(f"DPPolicy({level}={v!r}): use one of {', '.join(POLICIES)}")
        for name in ("num_cubes", "num_pes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise PlacementError(f"DPPolicy({name}={v!r}): must be a positive int or None "
                                     f"(None = all of them)")

    def resolve(self, *, shape: tuple[int, ...], itemsize: int, num_cubes: int, num_pes: int,
                target_sip: int) -> list[ShardSpec]:
        """Shards on ``target_sip`` of a topology with ``num_cubes`` cubes per SIP and
        ``num_pes`` PEs per cube (the policy's own counts must fit in those)."""
        nc = num_cubes if self.num_cubes is None else self.num_cubes
        npe = num_pes if self.num_pes is None else self.num_pes
        if nc > num_cubes:
            raise PlacementError(f"DPPolicy(num_cubes={nc}): a SIP has {num_cubes} cubes; "
                                 f"use num_cubes <= {num_cubes}")
        if npe > num_pes:
            raise PlacementError(f"DPPolicy(num_pes={npe}): a cube has {num_pes} PEs; "
                                 f"use num_pes <= {num_pes}")
        return resolve_dp_policy(DPPolicy(self.cube, self.pe, nc, npe), shape=shape,
                                 itemsize=itemsize, num_pes=npe, num_cubes=nc,
                                 target_sip=target_sip)


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One shard: where it lives (structural ``sip, cube, pe``) and what it holds."""
    sip: int
    cube: int
    pe: int
    offset_bytes: int
    nbytes: int
    offset: tuple[int, ...] = ()
    shape: tuple[int, ...] = ()
    replica: int = 0


def tile_grid(n: int) -> tuple[int, int]:
    """``(gr, gc)`` with ``gr * gc == n`` and ``gr`` the largest divisor of ``n`` <= sqrt(n)."""
    gr = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return gr, n // gr


Block = tuple[int, int, int, int]    # row0, col0, rows, cols


def _split(policy: str, block: Block, n: int, what: str, level: str) -> list[tuple[int, Block]]:
    """(target, sub-block) pairs of ``block`` split over ``n`` targets by ``policy``;
    target order = target index."""
    r0, c0, nr, ncol = block
    if policy == "replicate":
        return [(i, block) for i in range(n)]

    def parts(size: int, k: int, dim: str) -> int:
        if size % k:
            raise PlacementError(f"{what}: {level}={policy!r} splits {dim} {size} over {k} "
                                 f"{level}s, which does not divide; use a {dim} that is a multiple "
                                 f"of {k}, or num_{level}s that divides {size}")
        return size // k

    if policy == "row_wise":
        h = parts(nr, n, "rows")
        return [(i, (r0 + i * h, c0, h, ncol)) for i in range(n)]
    if policy == "column_wise":
        w = parts(ncol, n, "columns")
        return [(i, (r0, c0 + i * w, nr, w)) for i in range(n)]
    gr, gc = tile_grid(n)
    h, w = parts(nr, gr, "rows"), parts(ncol, gc, "columns")
    out = []
    for i in range(gr):
        for j in range(gc):
            t = i * gc + j if policy == "tiled_row_major" else j * gr + i
            out.append((t, (r0 + i * h, c0 + j * w, h, w)))
    return sorted(out)


def resolve_dp_policy(policy: DPPolicy, *, shape: tuple[int, ...], itemsize: int, num_pes: int,
                      num_cubes: int = 1, target_sip: int, name: str = "tensor"
                      ) -> list[ShardSpec]:
    """Every shard of a ``shape`` tensor placed by ``policy`` on SIP ``target_sip``:
    cube-level split first, then PE-level inside each cube's part (ADR-0026 D3).
    Ordered by (cube, pe)."""
    shape = tuple(int(s) for s in shape)
    what = f"{name} {shape}"
    if len(shape) not in (1, 2):
        raise PlacementError(f"{what}: DPPolicy places 1-D and 2-D tensors; declare it 2-D "
                             f"(rows, columns)")
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    out: list[ShardSpec] = []
    n_cube_rep = num_cubes if policy.cube == "replicate" else 1
    n_pe_rep = num_pes if policy.pe == "replicate" else 1
    for cube, cblock in _split(policy.cube, (0, 0, rows, cols), num_cubes, what, "cube"):
        for pe, (r0, c0, nr, nc) in _split(policy.pe, cblock, num_pes, what, "pe"):
            replica = ((cube if n_cube_rep > 1 else 0) * n_pe_rep
                       + (pe if n_pe_rep > 1 else 0))
            off: tuple[int, ...]
            shp: tuple[int, ...]
            if len(shape) == 1:
                off, shp = (c0,), (nc,)
            else:
                off, shp = (r0, c0), (nr, nc)
            out.append(ShardSpec(sip=int(target_sip), cube=cube, pe=pe,
                                 offset_bytes=(r0 * cols + c0) * itemsize,
                                 nbytes=nr * nc * itemsize, offset=off, shape=shp,
                                 replica=replica))
    return out


def picture(policy: DPPolicy, shape: tuple[int, int], num_cubes: int, num_pes: int) -> str:
    """Text picture of where ``policy`` puts a 2-D tensor: one cell per element naming its
    owner ``cube.pe``, one grid per replica side by side (used in docs/capture.md)."""
    shards = policy.resolve(shape=shape, itemsize=1, num_cubes=num_cubes, num_pes=num_pes,
                            target_sip=0)
    grids = []
    for rep in sorted({s.replica for s in shards}):
        g = [["" for _ in range(shape[1])] for _ in range(shape[0])]
        for s in shards:
            if s.replica == rep:
                for r in range(s.offset[0], s.offset[0] + s.shape[0]):
                    for c in range(s.offset[1], s.offset[1] + s.shape[1]):
                        g[r][c] = f"{s.cube}.{s.pe}"
        grids.append(g)
    return "\n".join("   ".join(" ".join(g[r]) for g in grids) for r in range(shape[0]))

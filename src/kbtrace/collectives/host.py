"""``all_reduce(w, tensors, ...)``: validate the shards, build the geometry, launch the kernel.

``tensors``: one tensor, sharded one shard per taking-part PE, or a list of tensors (for
example one per rank), whose shards together are the taking-part PEs. Every shard must
have the same shape and dtype; every SIP (rank) must hold shards on the same cubes (all
cubes of the SIP, or one) and the same PE lanes ``0..P-1``. After the launch every shard
holds the elementwise sum of all shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kbtrace.collectives.geometry import Geometry, Table
from kbtrace.collectives.kernels import hier3_kernel, lrab_kernel, ring_kernel
from kbtrace.errors import CaptureError

__all__ = ["all_reduce", "ALGORITHMS", "ROOTS", "OPS", "neighbor_table"]

ALGORITHMS = {"lrab": lrab_kernel, "hier3": hier3_kernel, "ring": ring_kernel}
ROOTS = ("centre", "corner")
OPS = ("sum",)
_IPCQ = ("buffer_kind", "n_slots", "slot_bytes")


def neighbor_table(algorithm: str, g: Geometry) -> Table:
    """The IPCQ neighbour table of ``algorithm`` on geometry ``g`` (see ``Geometry``)."""
    table: Table = {}
    if algorithm == "ring":
        g.flat_ring(table)
        return table
    g.pe_ring(table)
    if algorithm == "lrab":
        g.cube_mesh(table)
    else:
        g.cube_ring(table)
    g.sip_fabric(table)
    return table


def _fail(msg: str) -> CaptureError:
    return CaptureError(f"all_reduce: {msg}")


def _shards(tensors: Any) -> list[tuple[Any, Any]]:
    """(tensor, shard) for every shard of ``tensors`` (a tensor or a sequence of them)."""
    ts = list(tensors) if isinstance(tensors, Sequence) and not hasattr(tensors, "shards") \
        else [tensors]
    if not ts:
        raise _fail("no tensor given; pass the tensor (or one per rank) to reduce")
    out: list[Any] = []
    for t in ts:
        if not hasattr(t, "shards"):
            raise _fail(f"expected a tensor declared with w.tensor(...), got {type(t).__name__}")
        out.extend((t, s) for s in t.shards)
    return out


def _layout(topo: Any, shards: list[tuple[Any, Any]]) -> tuple[int, tuple[int, ...], int]:
    """(PE lanes P, cubes per SIP, elements per shard) of a regular layout, or a one-line error."""
    t0, s0 = shards[0]
    seen: dict[tuple[int, int, int], str] = {}
    for t, s in shards:
        if t.dtype != t0.dtype:
            raise _fail(f"tensors {t0.name!r} ({t0.dtype}) and {t.name!r} ({t.dtype}) have "
                        f"different dtypes; every rank must reduce the same dtype")
        if tuple(s.shape) != tuple(s0.shape):
            raise _fail(f"shard of {t.name!r} on sip{s.sip}.cube{s.cube}.pe{s.pe} is "
                        f"{tuple(s.shape)}, shard of {t0.name!r} on sip{s0.sip}.cube{s0.cube}."
                        f"pe{s0.pe} is {tuple(s0.shape)}; every shard must have the same shape")
        key = (s.sip, s.cube, s.pe)
        if key in seen:
            raise _fail(f"{seen[key]!r} and {t.name!r} both have a shard on sip{s.sip}.cube"
                        f"{s.cube}.pe{s.pe}; one shard per PE")
        seen[key] = t.name
    by_sip: dict[int, set[tuple[int, int]]] = {}
    for s, c, e in seen:
        by_sip.setdefault(s, set()).add((c, e))
    n = topo.n_sips
    missing = [s for s in range(n) if s not in by_sip]
    if missing:
        names = ", ".join(repr(n) for n in sorted({t.name for t, _ in shards}))
        raise _fail(f"tensor {names} is not present on every rank: SIP(s) {missing} of {n} hold no "
                    f"shard; place a shard on every SIP (rank = SIP)")
    ref = by_sip[0]
    for s in range(1, n):
        if by_sip[s] != ref:
            raise _fail(f"SIP {s} holds shards on (cube, pe) {sorted(by_sip[s])} but SIP 0 on "
                        f"{sorted(ref)}; every rank needs the same layout")
    cubes = sorted({c for c, _ in ref})
    pes = sorted({e for _, e in ref})
    if ref != {(c, e) for c in cubes for e in pes} or pes != list(range(len(pes))):
        raise _fail(f"shards on (cube, pe) {sorted(ref)} of each SIP: use PE lanes 0..P-1 of "
                    f"the same cubes")
    if len(cubes) not in (1, topo.cubes_per_sip):
        raise _fail(f"shards on {len(cubes)} of the {topo.cubes_per_sip} cubes of each SIP; "
                    f"use every cube or one")
    nelem = 1
    for d in s0.shape:
        nelem *= int(d)
    return len(pes), tuple(cubes), nelem


def all_reduce(w: Any, tensors: Any, op: str = "sum", algorithm: str = "lrab",
               root: str = "centre", buffer_kind: str | None = None, n_slots: int | None = None,
               slot_bytes: int | None = None) -> Geometry:
    """Launch an all-reduce of ``tensors`` on workload ``w``; every shard ends with the sum.

    ``algorithm``: ``lrab`` | ``hier3`` | ``ring``; ``root``: ``centre`` | ``corner`` (lrab);
    ``buffer_kind`` / ``n_slots`` / ``slot_bytes``: this collective's IPCQ settings
    (default: the topology's ``pe.ipcq``). Returns the ``Geometry`` it ran on."""
    if op not in OPS:
        raise _fail(f"unsupported op {op!r}; supported: {', '.join(OPS)}")
    if algorithm not in ALGORITHMS:
        raise _fail(f"unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    if root not in ROOTS:
        raise _fail(f"root={root!r}; use one of {', '.join(ROOTS)}")
    topo = w.topo
    shards = _shards(tensors)
    pes, cubes, nelem = _layout(topo, shards)
    g = Geometry.of(topo, pes, cubes, root)
    members = len(g.members())
    if algorithm == "ring" and nelem % members:
        raise _fail(f"ring needs the shard's {nelem} elements to split over the {members} PEs; "
                    f"use a multiple of {members}")
    dtype = shards[0][0].dtype
    addrs = {(s.sip, s.cube, s.pe): s.addr for _, s in shards}
    ipcq = {k: v for k, v in zip(_IPCQ, (buffer_kind, n_slots, slot_bytes), strict=True)
            if v is not None}
    w.launch(ALGORITHMS[algorithm], args=(addrs, nelem, dtype, g), sips=list(range(g.n_sips)),
             cubes=list(g.cubes), pes=list(range(g.pes)),
             neighbors=neighbor_table(algorithm, g), ipcq=ipcq or None)
    return g

"""The all-reduce kernels (``lrab``, ``hier3``, ``ring``) and the phases they share.

Every kernel takes ``(tl, addrs, n, dtype, g)``: ``addrs`` maps (sip, cube, pe) to the
address of that PE's shard (``n`` elements of ``dtype``), ``g`` is the ``Geometry``; it runs
on exactly the PEs holding a shard (a sparse launch) and finds its own with ``tl.sip_id()``,
``tl.cube_id()``, ``tl.pe_id()``. Sums accumulate in ``dtype`` with
``tl`` adds; every shard is overwritten with the total (``tl.store``).

Line phases: positions ``0..n-1`` on a line with the root at ``r``; ``dec`` / ``inc`` are
the directions toward the lower / higher position. ``reduce_line``: both sides flow toward
the root at once (the root receives from ``dec`` then ``inc``); ``bcast_line`` mirrors it.
A ring reduces as a line rotated so that its root sits in the middle
(``ceil((n - 1) / 2)`` steps on the longer side, ADR-0029).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["lrab_kernel", "hier3_kernel", "ring_kernel", "ring_chunks", "reduce_line",
           "bcast_line"]


def reduce_line(tl: Any, acc: Any, pos: int, n: int, root: int, dec: str, inc: str,
                shape: tuple[int, ...], dtype: str) -> Any:
    """Reduce along a line toward ``root``; the root's ``acc`` becomes the line's sum."""
    if pos < root:
        if pos > 0:
            acc = acc + tl.recv(dec, shape, dtype)
        tl.send(inc, acc)
    elif pos > root:
        if pos < n - 1:
            acc = acc + tl.recv(inc, shape, dtype)
        tl.send(dec, acc)
    else:
        if root > 0:
            acc = acc + tl.recv(dec, shape, dtype)
        if root < n - 1:
            acc = acc + tl.recv(inc, shape, dtype)
    return acc


def bcast_line(tl: Any, acc: Any, pos: int, n: int, root: int, dec: str, inc: str,
               shape: tuple[int, ...], dtype: str) -> Any:
    """Broadcast the root's ``acc`` outward along a line; everyone returns it."""
    if pos == root:
        if root > 0:
            tl.send(dec, acc)
        if root < n - 1:
            tl.send(inc, acc)
        return acc
    if pos < root:
        acc = tl.recv(inc, shape, dtype)
        if pos > 0:
            tl.send(dec, acc)
    else:
        acc = tl.recv(dec, shape, dtype)
        if pos < n - 1:
            tl.send(inc, acc)
    return acc


def _ring_pos(i: int, n: int) -> tuple[int, int]:
    """(position on the rotated line, root position) of ring member ``i``, root = member 0."""
    shift = (n - 1) // 2
    return (i + shift) % n, shift


def reduce_ring(tl: Any, acc: Any, i: int, n: int, dec: str, inc: str, shape: tuple[int, ...],
                dtype: str) -> Any:
    pos, root = _ring_pos(i, n)
    return reduce_line(tl, acc, pos, n, root, dec, inc, shape, dtype)


def bcast_ring(tl: Any, acc: Any, i: int, n: int, dec: str, inc: str, shape: tuple[int, ...],
               dtype: str) -> Any:
    pos, root = _ring_pos(i, n)
    return bcast_line(tl, acc, pos, n, root, dec, inc, shape, dtype)


def _ring_allreduce(tl: Any, acc: Any, n: int, out: str, inn: str, shape: tuple[int, ...],
                    dtype: str) -> Any:
    """n - 1 rounds: send what arrived last round on ``out``, add what arrives on ``inn``."""
    fwd = acc
    for _ in range(n - 1):
        tl.send(out, fwd)
        fwd = tl.recv(inn, shape, dtype)
        acc = acc + fwd
    return acc


def inter_sip(tl: Any, acc: Any, sip: int, g: Any, shape: tuple[int, ...], dtype: str) -> Any:
    """Phase 3: all-reduce among the SIPs over ``system.sips.topology`` (ADR-0032 D4)."""
    if g.n_sips < 2:
        return acc
    if g.sip_topology == "ring_1d":
        return _ring_allreduce(tl, acc, g.n_sips, "global_E", "global_W", shape, dtype)
    y, x = divmod(sip, g.sip_w)
    if g.sip_topology == "torus_2d":
        if g.sip_w > 1:
            acc = _ring_allreduce(tl, acc, g.sip_w, "global_E", "global_W", shape, dtype)
        if g.sip_h > 1:
            acc = _ring_allreduce(tl, acc, g.sip_h, "global_S", "global_N", shape, dtype)
        return acc
    # mesh_2d: per dimension a chain reduce to the middle and a broadcast back
    for pos, n, dec, inc in ((x, g.sip_w, "global_W", "global_E"),
                             (y, g.sip_h, "global_N", "global_S")):
        if n > 1:
            acc = reduce_line(tl, acc, pos, n, n // 2, dec, inc, shape, dtype)
            acc = bcast_line(tl, acc, pos, n, n // 2, dec, inc, shape, dtype)
    return acc


def _where(tl: Any, addrs: dict[tuple[int, int, int], int], g: Any
           ) -> tuple[int, int, int, int | None]:
    sip, cube, pe = tl.sip_id(), tl.cube_id(), tl.pe_id()
    return sip, cube, pe, addrs.get((sip, cube, pe))


def _pe_ring_around(tl: Any, addrs: dict[tuple[int, int, int], int], n: int, dtype: str,
                    g: Any, leaders: Callable[[Any, int, int, tuple[int, ...]], Any]) -> None:
    """The frame both hierarchical kernels share: load, reduce the cube's PEs into PE 0
    over the intra-cube ring, let ``leaders(acc, sip, cube, shape)`` reduce and broadcast
    among the PE 0s, broadcast back over the ring, store. A PE with no tensor sits out."""
    sip, cube, pe, addr = _where(tl, addrs, g)
    if addr is None:
        return
    shape = (n,)
    acc = tl.load(addr, shape, dtype)
    if g.pes > 1:
        acc = reduce_ring(tl, acc, pe, g.pes, "intra_W", "intra_E", shape, dtype)
    if pe == 0:
        acc = leaders(acc, sip, cube, shape)
    if g.pes > 1:
        acc = bcast_ring(tl, acc, pe, g.pes, "intra_W", "intra_E", shape, dtype)
    tl.store(addr, acc)


def lrab_kernel(tl: Any, addrs: dict[tuple[int, int, int], int], n: int, dtype: str,
                g: Any) -> None:
    """LRAB hierarchical all-reduce (ADR-0032), per PE lane; see the package docstring."""
    def leaders(acc: Any, sip: int, cube: int, shape: tuple[int, ...]) -> Any:
        y, x = divmod(cube, g.cube_w)
        rx, ry = g.root
        mesh = not g.single_cube
        if mesh:
            acc = reduce_line(tl, acc, x, g.cube_w, rx, "W", "E", shape, dtype)      # phase 1
            if x == rx:
                acc = reduce_line(tl, acc, y, g.cube_h, ry, "N", "S", shape, dtype)  # phase 2
        if not mesh or (x, y) == (rx, ry):
            acc = inter_sip(tl, acc, sip, g, shape, dtype)                           # phase 3
        if mesh:
            if x == rx:
                acc = bcast_line(tl, acc, y, g.cube_h, ry, "N", "S", shape, dtype)   # phase 4
            acc = bcast_line(tl, acc, x, g.cube_w, rx, "W", "E", shape, dtype)       # phase 5
        return acc
    _pe_ring_around(tl, addrs, n, dtype, g, leaders)


def hier3_kernel(tl: Any, addrs: dict[tuple[int, int, int], int], n: int, dtype: str,
                 g: Any) -> None:
    """3-level all-reduce (ADR-0029): PEs -> PE 0, cubes -> cube 0, SIPs; then back."""
    def leaders(acc: Any, sip: int, cube: int, shape: tuple[int, ...]) -> Any:
        ci, nc = g.cubes.index(cube), len(g.cubes)
        if nc > 1:
            acc = reduce_ring(tl, acc, ci, nc, "N", "S", shape, dtype)
        if ci == 0:
            acc = inter_sip(tl, acc, sip, g, shape, dtype)
        if nc > 1:
            acc = bcast_ring(tl, acc, ci, nc, "N", "S", shape, dtype)
        return acc
    _pe_ring_around(tl, addrs, n, dtype, g, leaders)


def ring_chunks(tl: Any, chunks: list[Any], r: int, out: str, inn: str, dtype: str) -> list[Any]:
    """The ring all-reduce of member ``r`` of a ring of ``len(chunks)`` members, in place on
    its equal-sized 1-D ``chunks``: reduce-scatter (p - 1 steps, each sends one chunk on
    ``out`` and adds the chunk received on ``inn``), then all-gather (p - 1 steps forwarding
    reduced chunks). Per member 2(p - 1) sends and receives and p - 1 adds; every member
    ends with every chunk summed over the ring. Returns ``chunks``."""
    p = len(chunks)
    shape = tuple(chunks[0].shape) if p else ()
    for s in range(p - 1):                                  # reduce-scatter
        tl.send(out, chunks[(r - s) % p])
        i = (r - s - 1) % p
        chunks[i] = chunks[i] + tl.recv(inn, shape, dtype)
    for s in range(p - 1):                                  # all-gather
        tl.send(out, chunks[(r + 1 - s) % p])
        chunks[(r - s) % p] = tl.recv(inn, shape, dtype)
    return chunks


def ring_kernel(tl: Any, addrs: dict[tuple[int, int, int], int], n: int, dtype: str,
                g: Any) -> None:
    """Flat ring all-reduce over every taking-part PE: reduce-scatter, then all-gather."""
    sip, cube, pe, addr = _where(tl, addrs, g)
    if addr is None:
        return
    members = g.members()
    p = len(members)
    if p == 1:
        return
    r = members.index((sip, cube, pe))
    c = n // p
    esz = tl.sizeof(dtype)
    chunks = [tl.load(addr + i * c * esz, (c,), dtype) for i in range(p)]
    ring_chunks(tl, chunks, r, "E", "W", dtype)
    for i in range(p):
        tl.store(addr + i * c * esz, chunks[i])

"""Pure tile-plan generators (ADR-0042): no SimPy, no state, same input -> same plan.

The PE scheduler turns every command into a :class:`Plan`: a tuple of tiles, each
a tuple of :class:`Stage` s run in order by token self-routing (ADR-0014 D6).
Stage kinds name the engine that runs them:

``DMA_READ``  (addr, nbytes)        external memory -> TCM through the fabric
``DMA_WRITE`` (addr, nbytes)        TCM -> external memory through the fabric
``FETCH``     (nbytes)              TCM -> register file (TCM read channel)
``STORE``     (nbytes)              register file -> TCM (TCM write channel)
``GEMM``      (tm, tn, tk)          MAC array
``MATH``      (elems, cycles/elem)  SIMD unit

GEMM plans loop M -> N -> K; pinned operands (already in TCM) have no
DMA_READ; the accumulator stays in the register file across K tiles, so STORE
and DMA_WRITE happen on the last K tile only; epilogue math fires every K
tile (``k_tile`` scope) or once per output tile (``output_tile`` scope, the
default). Math plans loop M -> N with DMA_READ -> FETCH -> MATH -> STORE ->
DMA_WRITE (the DMA stages only when the data lives outside TCM).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil
from typing import NamedTuple

__all__ = [
    "DMA_READ", "DMA_WRITE", "FETCH", "STORE", "GEMM", "MATH", "STAGE_NAMES",
    "Stage", "Plan", "Epilogue", "gemm_plan", "math_plan", "single_stage_plan",
]

DMA_READ, DMA_WRITE, FETCH, STORE, GEMM, MATH = range(6)
STAGE_NAMES = ("dma_read", "dma_write", "fetch", "store", "gemm", "math")


class Stage(NamedTuple):
    """One step of a tile. ``a``/``b``/``c`` are kind-specific integers (see module doc).

    A named tuple (immutable, hashable, cheap to build: plans are made per command)."""
    kind: int
    a: int = 0
    b: int = 0
    c: int = 0


@dataclass(frozen=True, slots=True)
class Epilogue:
    """A math op fused after a GEMM head: ``scope`` is ``k_tile`` or ``output_tile``."""
    cycles_per_elem: int
    scope: str = "output_tile"


Plan = tuple[tuple[Stage, ...], ...]


def gemm_plan(m: int, n: int, k: int, *, tile_m: int, tile_n: int, tile_k: int,
              in_bytes: int, out_bytes: int,
              a_addr: int | None, b_addr: int | None, c_addr: int | None,
              epilogue: tuple[Epilogue, ...] = ()) -> Plan:
    """Tiles of ``C[m, n] = A[m, k] @ B[k, n]``, loop order M -> N -> K.

    ``a_addr``/``b_addr`` None means the operand is pinned in TCM (no DMA_READ);
    ``c_addr`` None means the result stays in TCM (no DMA_WRITE). Addresses of
    a tile are row-major offsets of its first element.
    """
    mt, nt, kt = max(1, ceil(m / tile_m)), max(1, ceil(n / tile_n)), max(1, ceil(k / tile_k))
    k_epi = tuple(e for e in epilogue if e.scope == "k_tile")
    o_epi = tuple(e for e in epilogue if e.scope == "output_tile")
    tiles: list[tuple[Stage, ...]] = []
    for mi in range(mt):
        tm = min(tile_m, m - mi * tile_m) if m > 0 else 0
        for ni in range(nt):
            tn = min(tile_n, n - ni * tile_n) if n > 0 else 0
            for ki in range(kt):
                tk = min(tile_k, k - ki * tile_k) if k > 0 else 0
                st: list[Stage] = []
                if a_addr is not None:
                    st.append(Stage(DMA_READ, a_addr + (mi * tile_m * k + ki * tile_k) * in_bytes,
                                    tm * tk * in_bytes))
                if b_addr is not None:
                    st.append(Stage(DMA_READ, b_addr + (ki * tile_k * n + ni * tile_n) * in_bytes,
                                    tk * tn * in_bytes))
                st.append(Stage(FETCH, (tm * tk + tk * tn) * in_bytes))
                st.append(Stage(GEMM, tm, tn, tk))
                st.extend(Stage(MATH, tm * tn, e.cycles_per_elem) for e in k_epi)
                if ki == kt - 1:
                    st.extend(Stage(MATH, tm * tn, e.cycles_per_elem) for e in o_epi)
                    st.append(Stage(STORE, tm * tn * out_bytes))
                    if c_addr is not None:
                        st.append(Stage(DMA_WRITE, c_addr + (mi * tile_m * n + ni * tile_n) * out_bytes,
                                        tm * tn * out_bytes))
                tiles.append(tuple(st))
    return tuple(tiles)


def math_plan(m: int, n: int, *, tile_m: int, tile_n: int, n_inputs: int, in_bytes: int,
              out_bytes: int, cycles_per_elem: int, in_addrs: tuple[int | None, ...] = (),
              out_addr: int | None = None) -> Plan:
    """Tiles of an element-wise op over an ``m x n`` output, loop order M -> N.

    ``in_addrs[i]`` None (or missing) means input i is in TCM; ``out_addr`` None
    means the output stays in TCM.
    """
    mt, nt = max(1, ceil(m / tile_m)), max(1, ceil(n / tile_n))
    tiles: list[tuple[Stage, ...]] = []
    for mi in range(mt):
        tm = min(tile_m, m - mi * tile_m) if m > 0 else 0
        for ni in range(nt):
            tn = min(tile_n, n - ni * tile_n) if n > 0 else 0
            off = mi * tile_m * n + ni * tile_n
            st = [Stage(DMA_READ, a + off * in_bytes, tm * tn * in_bytes)
                  for a in in_addrs if a is not None]
            st.append(Stage(FETCH, n_inputs * tm * tn * in_bytes))
            st.append(Stage(MATH, tm * tn, cycles_per_elem))
            st.append(Stage(STORE, tm * tn * out_bytes))
            if out_addr is not None:
                st.append(Stage(DMA_WRITE, out_addr + off * out_bytes, tm * tn * out_bytes))
            tiles.append(tuple(st))
    return tuple(tiles)


def single_stage_plan(*stages: Stage) -> Plan:
    """A one-tile plan (plain load/store/fill/math commands)."""
    return (tuple(stages),)

"""One composite GEMM ``C = A @ B`` on one PE with a chosen operand staging (ADR-0044).

``variant`` picks how the operands reach the GEMM pipeline: ``ref_ref`` streams A and B
tiles from HBM by DMA as the tile plan needs them (``tl.ref``); ``load_ref`` first loads A
whole into TCM (a pinned operand, one DMA) and streams B; ``load_load`` pins both. The
plan is the M -> N -> K tile pipeline of ``pe.tile`` (32 x 64 x 32 by default): DMA in,
fetch, GEMM, and a store + DMA out per output tile. Ops: 1 composite + 1 wait (+1 load per
pinned operand). Output: ``A @ B`` in ``dtype`` (accumulated in f32).
"""

import numpy as np

PARAMS = {"M": 64, "N": 64, "K": 64, "variant": "load_ref", "dtype": "f16", "seed": 0}
VARIANTS = ("ref_ref", "load_ref", "load_load")


def staged_gemm_kernel(tl, a_ptr, b_ptr, c_ptr, M, N, K, dtype, variant):
    stage_a = tl.load if variant.startswith("load") else tl.ref
    stage_b = tl.load if variant.endswith("load") else tl.ref
    a = stage_a(a_ptr, (M, K), dtype)
    b = stage_b(b_ptr, (K, N), dtype)
    h = tl.composite(op="gemm", a=a, b=b, out_ptr=c_ptr)
    tl.wait(h)


def build(w, p):
    if p.variant not in VARIANTS:
        raise ValueError(f"variant={p.variant!r}: use one of {', '.join(VARIANTS)}")
    for dim in ("M", "N", "K"):
        if getattr(p, dim) < 1:
            raise ValueError(f"{dim}={getattr(p, dim)} must be >= 1")
    a = w.tensor("a", (p.M, p.K), p.dtype, init=w.random(p.seed))
    b = w.tensor("b", (p.K, p.N), p.dtype, init=w.random(p.seed + 1))
    c = w.tensor("c", (p.M, p.N), p.dtype)
    w.launch(staged_gemm_kernel, grid=(1, 1),
             args=(a, b, c, p.M, p.N, p.K, p.dtype, p.variant))
    w.output(c, reference=lambda v: v["a"].astype(np.float64) @ v["b"].astype(np.float64))

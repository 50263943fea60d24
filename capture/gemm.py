"""Tiled GEMM ``C = A @ B`` with tl.load / tl.dot / tl.store over every PE of every cube.

Output tiles (BM x BN) are dealt round-robin to the programs of the grid
(program ``pid = pid1 * num_programs(0) + pid0``). Per tile: one ``tl.zeros``
accumulator, per K tile two loads (A and B tiles, strided views of the
row-major matrices) and one dot, then one store (plus one cast if dtype is not
f32). Op counts, with MT = M/BM, NT = N/BN, KT = K/BK:

    load = 2*MT*NT*KT   dot = MT*NT*KT   fill = MT*NT   store = MT*NT   (math = MT*NT if dtype != f32)

Defaults (M=N=256, K=128, 32/64/32 tiles): 256 loads, 128 dots, 64 fills, 64 stores = 512 ops;
M=N=K=128: 64 loads, 32 dots, 16 fills, 16 stores = 128 ops.
"""

import numpy as np

PARAMS = {"M": 256, "N": 256, "K": 128, "BM": 32, "BK": 64, "BN": 32, "dtype": "f32",
          "seed": 0, "cubes": 0}


def gemm_kernel(tl, a_ptr, b_ptr, c_ptr, M, N, K, BM, BK, BN, dtype):
    esz = tl.sizeof(dtype)
    nprog = tl.num_programs(0) * tl.num_programs(1)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    mt, nt = tl.cdiv(M, BM), tl.cdiv(N, BN)
    for t in range(pid, mt * nt, nprog):
        m0, n0 = (t // nt) * BM, (t % nt) * BN
        acc = tl.zeros((BM, BN), "f32" if dtype != "i32" else "i32")
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + (m0 * K + k0) * esz, (BM, BK), dtype, strides=(K, 1))
            b = tl.load(b_ptr + (k0 * N + n0) * esz, (BK, BN), dtype, strides=(N, 1))
            acc = tl.dot(a, b, acc)
        out = acc if acc.dtype == dtype else acc.to(dtype)
        tl.store(c_ptr + (m0 * N + n0) * esz, out, strides=(N, 1))


def build(w, p):
    for dim, tile in (("M", "BM"), ("N", "BN"), ("K", "BK")):
        if getattr(p, dim) % getattr(p, tile):
            raise ValueError(f"{dim}={getattr(p, dim)} must be a multiple of {tile}={getattr(p, tile)}")
    a = w.tensor("a", (p.M, p.K), p.dtype, init=w.random(p.seed))
    b = w.tensor("b", (p.K, p.N), p.dtype, init=w.random(p.seed + 1))
    c = w.tensor("c", (p.M, p.N), p.dtype)
    w.launch(gemm_kernel, grid=w.grid(p.cubes or None),
             args=(a, b, c, p.M, p.N, p.K, p.BM, p.BK, p.BN, p.dtype))
    w.output(c, reference=reference)


def reference(v, block=4096):
    """``A @ B`` in float64, K ``block`` columns at a time: float64 copies of whole operands
    took 3.3 GB at K = 52,032 (a 10 M-op capture), more than the kernel phase itself.
    Integer blocks whose every partial sum is exact in float32 (``block * max|a| * max|b|
    < 2**24``) multiply in float32: the same values, in half the time (0.43-0.51 against
    0.84-0.94 CPU s at the 1.0 M-op gemm of ``benchmarks/bench_e2e.py``)."""
    a, b = v["a"], v["b"]
    f = np.float64
    if a.dtype.kind in "iu" and a.size and b.size:
        am = max(-int(a.min()), int(a.max()))
        bm = max(-int(b.min()), int(b.max()))
        if am * bm * min(block, a.shape[1]) < 1 << 24:
            f = np.float32
    out = (a[:, :block].astype(f) @ b[:block].astype(f)).astype(np.float64, copy=False)
    for k0 in range(block, a.shape[1], block):
        out += a[:, k0:k0 + block].astype(f) @ b[k0:k0 + block].astype(f)
    return out

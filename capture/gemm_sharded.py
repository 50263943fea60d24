"""Tiled GEMM ``C = A @ B`` with the data placed where it is used: the gemm of ``gemm.py``
with A and C split by rows over the cubes and B copied to every cube.

``gemm.py`` keeps A, B and C on PE0's HBM slice, so every PE of every cube streams from one
slice (and across UCIe); here cube ``c`` holds rows ``[c*M/C, (c+1)*M/C)`` of A and C and a
copy of B on the HBM slice of its PE ``shard_pe``, and its PEs compute only those rows. Compare
the two on a multi-cube topology: the hot spot, the UCIe traffic and the roofline attainment
change with nothing but placement::

    kbtrace run gemm -t default -p M=1024 -p N=1024
    kbtrace run gemm_sharded -t default -p M=1024 -p N=1024

Ops, with C cubes and MT = M/(C*BM), NT = N/BN, KT = K/BK output tiles per cube: per cube
``load = 2*MT*NT*KT``, ``dot = MT*NT*KT``, ``fill = MT*NT``, ``store = MT*NT`` (+ ``math =
MT*NT`` casts when dtype is not f32), as in ``gemm.py``. M must split into whole BM-row tiles
per cube. Defaults (M=N=256, K=128, 32/64/32 tiles) on small.yaml (4 cubes): 512 ops.
"""

import numpy as np

PARAMS = {"M": 256, "N": 256, "K": 128, "BM": 32, "BK": 64, "BN": 32, "dtype": "f32",
          "seed": 0, "shard_pe": 0}


def gemm_sharded_kernel(tl, a_shards, b_shards, c_shards, M, N, K, BM, BK, BN, dtype):
    esz = tl.sizeof(dtype)
    cube, pe, npe = tl.program_id(1), tl.program_id(0), tl.num_programs(0)
    a_ptr, b_ptr, c_ptr = a_shards[cube], b_shards[cube], c_shards[cube]
    rows = M // tl.num_programs(1)                       # rows of A and C on this cube
    mt, nt = tl.cdiv(rows, BM), tl.cdiv(N, BN)
    for t in range(pe, mt * nt, npe):
        m0, n0 = (t // nt) * BM, (t % nt) * BN
        acc = tl.zeros((BM, BN), "f32" if dtype != "i32" else "i32")
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + (m0 * K + k0) * esz, (BM, BK), dtype, strides=(K, 1))
            b = tl.load(b_ptr + (k0 * N + n0) * esz, (BK, BN), dtype, strides=(N, 1))
            acc = tl.dot(a, b, acc)
        out = acc if acc.dtype == dtype else acc.to(dtype)
        tl.store(c_ptr + (m0 * N + n0) * esz, out, strides=(N, 1))


def build(w, p):
    for name in ("M", "N", "K", "BM", "BN", "BK"):
        if getattr(p, name) < 1:
            raise ValueError(f"{name}={getattr(p, name)} must be >= 1")
    cubes = w.topo.n_sips * w.topo.cubes_per_sip
    if p.M % (cubes * p.BM):
        raise ValueError(f"M={p.M} must split into whole BM={p.BM}-row tiles over {cubes} cubes: "
                         f"pass a multiple of {cubes * p.BM}")
    for dim, tile in (("N", "BN"), ("K", "BK")):
        if getattr(p, dim) % getattr(p, tile):
            raise ValueError(f"{dim}={getattr(p, dim)} must be a multiple of {tile}={getattr(p, tile)}")
    rng = w.random(p.seed)
    a = w.tensor("a", (p.M, p.K), p.dtype, init=rng, shard="cubes", shard_pe=p.shard_pe)
    b_one = w.random(p.seed + 1).draw((p.K, p.N), p.dtype)
    b = w.tensor("b", (cubes, p.K, p.N), p.dtype, init=np.broadcast_to(b_one, (cubes, p.K, p.N)),
                 shard="cubes", shard_pe=p.shard_pe)        # a copy of B on every cube
    c = w.tensor("c", (p.M, p.N), p.dtype, shard="cubes", shard_pe=p.shard_pe)
    shards = [[t.shard_addr(i) for i in range(cubes)] for t in (a, b, c)]
    w.launch(gemm_sharded_kernel, args=(*shards, p.M, p.N, p.K, p.BM, p.BK, p.BN, p.dtype))
    w.output(c, reference=lambda v: v["a"].astype(np.float64) @ v["b"][0].astype(np.float64))

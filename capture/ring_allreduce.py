"""Ring all-reduce over the 8 PEs of one cube via intra_E / intra_W IPCQ.

Each PE holds a vector of N elements (row i of ``x``, sharded over the PEs of cube
0) split into P chunks. Reduce-scatter: P-1 steps, each sends one chunk east and
adds the chunk received from the west; all-gather: P-1 steps forwarding reduced
chunks. Every PE ends with the sum over PEs (stored in place). Per PE: P loads,
2(P-1) sends, 2(P-1) recvs, P-1 adds, P stores.
"""

import numpy as np

from kbtrace.capture import ring
from kbtrace.collectives.kernels import ring_chunks

PARAMS = {"N": 1024, "P": 8, "dtype": "f32", "seed": 0}


def allreduce_kernel(tl, x_ptr, N, dtype):
    p = tl.num_programs(0)
    r = tl.program_id(0)
    c = N // p
    esz = tl.sizeof(dtype)
    chunks = [tl.load(x_ptr + i * c * esz, (c,), dtype) for i in range(p)]
    ring_chunks(tl, chunks, r, "intra_E", "intra_W", dtype)
    for i in range(p):
        tl.store(x_ptr + i * c * esz, chunks[i])


def build(w, p):
    if p.P < 1:
        raise ValueError(f"P={p.P} must be >= 1 (the PEs in the ring)")
    if w.topo.pes_per_cube < p.P:
        raise ValueError(f"P={p.P} PEs but a cube of {w.topo.params.name!r} has "
                         f"{w.topo.pes_per_cube}; pass -p P={w.topo.pes_per_cube} or less")
    if p.N % p.P:
        raise ValueError(f"N={p.N} is not a multiple of P={p.P}; pass an N that is")
    x = w.tensor("x", (w.topo.pes_per_cube, p.N), p.dtype, init=w.random(p.seed), shard="pes")
    w.launch(allreduce_kernel, grid=(p.P, 1), args=(x, p.N, p.dtype), neighbors=ring(p.P))

    def ref(v):
        out = v["x"].copy()
        out[:p.P] = v["x"][:p.P].astype(np.float64).sum(axis=0)
        return out
    w.output(x, reference=ref)

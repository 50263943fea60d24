"""All-gather over every PE of the system by DMA reads.

Each of the P PEs owns one block of R x N elements of ``x`` on its own HBM slice (``x`` is
sharded over all PEs) and gathers the blocks into its own copy of the whole tensor (``y``,
P blocks per PE, also on its own slice): it loads block ``(me + s) % P`` from its owner's
slice into TCM and stores it into its copy, for ``s = 0 .. G-1``, starting with its own.

Unlike ``ring_allreduce.py`` (IPCQ between neighbours of one cube) every PE reads from
every other PE's slice, so the traffic is all pairs: every router mesh, every UCIe seam and,
on a two-SIP topology, the PCIe path between the SIPs carry it, and every pair of PEs is a
route of its own (65,280 on default.yaml). ``G`` (``peers``; 0 = all P) bounds the blocks
each PE gathers, which scales the trace without changing its shape.

Ops: ``P * G`` loads and ``P * G`` stores (no compute). Defaults (R=8, N=64 f32 = 2 KiB
blocks) on small.yaml (32 PEs): 2,048 ops; on default.yaml (256 PEs): 131,072 ops.
"""

import numpy as np

PARAMS = {"R": 8, "N": 64, "peers": 0, "dtype": "f32", "seed": 0}


def all_gather_kernel(tl, x_blocks, y_ptr, R, N, G, dtype):
    me = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    P = len(x_blocks)
    block = R * N * tl.sizeof(dtype)
    for s in range(G):
        src = (me + s) % P
        v = tl.load(x_blocks[src], (R, N), dtype)
        tl.store(y_ptr + src * block, v)


def build(w, p):
    for name in ("R", "N"):
        if getattr(p, name) < 1:
            raise ValueError(f"{name}={getattr(p, name)} must be >= 1")
    P = w.topo.n_sips * w.topo.cubes_per_sip * w.topo.pes_per_cube
    if not 0 <= p.peers <= P:
        raise ValueError(f"peers={p.peers} must be between 0 (all) and the {P} PEs of "
                         f"{w.topo.params.name!r}")
    G = p.peers or P
    x = w.tensor("x", (P, p.R, p.N), p.dtype, init=w.random(p.seed), shard="all")
    y = w.tensor("y", (P, P, p.R, p.N), p.dtype, shard="all")     # y[i]: PE i's copy of x
    w.launch(all_gather_kernel, args=([x.shard_addr(i) for i in range(P)], y, p.R, p.N, G,
                                      p.dtype))

    def ref(v):
        x = v["x"]
        out = np.zeros((P, *x.shape), x.dtype)
        me = np.arange(P)
        for s in range(G):                 # block (me + s) % P of x into PE me's copy
            out[me, (me + s) % P] = x[(me + s) % P]
        return out
    w.output(y, reference=ref)

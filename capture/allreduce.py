"""All-reduce across PEs, cubes and SIPs with the collectives package (LRAB, 3-level, ring).

Every taking-part PE holds one shard of ``x`` (``n_elem`` elements); after the collective
every shard holds the elementwise sum of all shards. ``pes``: PE lanes per cube taking
part (1: PE 0 of each cube, the reference's per-cube layout; or every PE of the cube);
``cubes``: 0 = every cube of each SIP, 1 = cube 0 only (LRAB's single-cube fast path).
``init``: ``rank`` fills shard r (in (SIP, cube, PE) order) with r + 1, exact in f16
(2 SIPs x 2 cubes x 4 PEs -> every PE holds sum(1..16) = 136); ``random``: seeded values.

The SIP fabric is the topology's (``--set system.sips.count=6 --set
system.sips.topology=torus_2d --set system.sips.w=3 --set system.sips.h=2``).
``buffer_kind`` / ``n_slots`` / ``slot_bytes`` (0 = the topology's) set the collective's
IPCQ buffers. Ops per taking-part PE: lrab / hier3 one load, one store and one add per
message received; ring ``P`` loads and stores and ``2 (P - 1)`` sends and receives.
"""

import numpy as np

PARAMS = {"algorithm": "lrab", "root": "centre", "n_elem": 4096, "dtype": "f16",
          "buffer_kind": "", "n_slots": 0, "slot_bytes": 0, "pes": 1, "cubes": 0,
          "init": "rank", "seed": 0}


def build(w, p):
    topo = w.topo
    if p.n_elem < 1:
        raise ValueError(f"n_elem={p.n_elem} must be >= 1")
    if p.pes not in (1, topo.pes_per_cube):
        raise ValueError(f"pes={p.pes}: use 1 (PE 0 of each cube) or {topo.pes_per_cube} "
                         f"(every PE of {topo.params.name!r})")
    if p.cubes not in (0, 1):
        raise ValueError(f"cubes={p.cubes}: use 0 (every cube) or 1 (cube 0 of each SIP)")
    if p.init not in ("rank", "random"):
        raise ValueError(f"init={p.init!r}: use 'rank' or 'random'")
    n_cubes = 1 if p.cubes else topo.cubes_per_sip
    ranks = topo.n_sips * n_cubes * p.pes
    if p.cubes == 0:              # one tensor, a row per taking-part PE
        init = w.random(p.seed) if p.init == "random" else np.repeat(
            np.arange(1, ranks + 1, dtype=np.float32)[:, None], p.n_elem, axis=1)
        tensors = [w.tensor("x", (ranks, p.n_elem), p.dtype, init,
                            shard="all" if p.pes > 1 else "cubes")]
    else:                         # one tensor per taking-part PE of cube 0 of each SIP
        tensors = []
        for s in range(topo.n_sips):
            for e in range(p.pes):
                r = s * p.pes + e
                init = w.random(p.seed + r) if p.init == "random" else \
                    np.full((p.n_elem,), r + 1, np.float32)
                tensors.append(w.tensor(f"x{r}", (p.n_elem,), p.dtype, init, pe=(s, 0, e)))
    w.all_reduce(tensors if len(tensors) > 1 else tensors[0], op="sum", algorithm=p.algorithm,
                 root=p.root, buffer_kind=p.buffer_kind or None, n_slots=p.n_slots or None,
                 slot_bytes=p.slot_bytes or None)

    for t in tensors:
        def ref(v, t=t, names=tuple(u.name for u in tensors)):
            total = sum(v[n].astype(np.float64).reshape(-1, p.n_elem).sum(axis=0) for n in names)
            return np.broadcast_to(total, t.shape).copy()
        w.output(t, reference=ref)

"""One PE sends ``nbytes`` to another: by IPCQ (send / recv) or by raw DMA (a remote store).

``hop`` places the pair on the topology (commitlog §12, the PE-to-PE latency experiment):
``intra_h`` PE 0 -> PE 2 of cube 0 (same router row, opposite mesh edge), ``intra_v`` PE 0
-> PE 1 (the next router row down), ``inter_h`` cube 0 -> its east neighbour cube, PE 0
each, ``inter_v`` cube 0 -> its south neighbour. ``mode=ipcq``: the sender loads its block
and ``tl.send``s it, the receiver ``tl.recv``s it into TCM and stores it to its own slice;
``mode=dma``: the sender loads its block and ``tl.store``s it straight into the receiver's
HBM slice (one-sided). Output ``y`` (on the receiver's slice) equals ``x``.
"""

import numpy as np

PARAMS = {"hop": "intra_h", "mode": "ipcq", "nbytes": 1024, "seed": 0}
HOPS = ("intra_h", "intra_v", "inter_h", "inter_v")
MODES = ("ipcq", "dma")


def pe2pe_kernel(tl, x_ptr, y_ptr, n, mode, src, dst, d_out, d_in):
    me = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    if me == src:
        x = tl.load(x_ptr, (n,), "f32")
        if mode == "ipcq":
            tl.send(d_out, x)
        else:
            tl.store(y_ptr, x)
    elif me == dst and mode == "ipcq":
        got = tl.recv(d_in, (n,), "f32")
        tl.store(y_ptr, got)


def placement(topo, hop):
    """(grid, src program, dst program, (sip, cube, pe) of src and dst, out dir, in dir)."""
    w = topo.params.sip.cube_mesh_w
    if hop == "intra_h":
        return (3, 1), 0, 2, (0, 0, 0), (0, 0, 2), "intra_E", "intra_W"
    if hop == "intra_v":
        return (2, 1), 0, 1, (0, 0, 0), (0, 0, 1), "intra_S", "intra_N"
    if hop == "inter_h":
        return (1, 2), 0, 1, (0, 0, 0), (0, 1, 0), "E", "W"
    return (1, w + 1), 0, w, (0, 0, 0), (0, w, 0), "S", "N"


def build(w, p):
    if p.hop not in HOPS:
        raise ValueError(f"hop={p.hop!r}: use one of {', '.join(HOPS)}")
    if p.mode not in MODES:
        raise ValueError(f"mode={p.mode!r}: use one of {', '.join(MODES)}")
    if p.nbytes < 4 or p.nbytes % 4:
        raise ValueError(f"nbytes={p.nbytes}: use a positive multiple of 4")
    topo = w.topo
    if p.hop.startswith("intra") and topo.pes_per_cube < 3:
        raise ValueError(f"hop={p.hop} needs 3 PEs per cube; {topo.params.name!r} has "
                         f"{topo.pes_per_cube}")
    if p.hop == "inter_h" and topo.params.sip.cube_mesh_w < 2 or \
            p.hop == "inter_v" and topo.params.sip.cube_mesh_h < 2:
        raise ValueError(f"hop={p.hop} needs a neighbour cube on {topo.params.name!r}")
    grid, src, dst, at_src, at_dst, d_out, d_in = placement(topo, p.hop)
    n = p.nbytes // 4
    x = w.tensor("x", (n,), "f32", init=w.random(p.seed), pe=at_src)
    y = w.tensor("y", (n,), "f32", pe=at_dst)
    w.launch(pe2pe_kernel, grid=grid, args=(x, y, n, p.mode, src, dst, d_out, d_in),
             neighbors={src: {d_out: dst}, dst: {d_in: src}})
    w.output(y, reference=lambda v: v["x"].astype(np.float64))

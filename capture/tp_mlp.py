"""Tensor-parallel 2-layer MLP (ADR-0027 D7): ``y = (x @ W1) @ W2`` over a TP group of SIPs.

The reference sample's sizes: batch B=1, 512 -> 2048 -> 512. ``tp`` SIPs (0, the default,
means every SIP of the topology, as the reference's TP = world size: 2 on default.yaml,
1 on small.yaml; ``-p tp=4`` needs ``--set system.sips.count=4``) each hold
their column block of W1 (ColumnParallelLinear) and row block of W2 (RowParallelLinear),
spread over the PEs of ``cubes`` cubes per SIP. The host copies x to every rank (one
``h2d`` per rank and cube), the layers run as launches (a GEMM each, then a ring
all-reduce of W2's partial sums over the SIPs), and rank 0's result comes back to the
host (``d2h``), where it is checked against numpy.

Values are small integers (x, W in [-2, 2]) so every dtype computes them exactly up to its
final rounding: the reference rounds the hidden layer and the output to ``dtype`` as the
device does (f16 / bf16 GEMMs accumulate in f32; the all-reduce sums f32 partials).
"""

import numpy as np

from kbtrace.host import DPPolicy, tp
from kbtrace.host.tp import RankTensor

PARAMS = {"B": 1, "D_in": 512, "D_hidden": 2048, "D_out": 512, "tp": 0, "cubes": 1,
          "dtype": "f32", "seed": 0}


def _ints(seed, shape):
    return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float32)


def build(w, p):
    for name in ("B", "D_in", "D_hidden", "D_out", "cubes"):
        if getattr(p, name) < 1:
            raise ValueError(f"{name}={getattr(p, name)} must be >= 1")
    if p.tp < 0:
        raise ValueError(f"tp={p.tp} must be >= 1 (or 0: every SIP)")
    group = tp.initialize_model_parallel(w, p.tp or None)
    fc1 = tp.ColumnParallelLinear(w, group, p.D_in, p.D_hidden, p.dtype,
                                  weight=_ints(p.seed + 1, (p.D_in, p.D_hidden)), name="fc1",
                                  cubes=p.cubes)
    fc2 = tp.RowParallelLinear(w, group, p.D_hidden, p.D_out, p.dtype,
                               weight=_ints(p.seed + 2, (p.D_hidden, p.D_out)), name="fc2",
                               cubes=p.cubes)
    x_host = w.host_tensor("x", (p.B, p.D_in), p.dtype, init=_ints(p.seed, (p.B, p.D_in)))
    x = RankTensor(group)
    for sip in group.ranks:          # the input, replicated on every rank (a copy per cube)
        x.tensors[sip] = w.tensor(f"x.r{sip}", (p.B, p.D_in), p.dtype, sip=sip,
                                  dp=DPPolicy(cube="replicate", pe="replicate",
                                              num_cubes=p.cubes, num_pes=1))
        w.copy_to_device(x_host, x[sip])
    h = tp.copy_to_tp_region(x)
    h = fc1(h)                       # (B, D_hidden / tp) per rank, column-sharded
    y = fc2(h)                       # (B, D_out) on every rank, all-reduced
    y_host = w.copy_to_host(y[group.ranks[0]], w.host_tensor("y", (p.B, p.D_out), p.dtype))

    def reference(v):
        from kbtrace.capture.dtypes import to_compute, to_storage

        def rnd(a):
            return to_compute(to_storage(a, p.dtype), p.dtype).astype(np.float64)
        hid = rnd(v["x"].astype(np.float64) @ fc1.full_weight(v).astype(np.float64))
        return hid @ fc2.full_weight(v).astype(np.float64)
    w.output(y_host, reference=reference)

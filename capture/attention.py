"""Flash attention forward, one head: ``O = softmax(Q K^T / sqrt(D)) V`` with the online softmax.

Query blocks (BQ rows) are dealt round-robin to the programs of the grid. Per query block:
load Q, fill the accumulator, the running max ``m`` and the running sum ``l``; per key
block, load K transposed (a strided DMA, no explicit transpose) and V, then

    s = dot(q, kT) * scale          m_new = maximum(m, max(s, axis=1))
    p = exp(s - m_new)              alpha = exp(m - m_new)
    l = l * alpha + sum(p, axis=1)  acc = dot(p, v, acc * alpha)      m = m_new

and finally store ``acc / l``. Ops, with QT = S/BQ and KT = S/BK (f32):

    load = QT*(1 + 2*KT)   fill = 3*QT   dot = 2*QT*KT   math = QT*(11*KT + 1)   store = QT

(bf16 / f16 add one cast of p per key block and one of the output per query block).
Defaults (S=256, D=64, 32 x 32 blocks): 136 loads, 24 fills, 128 dots, 712 math, 8 stores
= 1,008 ops.
"""

import numpy as np

PARAMS = {"S": 256, "D": 64, "BQ": 32, "BK": 32, "dtype": "f32", "seed": 0}


def attention_kernel(tl, q_ptr, k_ptr, v_ptr, o_ptr, S, D, BQ, BK, dtype):
    esz = tl.sizeof(dtype)
    nprog = tl.num_programs(0) * tl.num_programs(1)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    scale = 1.0 / float(D) ** 0.5
    for qb in range(pid, tl.cdiv(S, BQ), nprog):
        q = tl.load(q_ptr + qb * BQ * D * esz, (BQ, D), dtype)
        acc = tl.zeros((BQ, D), "f32")
        m = tl.full((BQ, 1), -1e30, "f32")
        l = tl.zeros((BQ, 1), "f32")  # noqa: E741 - the paper's name
        for k0 in range(0, S, BK):
            kt = tl.load(k_ptr + k0 * D * esz, (D, BK), dtype, strides=(1, D))
            v = tl.load(v_ptr + k0 * D * esz, (BK, D), dtype)
            s = tl.dot(q, kt) * scale
            m_new = tl.maximum(m, tl.max(s, axis=1))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m - m_new)
            l = l * alpha + tl.sum(p, axis=1)  # noqa: E741
            acc = tl.dot(p if dtype == "f32" else p.to(dtype), v, acc * alpha)
            m = m_new
        out = acc / l
        tl.store(o_ptr + qb * BQ * D * esz, out if dtype == "f32" else out.to(dtype))


def _ref(v):
    q, k, vv = (v[n].astype(np.float64) for n in ("q", "k", "v"))
    s = q @ k.T / np.sqrt(q.shape[1])
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)) @ vv


def build(w, p):
    for dim, tile in (("S", "BQ"), ("S", "BK")):
        if getattr(p, dim) % getattr(p, tile):
            raise ValueError(f"{dim}={getattr(p, dim)} must be a multiple of {tile}={getattr(p, tile)}")
    q = w.tensor("q", (p.S, p.D), p.dtype, init=w.random(p.seed))
    k = w.tensor("k", (p.S, p.D), p.dtype, init=w.random(p.seed + 1))
    v = w.tensor("v", (p.S, p.D), p.dtype, init=w.random(p.seed + 2))
    o = w.tensor("o", (p.S, p.D), p.dtype)
    w.launch(attention_kernel, args=(q, k, v, o, p.S, p.D, p.BQ, p.BK, p.dtype))
    w.output(o, reference=_ref)

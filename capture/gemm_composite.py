"""GEMM as one tl.composite per row block, with a fused bias + relu epilogue.

Program ``pid`` takes row blocks ``pid, pid + nprog, ...`` of BM rows: ``A`` rows
and all of ``B`` are referenced (streamed per tile by the PE scheduler) or, with
``pin_a=true``, A's block is loaded into TCM first (a pinned operand). Ops per
block: 1 composite + 1 wait (+1 load when pinned): default 8 blocks -> 16 ops.
Output: ``relu(A @ B + bias)``.
"""

import numpy as np

PARAMS = {"M": 256, "N": 128, "K": 128, "BM": 32, "dtype": "f32", "seed": 0, "pin_a": False}


def composite_kernel(tl, a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, BM, dtype, pin_a):
    esz = tl.sizeof(dtype)
    nprog = tl.num_programs(0) * tl.num_programs(1)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    b = tl.ref(b_ptr, (K, N), dtype)
    bias = tl.ref(bias_ptr, (N,), dtype)
    for blk in range(pid, tl.cdiv(M, BM), nprog):
        m0 = blk * BM
        if pin_a:
            a = tl.load(a_ptr + m0 * K * esz, (BM, K), dtype)
        else:
            a = tl.ref(a_ptr + m0 * K * esz, (BM, K), dtype)
        h = tl.composite(op="gemm", a=a, b=b, out_ptr=c_ptr + m0 * N * esz,
                         epilogue=[{"op": "bias", "bias": bias}, {"op": "relu"}])
        tl.wait(h)


def build(w, p):
    a = w.tensor("a", (p.M, p.K), p.dtype, init=w.random(p.seed))
    b = w.tensor("b", (p.K, p.N), p.dtype, init=w.random(p.seed + 1))
    bias = w.tensor("bias", (p.N,), p.dtype, init=w.random(p.seed + 2))
    c = w.tensor("c", (p.M, p.N), p.dtype)
    w.launch(composite_kernel, args=(a, b, bias, c, p.M, p.N, p.K, p.BM, p.dtype, p.pin_a))
    w.output(c, reference=lambda v: np.maximum(
        v["a"].astype(np.float64) @ v["b"].astype(np.float64) + v["bias"], 0.0))

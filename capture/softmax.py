"""Row-wise softmax: blocks of BR rows are loaded, softmaxed along axis 1 and stored.

Ops per block: load + softmax + store; default R=256, BR=8 -> 32 blocks -> 96 ops.
"""

import numpy as np

PARAMS = {"R": 256, "C": 64, "BR": 8, "dtype": "f32", "seed": 0}


def softmax_kernel(tl, x_ptr, y_ptr, R, C, BR, dtype):
    esz = tl.sizeof(dtype)
    nprog = tl.num_programs(0) * tl.num_programs(1)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    for blk in range(pid, tl.cdiv(R, BR), nprog):
        off = blk * BR * C * esz
        x = tl.load(x_ptr + off, (BR, C), dtype)
        tl.store(y_ptr + off, tl.softmax(x, axis=1))


def _ref(v):
    x = v["x"].astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def build(w, p):
    x = w.tensor("x", (p.R, p.C), p.dtype, init=w.random(p.seed, low=-4.0, high=4.0))
    y = w.tensor("y", (p.R, p.C), p.dtype)
    w.launch(softmax_kernel, args=(x, y, p.R, p.C, p.BR, p.dtype))
    w.output(y, reference=_ref)

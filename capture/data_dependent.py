"""A kernel that branches on values it loaded: per row, exp(x) if flag > 0 else 2*x.

The flags are loaded (real values during capture), so the op stream depends on
the data: a different ``flag_seed`` gives a different sequence of math ops.
Rows whose flag is exactly 0 are additionally clamped to [-0.5, 0.5] after
doubling (a third path). Per row: 1 load + 1 or 2 math + 1 store; plus one flag
load per block.
"""

import numpy as np

PARAMS = {"R": 64, "C": 32, "BR": 8, "dtype": "f32", "seed": 0, "flag_seed": 1}


def branchy_kernel(tl, x_ptr, f_ptr, y_ptr, R, C, BR, dtype):
    esz = tl.sizeof(dtype)
    nprog = tl.num_programs(0) * tl.num_programs(1)
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    for blk in range(pid, tl.cdiv(R, BR), nprog):
        flags = tl.load(f_ptr + blk * BR * 4, (BR,), "i32")
        for i in range(BR):
            row = blk * BR + i
            x = tl.load(x_ptr + row * C * esz, (C,), dtype)
            if flags[i] > 0:                    # real loaded value: fine to branch on
                y = tl.exp(x)
            else:
                y = x * 2.0
                if int(flags[i]) == 0:
                    y = tl.clamp(y, -0.5, 0.5)
            tl.store(y_ptr + row * C * esz, y)


def _ref(v):
    x, f = v["x"].astype(np.float64), v["flags"][:, None]
    two = 2.0 * x
    return np.where(f > 0, np.exp(x), np.where(f == 0, np.clip(two, -0.5, 0.5), two))


def build(w, p):
    x = w.tensor("x", (p.R, p.C), p.dtype, init=w.random(p.seed))
    flags = w.tensor("flags", (p.R,), "i32", init=w.random(p.flag_seed, low=-1, high=1))
    y = w.tensor("y", (p.R, p.C), p.dtype)
    w.launch(branchy_kernel, args=(x, flags, y, p.R, p.C, p.BR, p.dtype))
    w.output(y, reference=_ref)

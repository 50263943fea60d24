"""The batched drain (capture/_drain.py) gives every op the digest sequential execution gives.

Integer dots are deferred and their products computed in stacks; these kernels mix every
hazard the deferral must respect (accumulator chains, a pending result read as another
dot's operand, stored, overwritten by a fill, read by a math op, scratch reuse once the
scratch is full, products too large for float32 or float64) and compare each op's
``out_digest`` with the executor's sequential re-run (``Trace.execute``: one op at a time,
in capture order) and the outputs with numpy.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from kbtrace.capture import capture
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


def _kernel(tl, x, w8, out, n_rep, dt):
    a = tl.load(x, (8, 8), dt)
    b = tl.load(x + 64 * tl.sizeof(dt), (8, 8), dt)
    acc = tl.zeros((8, 8), "i32")
    for _ in range(n_rep):                      # a chain, then a chain over pending results
        acc = tl.dot(a, b, acc)
    c = tl.dot(a, b)                            # no accumulator
    d = tl.dot(c, acc)                          # both operands pending (exact chain reads)
    e = tl.dot(d, c, d)                         # the accumulator is an operand too
    tl.store(out, e)                            # a store reads a pending result
    f = d + 1                                   # a math op reads one (flush first)
    g = tl.dot(f, c, tl.zeros((8, 8), "i32"))
    tl.store(out + 64 * 4, g)
    q = tl.load(w8, (8, 8), "i8")
    h = tl.dot(q, q)                            # i8 operands, i32 accumulator
    tl.store(out + 128 * 4, h)


def _build(vals, n_rep, dt="i32"):
    def build(w, p):
        x = w.tensor("x", (2, 8, 8), dt, init=vals)
        w8 = w.tensor("w8", (8, 8), "i8", init=np.arange(-32, 32).reshape(8, 8))
        out = w.tensor("out", (3, 8, 8), "i32")
        w.launch(_kernel, grid=(1, 1), args=(x, w8, out, n_rep, dt))

        def ref(v):
            wrap = np.int64(1) << 32

            def mm(u, t):
                r = (u.astype(np.int64) @ t.astype(np.int64)) % wrap
                return np.where(r >= wrap // 2, r - wrap, r)
            a, b = v["x"][0], v["x"][1]
            acc = np.zeros((8, 8), np.int64)
            for _ in range(n_rep):
                acc = mm(a, b) + acc
                acc = np.where(acc >= wrap // 2, acc - wrap, acc)
                acc = np.where(acc < -wrap // 2, acc + wrap, acc)
            c = mm(a, b)
            d = mm(c, acc)
            e = (mm(d, c) + d) % wrap
            e = np.where(e >= wrap // 2, e - wrap, e)
            g = mm((d + 1) % wrap, c)
            g = np.where(g >= wrap // 2, g - wrap, g)
            q = v["w8"].astype(np.int64)
            return np.stack([e, g, q @ q]).astype(np.int32)
        w.output(out, reference=ref)
    return build


@pytest.mark.parametrize("hi", [3, 1 << 12, 1 << 30])   # float32 / float64 / dot by dot
@pytest.mark.parametrize("n_rep", [1, 5, 400])           # 400: the scratch fills and is reused
def test_batched_dots_give_the_sequential_digests(tmp_path, hi, n_rep):
    topo = compile_topology(ROOT / "topologies" / "tiny.yaml")
    rng = np.random.default_rng(hi + n_rep)
    vals = rng.integers(-hi, hi, size=(2, 8, 8))
    tr = capture(SimpleNamespace(NAME="drain", PARAMS={}, build=_build(vals, n_rep)), topo,
                 out_dir=tmp_path / "t")
    assert tr.meta["reference_check"]["out"]["ok"]
    ops = pq.read_table(tmp_path / "t" / "ops.parquet").to_pydict()
    seq = tr.execute().digests                  # one op at a time, in capture order
    got = {i: d for i, d in zip(ops["op_id"], ops["out_digest"], strict=True) if d is not None}
    assert got == seq
    assert ops["kind"].count("dot") == n_rep + 5
    assert len(got) == len(ops["op_id"])         # every op here has a result

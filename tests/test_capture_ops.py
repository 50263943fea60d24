"""Numeric tests of every tl.* compute op over dtypes, executor vs numpy (tolerance table)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kbtrace.capture import capture
from kbtrace.capture.dtypes import TOLERANCE, allclose, to_compute, to_storage
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (4, 16)


@pytest.fixture(scope="module")
def tiny():
    return compile_topology(ROOT / "topologies" / "tiny.yaml")


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


# name: (kernel fn(tl, a, b, c), numpy fn(a, b, c), positive inputs?)
CASES = {
    "exp": (lambda tl, a, b, c: tl.exp(a), lambda a, b, c: np.exp(a), False),
    "log": (lambda tl, a, b, c: tl.log(a), lambda a, b, c: np.log(a), True),
    "sqrt": (lambda tl, a, b, c: tl.sqrt(a), lambda a, b, c: np.sqrt(a), True),
    "abs": (lambda tl, a, b, c: tl.abs(a), lambda a, b, c: np.abs(a), False),
    "sigmoid": (lambda tl, a, b, c: tl.sigmoid(a), lambda a, b, c: _sig(a), False),
    "cos": (lambda tl, a, b, c: tl.cos(a), lambda a, b, c: np.cos(a), False),
    "sin": (lambda tl, a, b, c: tl.sin(a), lambda a, b, c: np.sin(a), False),
    "add": (lambda tl, a, b, c: a + b, lambda a, b, c: a + b, False),
    "sub": (lambda tl, a, b, c: a - b, lambda a, b, c: a - b, False),
    "mul": (lambda tl, a, b, c: a * b, lambda a, b, c: a * b, False),
    "div": (lambda tl, a, b, c: a / b, lambda a, b, c: a / b, True),
    "rsub_scalar": (lambda tl, a, b, c: 1.5 - a, lambda a, b, c: 1.5 - a, False),
    "rdiv_scalar": (lambda tl, a, b, c: 2.0 / a, lambda a, b, c: 2.0 / a, True),
    "mul_scalar": (lambda tl, a, b, c: a * 3.0, lambda a, b, c: a * 3.0, False),
    "neg": (lambda tl, a, b, c: -a, lambda a, b, c: -a, False),
    "maximum": (lambda tl, a, b, c: tl.maximum(a, b), lambda a, b, c: np.maximum(a, b), False),
    "minimum": (lambda tl, a, b, c: tl.minimum(a, 0.25), lambda a, b, c: np.minimum(a, 0.25), False),
    "fma": (lambda tl, a, b, c: tl.fma(a, b, c), lambda a, b, c: a * b + c, False),
    "clamp": (lambda tl, a, b, c: tl.clamp(a, -0.5, 0.5), lambda a, b, c: np.clip(a, -.5, .5), False),
    "where": (lambda tl, a, b, c: tl.where(a > b, a, c), lambda a, b, c: np.where(a > b, a, c),
              False),
    "softmax": (lambda tl, a, b, c: tl.softmax(a, axis=1), lambda a, b, c: _softmax(a, 1), False),
    "softmax0": (lambda tl, a, b, c: tl.softmax(a, axis=0), lambda a, b, c: _softmax(a, 0), False),
    "sum": (lambda tl, a, b, c: tl.sum(a, axis=1), lambda a, b, c: a.sum(1, keepdims=True), False),
    "max": (lambda tl, a, b, c: tl.max(a, axis=0), lambda a, b, c: a.max(0, keepdims=True), False),
    "min_all": (lambda tl, a, b, c: tl.min(a), lambda a, b, c: a.min(keepdims=True), False),
    "trans": (lambda tl, a, b, c: tl.trans(a), lambda a, b, c: a.T, False),
    "bcast_row": (lambda tl, a, b, c: a + tl.sum(b, axis=0),
                  lambda a, b, c: a + b.sum(0, keepdims=True), False),
    "chain": (lambda tl, a, b, c: tl.exp(a * b) - tl.full(SHAPE, 1.0, a.dtype),
              lambda a, b, c: np.exp(a * b) - 1.0, False),
}
INT_CASES = ["add", "sub", "mul", "maximum", "sum", "max", "min_all", "trans", "neg", "where",
             "clamp", "fma"]


def _capture_case(topo, tmp_path, name, dtype):
    kfn, nfn, positive = CASES[name]
    lo, hi = (0.5, 1.5) if positive else (-1.0, 1.0)
    if dtype == "i32":
        lo, hi = (1, 9) if positive else (-9, 9)

    def kernel(tl, x, y, z, out, shape, dtype):
        a, b, c = (tl.load(p, shape, dtype) for p in (x, y, z))
        r = kfn(tl, a, b, c)
        tl.store(out, r)

    def build(w, p):
        ins = [w.tensor(n, SHAPE, dtype, init=w.random(i + 3, low=lo, high=hi))
               for i, n in enumerate("xyz")]
        vals = [t.value.astype(np.float64) for t in ins]
        want = np.asarray(nfn(*vals))
        out = w.tensor("out", want.shape, dtype)
        w.launch(kernel, grid=(1, 1), args=(*ins, out, SHAPE, dtype))
        w.output(out, reference=lambda v: nfn(*(v[n].astype(np.float64) for n in "xyz")))

    return capture(SimpleNamespace(NAME=name, PARAMS={}, build=build), topo, out_dir=tmp_path)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_float_ops_match_numpy(tiny, tmp_path, name, dtype):
    tr = _capture_case(tiny, tmp_path, name, dtype)
    chk = tr.meta["reference_check"]["out"]
    assert chk["ok"], chk
    res = tr.execute()
    ref = to_compute(to_storage(tr_ref(tr), dtype), dtype)
    assert allclose(res.outputs["out"], ref, dtype)


def tr_ref(tr):
    from kbtrace.capture.executor import reference_outputs
    return reference_outputs(tr.memory())["out"]


@pytest.mark.parametrize("name", INT_CASES)
def test_int_ops_exact(tiny, tmp_path, name):
    tr = _capture_case(tiny, tmp_path, name, "i32")
    assert tr.meta["reference_check"]["out"] == {"ok": True, "max_abs_err": 0.0, "dtype": "i32"}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_dot_accumulates_in_f32(tiny, tmp_path, dtype):
    def kernel(tl, x, y, out):
        a = tl.load(x, (8, 64), dtype)
        b = tl.load(y, (64, 4), dtype)
        acc = tl.dot(a, b)
        assert acc.dtype == "f32" and acc.pending
        tl.store(out, acc.to(dtype))

    def build(w, p):
        x = w.tensor("x", (8, 64), dtype, init=w.random(1))
        y = w.tensor("y", (64, 4), dtype, init=w.random(2))
        out = w.tensor("out", (8, 4), dtype)
        w.launch(kernel, grid=(1, 1), args=(x, y, out))
        w.output(out, reference=lambda v: v["x"].astype(np.float64) @ v["y"].astype(np.float64))

    tr = capture(SimpleNamespace(NAME="dot", PARAMS={}, build=build), tiny, out_dir=tmp_path)
    assert tr.meta["reference_check"]["out"]["ok"]
    dot = next(r for r in tr.ops().to_pylist() if r["kind"] == "dot")
    assert (dot["m"], dot["n"], dot["k"], dot["acc_dtype"], dot["in_dtypes"]) == \
        (8, 4, 64, "f32", [dtype, dtype])


def test_bf16_round_to_nearest_even():
    vals = np.array([1.0, 1.00390625, 1.01171875, 1.0078125 + 2**-9, -2.5, np.inf], np.float32)
    bits = to_storage(vals, "bf16")
    # 1 + 2^-8 is a tie between 1.0 and 1+2^-7 -> even (1.0); 1 + 3*2^-8 ties -> 1 + 2^-6 (even)
    assert list(to_compute(bits, "bf16")) == [1.0, 1.0, 1.015625, 1.0078125, -2.5, np.inf]
    assert to_storage(np.array([np.nan], np.float32), "bf16")[0] == 0x7FC0
    assert TOLERANCE["bf16"] == (1e-2, 1e-2) and TOLERANCE["i32"] == (0.0, 0.0)


@pytest.mark.parametrize("scope", ["output_tile", "k_tile"])
def test_composite_epilogues(tiny, tmp_path, scope):
    K, tk = 128, 64

    def kernel(tl, a_ptr, b_ptr, s_ptr, bias_ptr, c_ptr):
        a = tl.load(a_ptr, (16, K), "f16")                   # pinned operand
        b = tl.ref(b_ptr, (K, 8), "f16")
        s = tl.ref(s_ptr, (K // tk,) if scope == "k_tile" else (8,), "f32")  # per K tile / column
        bias = tl.ref(bias_ptr, (8,), "f32")
        h = tl.composite(op="gemm", a=a, b=b, out_ptr=c_ptr, out_dtype="f32",
                         epilogue=[{"op": "dequant", "scale": s, "scope": scope},
                                   {"op": "bias", "bias": bias}, {"op": "relu"},
                                   {"op": "scale", "factor": 0.5}])
        tl.wait(h)

    def ref(v):
        a, b = v["a"].astype(np.float64), v["b"].astype(np.float64)
        if scope == "k_tile":
            acc = sum(a[:, i * tk:(i + 1) * tk] @ b[i * tk:(i + 1) * tk] * v["s"][i]
                      for i in range(K // tk))
        else:
            acc = (a @ b) * v["s"]
        return 0.5 * np.maximum(acc + v["bias"], 0)

    def build(w, p):
        a = w.tensor("a", (16, K), "f16", init=w.random(1))
        b = w.tensor("b", (K, 8), "f16", init=w.random(2))
        s = w.tensor("s", (K // tk,) if scope == "k_tile" else (8,), "f32",
                     init=w.random(3, low=0.5, high=2.0))
        bias = w.tensor("bias", (8,), "f32", init=w.random(4))
        c = w.tensor("c", (16, 8), "f32")
        w.launch(kernel, grid=(1, 1), args=(a, b, s, bias, c))
        w.output(c, reference=ref)

    tr = capture(SimpleNamespace(NAME="comp", PARAMS={}, build=build), tiny, out_dir=tmp_path)
    assert tr.meta["reference_check"]["c"]["ok"], tr.meta["reference_check"]
    comp = next(r for r in tr.ops().to_pylist() if r["kind"] == "composite")
    assert comp["is_async"] and (comp["m"], comp["n"], comp["k"]) == (16, 8, 128)
    assert '"a_pinned": true' in comp["extra_json"] and '"b_pinned": false' in comp["extra_json"]
    assert f'"scope": "{scope}"' in comp["extra_json"]


def test_composite_math_and_bad_epilogue(tiny, tmp_path):
    from kbtrace.errors import CaptureError

    def kernel(tl, x, y):
        tl.wait(tl.composite(op="math", a=tl.ref(x, SHAPE, "f32"), out_ptr=y, math_op="sigmoid",
                             epilogue=[{"op": "scale", "factor": 2.0}]))

    def build(w, p):
        x = w.tensor("x", SHAPE, "f32", init=w.random(1))
        y = w.tensor("y", SHAPE, "f32")
        w.launch(kernel, grid=(1, 1), args=(x, y))
        w.output(y, reference=lambda v: 2.0 * _sig(v["x"].astype(np.float64)))

    tr = capture(SimpleNamespace(NAME="cm", PARAMS={}, build=build), tiny, out_dir=tmp_path)
    assert tr.meta["reference_check"]["y"]["ok"]

    def bad(tl, x, y):
        tl.composite(op="math", a=tl.ref(x, SHAPE, "f32"), out_ptr=y, math_op="exp",
                     epilogue=[{"op": "scale"}])

    def build2(w, p):
        x = w.tensor("x", SHAPE, "f32")
        w.launch(bad, grid=(1, 1), args=(x, w.tensor("y", SHAPE, "f32")))

    with pytest.raises(CaptureError, match="epilogue\\[0\\] op 'scale' needs field 'factor'"):
        capture(SimpleNamespace(NAME="b", PARAMS={}, build=build2), tiny, out_dir=tmp_path / "b")


def test_fill_ops_and_index_helpers(tiny, tmp_path):
    got = {}

    def kernel(tl, out):
        r = tl.arange(3, 19, "i32")
        got["vals"] = (r.data.tolist()[:3], tl.zeros((2,), "f32").data.tolist(),
                       tl.full((2, 2), 7.0, "i32")[1, 1], tl.cdiv(17, 4),
                       tl.program_id(0), tl.num_programs(1))
        tl.cycles(5)
        tl.store(out, r)

    def build(w, p):
        out = w.tensor("out", (16,), "i32")
        w.launch(kernel, grid=(1, 1), args=(out,))
        w.output(out, reference=lambda v: np.arange(3, 19))

    tr = capture(SimpleNamespace(NAME="f", PARAMS={}, build=build), tiny, out_dir=tmp_path)
    assert got["vals"] == ([3, 4, 5], [0.0, 0.0], 7, 5, 0, 1)
    assert tr.meta["reference_check"]["out"]["ok"]
    cyc = next(r for r in tr.ops().to_pylist() if r["kind"] == "cycles")
    assert cyc["cycles"] == 5

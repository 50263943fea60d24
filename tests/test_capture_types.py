"""Triton's type rules: implicit promotion, cast on store, tl.dot(out_dtype=), tl by keyword,
and a predecessor-style kernel that captures, replays and verifies."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

from kbtrace.analysis.verifier import verify
from kbtrace.capture import capture
from kbtrace.capture.dtypes import promote, promote_scalar
from kbtrace.capture.scheduler import tl_by_keyword
from kbtrace.errors import CaptureError, SanitizerError
from kbtrace.replay import ReplayOptions, replay
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small():
    return compile_topology(ROOT / "topologies" / "small.yaml")


def _cap(topo, tmp_path, build, **kw):
    return capture(SimpleNamespace(NAME="types", PARAMS={}, build=build), topo,
                   out_dir=tmp_path / "trace", **kw)


def _ops(tr):
    return pq.read_table(tr.path / "ops.parquet").to_pylist()


@pytest.mark.parametrize("dts, want", [
    (("f16", "f32"), "f32"), (("f16", "bf16"), "f32"), (("bf16", "f16"), "f32"),
    (("i32", "f16"), "f16"), (("i8", "bf16"), "bf16"), (("i8", "i32"), "i32"),
    (("bool", "i8"), "i8"), (("bool", "f32", "i32"), "f32"), (("f16", "f16"), "f16")])
def test_promotion_lattice(dts, want):
    assert promote(dts) == want
    assert promote(tuple(reversed(dts))) == want


def test_weak_python_scalars():
    assert [promote_scalar(d, True) for d in ("f16", "bf16", "f32", "i32", "i8", "bool")] == [
        "f16", "bf16", "f32", "f32", "f32", "f32"]
    assert [promote_scalar(d, False) for d in ("f16", "i8", "i32", "bool")] == [
        "f16", "i8", "i32", "i32"]


def test_mixed_operands_promote_and_execute_in_the_common_dtype(small, tmp_path):
    """f32 * f16 -> f32; i32 + f16 -> f16; i32 * 0.5 -> f32; the values are the numpy ones."""
    x0 = np.linspace(-2, 2, 8, dtype=np.float32)
    h0 = np.linspace(0.5, 4, 8).astype(np.float16)
    i0 = np.arange(8, dtype=np.int32) - 3

    def kernel(tl, x, h, i, y, z, u):
        a, b, c = tl.load(x, (8,), "f32"), tl.load(h, (8,), "f16"), tl.load(i, (8,), "i32")
        tl.store(y, a * b)
        tl.store(z, c + b)
        tl.store(u, c * 0.5)

    def build(w, p):
        x = w.tensor("x", (8,), "f32", init=x0)
        h = w.tensor("h", (8,), "f16", init=h0)
        i = w.tensor("i", (8,), "i32", init=i0)
        y, z, u = (w.tensor(n, (8,), d) for n, d in (("y", "f32"), ("z", "f16"), ("u", "f32")))
        w.launch(kernel, grid=(1, 1), args=(x, h, i, y, z, u))
        w.output(y, reference=lambda v: v["x"] * v["h"])
        w.output(z, reference=lambda v: v["i"].astype(np.float32) + v["h"])
        w.output(u, reference=lambda v: v["i"] * np.float32(0.5))

    tr = _cap(small, tmp_path, build)
    assert all(c["ok"] for c in tr.meta["reference_check"].values()), tr.meta["reference_check"]
    maths = [o for o in _ops(tr) if o["kind"] == "math"]
    assert [(o["name"], o["in_dtypes"], o["out_dtype"], json.loads(o["extra_json"]))
            for o in maths] == [
        ("mul", ["f32", "f16"], "f32", {"promote": "f32"}),
        ("add", ["i32", "f16"], "f16", {"promote": "f16"}),
        ("mul", ["i32"], "f32", {"promote": "f32"})]
    # an int tensor times an int scalar stays an int (no promotion recorded)


def test_strict_promote_refuses_mixed_operands(small, tmp_path):
    def kernel(tl, x, y):
        tl.store(y, tl.load(x, (8,), "f32") + tl.zeros((8,), "f16"))

    def build(w, p):
        w.launch(kernel, grid=(1, 1), args=(w.tensor("x", (8,), "f32"), w.tensor("y", (8,), "f32")))

    with pytest.raises(SanitizerError, match=r"dtypes differ \(f32, f16\).*strict 'promote'"):
        _cap(small, tmp_path, build, strict=["promote"])
    with pytest.raises(CaptureError, match="unknown type sanitizer 'promot'"):
        _cap(small, tmp_path, build, strict=["promot"])


def test_store_casts_to_the_destination_dtype(small, tmp_path):
    """An f32 value stored into an f16 tensor is cast first (a cast op), strided tiles too."""
    x0 = np.arange(64, dtype=np.float32).reshape(8, 8) / 3

    def kernel(tl, x, y):
        t = tl.load(x, (4, 8), "f32")
        tl.store(y, t * 2.0)                                   # whole rows 0..3
        tl.store(y + 4 * 8 * 2, tl.load(x + 4 * 8 * 4, (4, 8), "f32"), strides=(8, 1))

    def build(w, p):
        x = w.tensor("x", (8, 8), "f32", init=x0)
        y = w.tensor("y", (8, 8), "f16")
        w.launch(kernel, grid=(1, 1), args=(x, y))
        w.output(y, reference=lambda v: np.concatenate([v["x"][:4] * 2, v["x"][4:]]))

    tr = _cap(small, tmp_path, build)
    assert tr.meta["reference_check"]["y"]["ok"]
    ops = _ops(tr)
    assert [(o["kind"], o["name"], o["out_dtype"]) for o in ops] == [
        ("load", "load", "f32"), ("math", "mul", "f32"), ("math", "cast", "f16"),
        ("store", "store", "f16"), ("load", "load", "f32"), ("math", "cast", "f16"),
        ("store", "store", "f16")]
    assert [o["nbytes"] for o in ops if o["kind"] == "store"] == [64, 64]
    with pytest.raises(SanitizerError, match=r"tl.store of a f32 value into tensor 'y' "
                                             r"\(dtype f16\).*strict 'store'.*h.to\('f16'\)"):
        _cap(small, tmp_path, build, strict="store")


def test_dot_out_dtype_and_mixed_operands(small, tmp_path):
    a0 = (np.arange(32, dtype=np.float32).reshape(4, 8) / 7).astype(np.float16)
    b0 = np.arange(24, dtype=np.float32).reshape(8, 3) / 5

    def kernel(tl, a, b, c, d):
        ta, tb = tl.load(a, (4, 8), "f16"), tl.load(b, (8, 3), "f32")
        h = tl.dot(ta, ta.T, out_dtype="f16")                   # f16 accumulation
        tl.store(c, h)
        tl.store(d, tl.dot(ta, tb))                            # f16 x f32 -> f32

    def build(w, p):
        a = w.tensor("a", (4, 8), "f16", init=a0)
        b = w.tensor("b", (8, 3), "f32", init=b0)
        c = w.tensor("c", (4, 4), "f16")
        d = w.tensor("d", (4, 3), "f32")
        w.launch(kernel, grid=(1, 1), args=(a, b, c, d))
        w.output(c, reference=lambda v: v["a"] @ v["a"].T)
        w.output(d, reference=lambda v: v["a"] @ v["b"])

    tr = _cap(small, tmp_path, build)
    assert all(c["ok"] for c in tr.meta["reference_check"].values()), tr.meta["reference_check"]
    dots = [o for o in _ops(tr) if o["kind"] == "dot"]
    assert [(o["in_dtypes"], o["acc_dtype"], o["out_dtype"]) for o in dots] == [
        (["f16", "f16"], "f16", "f16"), (["f16", "f32"], "f32", "f32")]


def test_dot_out_dtype_and_acc_dtype_must_agree(small, tmp_path):
    def kernel(tl, x, y):
        a = tl.load(x, (4, 4), "f32")
        tl.dot(a, a, acc_dtype="f32", out_dtype="f16")

    def build(w, p):
        w.launch(kernel, grid=(1, 1), args=(w.tensor("x", (4, 4), "f32"), 0))

    with pytest.raises(CaptureError, match="out_dtype='f16' and acc_dtype='f32' disagree"):
        _cap(small, tmp_path, build)


def test_where_tl_goes():
    def first(tl, x): ...
    def last(x, n, tl): ...
    def kw_only(x, *, tl): ...
    def none(x, y): ...
    assert [tl_by_keyword(f) for f in (first, last, kw_only, none, len)] == [
        False, True, True, False, False]


# ----------------------------------------------------------- the predecessor-style kernel
S, D = 32, 16


def attention_tl_last(q_ptr, k_ptr, v_ptr, scale_ptr, o_ptr, BQ, tl):
    """Written as for the predecessor: ``tl`` last, an f16 scale, no casts, f32 into f16."""
    qb = tl.program_id(0)
    q = tl.load(q_ptr + qb * BQ * D * 2, (BQ, D), "f16")
    kt = tl.load(k_ptr, (D, S), "f16", strides=(1, D))         # K transposed by the DMA
    v = tl.load(v_ptr, (S, D), "f16")
    scale = tl.load(scale_ptr, (1,), "f16")
    s = tl.dot(q, kt) * scale                                  # f32 * f16 -> f32
    p = tl.softmax(s, axis=1)
    o = tl.dot(p, v)                                           # f32 x f16 -> f32
    tl.store(o_ptr + qb * BQ * D * 2, o)                       # f32 into an f16 tensor


def _attention_build(w, p):
    rng = np.random.default_rng(3)
    q0, k0, v0 = (rng.uniform(-1, 1, (S, D)).astype(np.float16) for _ in range(3))
    q = w.tensor("q", (S, D), "f16", init=q0)
    k = w.tensor("k", (S, D), "f16", init=k0)
    v = w.tensor("v", (S, D), "f16", init=v0)
    sc = w.tensor("scale", (1,), "f16", init=np.array([1 / np.sqrt(D)], np.float16))
    o = w.tensor("o", (S, D), "f16")
    bq = S // 4
    w.launch(attention_tl_last, grid=(4, 1), args=(q, k, v, sc, o, bq))

    def ref(vals):
        s = vals["q"] @ vals["k"].T * vals["scale"][0]
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)) @ vals["v"]
    w.output(o, reference=ref)


@pytest.mark.parametrize("fidelity", ["fast", "flit"])
def test_predecessor_style_kernel_captures_replays_and_verifies(small, tmp_path, fidelity):
    wl = SimpleNamespace(NAME="attention_tl_last", PARAMS={}, build=_attention_build)
    tr = capture(wl, small, out_dir=tmp_path / "trace")
    assert tr.meta["reference_check"]["o"]["ok"], tr.meta["reference_check"]
    assert tr.op_counts == {"dot": 8, "load": 16, "math": 12, "store": 4}
    names = sorted({(o["name"], o["out_dtype"]) for o in _ops(tr) if o["kind"] == "math"})
    assert names == [("cast", "f16"), ("mul", "f32"), ("softmax", "f32")]
    run = replay(tmp_path / "trace", small, ReplayOptions(fidelity=fidelity,
                                                         out_dir=str(tmp_path / "run")))
    assert run.makespan_ns > 0
    res = verify(tmp_path / "run")
    assert res.ok, res.text()


def test_cli_strict_store(tmp_path, capsys):
    from kbtrace.cli import main
    wl = tmp_path / "castme.py"
    wl.write_text(
        "import numpy as np\n"
        "PARAMS = {}\n"
        "def kernel(x_ptr, y_ptr, tl):\n"
        "    tl.store(y_ptr, tl.load(x_ptr, (8,), 'f32'))\n"
        "def build(w, p):\n"
        "    x = w.tensor('x', (8,), 'f32', init=w.random(0))\n"
        "    y = w.tensor('y', (8,), 'f16')\n"
        "    w.launch(kernel, grid=(1, 1), args=(x, y))\n"
        "    w.output(y, reference=lambda v: v['x'])\n")
    topo = str(ROOT / "topologies" / "small.yaml")
    assert main(["capture", str(wl), "--topology", topo, "-o", str(tmp_path / "t1")]) == 0
    assert "output y (f16) matches its numpy reference" in capsys.readouterr().out
    assert main(["capture", str(wl), "--topology", topo, "-o", str(tmp_path / "t2"),
                 "--strict", "store"]) == 2
    err = capsys.readouterr().err
    assert "castme.py:4: tl.store of a f32 value into tensor 'y' (dtype f16)" in err
    assert not (tmp_path / "t2").exists()

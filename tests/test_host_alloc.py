"""HBM allocators (ADR-0048): first fit, free with coalescing, reuse between launches, and the
overflow error naming the largest free block."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kbtrace.analysis import verify
from kbtrace.capture import capture
from kbtrace.capture.memory import FreeList
from kbtrace.cli import main
from kbtrace.errors import CaptureError, SanitizerError
from kbtrace.replay import ReplayOptions, replay
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small():
    return compile_topology(ROOT / "topologies" / "small.yaml")


def wl(build):
    return SimpleNamespace(NAME="t", PARAMS={}, build=build)


def test_freelist_first_fit_and_coalescing():
    f = FreeList(1000, 1024, "slice", align=64)
    a, b, c = (f.alloc(100, x)[0] for x in "abc")          # 128 B each (aligned)
    assert (a, b, c) == (1000, 1128, 1256) and f.free_blocks == [(384, 640)]
    f.free(b, 100)
    assert f.free_blocks == [(128, 128), (384, 640)]
    assert f.alloc(64, "d") == (1128, True)                 # first fit: the hole, reused
    f.free(1128, 64)
    f.free(a, 100)                                          # merges with the next free block
    assert f.free_blocks == [(0, 256), (384, 640)]
    f.free(c, 100)                                          # merges both sides: one block again
    assert f.free_blocks == [(0, 1024)] and f.used == 0
    with pytest.raises(SanitizerError, match=r"needs 2000 B but the largest free block is "
                                             r"1024 B \(1024 of 1024 B free in 1 block\(s\)\)"):
        f.alloc(2000, "big")


def test_freed_tensors_are_reused_between_launches(small, tmp_path):
    """a is freed after launch 0; b (same size) lands on a's address and gets its values by an
    h2d from its host staging copy at that point; launch 1 computes with b; replay + verify
    agree."""
    av, bv = np.arange(64, dtype=np.float32), np.full(64, 3.0, np.float32)
    addrs = {}

    def k(tl, x, y):
        tl.store(y, tl.load(x, (64,), "f32") * 2.0)

    def build(w, p):
        a = w.tensor("a", (64,), init=av)
        ya = w.tensor("ya", (64,))
        w.launch(k, args=(a, ya), grid=(1, 1))
        w.free(a)
        b = w.tensor("b", (64,), init=bv)
        yb = w.tensor("yb", (64,))
        w.launch(k, args=(b, yb), grid=(1, 1))
        addrs.update(a=a.addr, b=b.addr)
        w.output(ya, reference=lambda v: av * 2)
        w.output(yb, reference=lambda v: bv * 2)

    tr = capture(wl(build), small, out_dir=tmp_path / "t")
    assert addrs["a"] == addrs["b"]
    assert all(c["ok"] for c in tr.meta["reference_check"].values())
    kinds = [(o["kind"], o["launch"]) for o in tr.ops().to_pylist()]
    assert kinds == [("load", 0), ("math", 0), ("store", 0), ("h2d", -1),
                     ("load", 1), ("math", 1), ("store", 1)]
    mem = {m["tensor"] for m in tr.memory().to_pylist() if m["role"] != "reference"}
    assert "b" not in mem and "b.init" in mem       # b has no initial image: it is staged
    run = replay(tr, small, ReplayOptions(out_dir=str(tmp_path / "r")))
    res = verify(run.run_dir)
    assert res.ok, res.text()


def test_a_kernel_touching_a_freed_tensor_is_refused(small, tmp_path):
    def k(tl, x):
        tl.load(x, (4,), "f32")

    def build(w, p):
        a = w.tensor("a", (4,))
        w.free(a)
        w.launch(k, args=(a,), grid=(1, 1))
    with pytest.raises(SanitizerError, match="touches unallocated memory"):
        capture(wl(build), small, out_dir=tmp_path / "t")


@pytest.mark.parametrize("call,match", [
    (lambda w: [w.free(t) for t in [w.tensor("a", (4,))] * 2], "freed twice"),
    (lambda w: (lambda t: (w.output(t, lambda v: 0), w.free(t)))(w.tensor("a", (4,))),
     "is an output, which must stay allocated"),
    (lambda w: w.free(w.host_tensor("h", (4,))), "lives in host, expected one in device HBM"),
])
def test_bad_frees(small, tmp_path, call, match):
    with pytest.raises(CaptureError, match=match):
        capture(wl(lambda w, p: call(w)), small, out_dir=tmp_path / "t")


def test_allocation_that_cannot_fit_names_the_largest_free_block(small, tmp_path, capsys):
    n = small.hbm_slice_bytes // 4
    wf = tmp_path / "big.py"
    wf.write_text(f"def build(w, p):\n    a = w.tensor('a', ({n // 2},))\n"
                  f"    w.tensor('b', ({n},))\n")
    rc = main(["capture", str(wf), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert (f"HBM slice of sip0.cube0.pe0 overflow: tensor 'b' needs {n * 4} B but the largest "
            f"free block is {small.hbm_slice_bytes // 2} B") in err
    assert not (tmp_path / "out").exists()

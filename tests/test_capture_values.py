"""Real values seen by kernels during capture: lazy loads, real stores, received payloads, GC state."""

from __future__ import annotations

import gc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtrace.capture import capture, ring
from kbtrace.capture.dtypes import to_compute
from kbtrace.errors import CaptureError
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny():
    return compile_topology(ROOT / "topologies" / "tiny.yaml")


def _run(topo, tmp_path, build, name="values"):
    return capture(SimpleNamespace(NAME=name, PARAMS={}, build=build), topo, out_dir=tmp_path)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i32"])
def test_load_value_is_memory_at_its_capture_position(tiny, tmp_path, dtype):
    """A value read after a later real store still shows what the load saw (tile and whole)."""
    seen = {}

    def kernel(tl, x, dtype):
        tile = tl.load(x + 2 * tl.sizeof(dtype), (2, 2), dtype, strides=(8, 1))  # not read yet
        whole = tl.load(x, (4, 8), dtype)
        tl.store(x, tl.full((4, 8), 7, dtype))          # a real value overwrites x
        again = tl.load(x, (4, 8), dtype)
        seen["tile"], seen["whole"], seen["again"] = tile.data, whole.data, again.data
        if again[0, 0] == 7:                             # kernels may branch on it
            tl.cycles(1)

    x0 = np.arange(32, dtype=np.float32).reshape(4, 8)

    def build(w, p):
        x = w.tensor("x", (4, 8), dtype, init=x0)
        w.launch(kernel, grid=(1, 1), args=(x, dtype))
        w.output(x, reference=lambda v: np.full((4, 8), 7.0))

    tr = _run(tiny, tmp_path, build)
    assert np.array_equal(seen["tile"], x0[:2, 2:4])
    assert np.array_equal(seen["whole"], x0)
    assert np.array_equal(seen["again"], np.full((4, 8), 7))
    assert tr.op_counts == {"cycles": 1, "fill": 1, "load": 3, "store": 1}
    assert tr.meta["reference_check"]["x"]["ok"]


def test_loaded_values_equal_the_executor_bytes(tiny, tmp_path):
    """bf16 bit patterns (incl. a non-canonical NaN) survive load -> store -> load unchanged."""
    bits = np.array([0x3F80, 0x7F81, 0xFF80, 0x0001], dtype=np.uint16)
    seen = {}

    def kernel(tl, x, y):
        h = tl.load(x, (4,), "bf16")
        tl.store(y, h)
        seen["y"] = tl.load(y, (4,), "bf16").data

    def build(w, p):
        x = w.tensor("x", (4,), "bf16")
        x.stored[:] = bits
        w._tracer.write_initial(x.addr, bits)
        y = w.tensor("y", (4,), "bf16")
        w.launch(kernel, grid=(1, 1), args=(x, y))

    _run(tiny, tmp_path, build)
    assert np.array_equal(seen["y"].view(np.uint32), to_compute(bits, "bf16").view(np.uint32))


def test_received_payload_is_the_senders_value(tiny, tmp_path):
    seen = {}

    def kernel(tl, x):
        me = tl.program_id(0)
        h = tl.load(x, (1, 8), "f32")
        tl.send("intra_E", h)
        got = tl.recv("intra_W", (1, 8), "f32")
        seen[me] = (h.data, got.data)

    def build(w, p):
        x = w.tensor("x", (2, 8), "f32", init=w.random(5), shard="pes")
        w.launch(kernel, grid=(2, 1), args=(x,), neighbors=ring(2))

    _run(tiny, tmp_path, build)
    assert np.array_equal(seen[0][1], seen[1][0]) and np.array_equal(seen[1][1], seen[0][0])
    assert not np.array_equal(seen[0][0], seen[1][0])


def test_store_from_a_ref_whose_memory_became_pending_is_pending(tiny, tmp_path):
    def kernel(tl, x, y):
        r = tl.ref(x, (8,), "f32")
        tl.store(x, tl.load(x, (8,), "f32") + 1.0)      # x now holds a pending result
        tl.store(y, r)                                   # copies pending bytes
        if tl.load(y, (8,), "f32")[0] > 0:
            tl.cycles(1)

    def build(w, p):
        w.launch(kernel, grid=(1, 1), args=(w.tensor("x", (8,), "f32"), w.tensor("y", (8,), "f32")))

    with pytest.raises(CaptureError, match="pending result of op 'load'"):
        _run(tiny, tmp_path, build)


@pytest.mark.parametrize("fail", [False, True])
def test_gc_state_restored(tiny, tmp_path, fail):
    def kernel(tl, x):
        h = tl.load(x, (8,), "f32") * 2.0
        if fail:
            bool(h)

    def build(w, p):
        w.launch(kernel, grid=(1, 1), args=(w.tensor("x", (8,), "f32"),))

    assert gc.isenabled()
    if fail:
        with pytest.raises(CaptureError):
            _run(tiny, tmp_path, build)
    else:
        tr = _run(tiny, tmp_path, build)
        assert set(tr.stats) == {"run_s", "drain_s", "close_s", "total_s", "run_cpu_s",
                                 "drain_cpu_s", "total_cpu_s"}
        st = tr.stats
        assert st["run_cpu_s"] >= 0 and 0 <= st["drain_cpu_s"] <= st["total_cpu_s"]
    assert gc.isenabled()


@pytest.mark.parametrize("young, collected", [(1, True), (10**9, False)])
def test_drains_collect_cyclic_garbage_past_the_young_threshold(tiny, tmp_path, monkeypatch,
                                                                 young, collected):
    """While capture pauses automatic GC, a drain collects the young generation once it
    grew by ``GC_YOUNG`` objects: a kernel's reference cycles do not pile up."""
    import weakref

    from kbtrace.capture import tracer
    monkeypatch.setattr(tracer, "BATCH_ROWS", 4)
    monkeypatch.setattr(tracer, "GC_YOUNG", young)
    alive: list[int] = []

    class Node:
        pass

    def kernel(tl, x):
        refs = []
        for _ in range(40):
            n = Node()
            n.me = n                     # a cycle only the cyclic GC frees
            refs.append(weakref.ref(n))
            del n
            tl.load(x, (8,), "f32")      # a drain every 4 ops
        alive.append(sum(r() is not None for r in refs))

    def build(w, p):
        w.launch(kernel, grid=(1, 1), args=(w.tensor("x", (8,), "f32"),))

    gc.collect()
    _run(tiny, tmp_path, build)
    assert len(alive) == 1
    if collected:
        assert alive[0] < 8          # collected at the drains (the last few are still young)
    else:
        assert alive[0] == 40        # no automatic GC during the kernels, no collection


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([np.int32, np.int64]), st.integers(1, 9), st.integers(1, 70),
       st.integers(1, 9), st.sampled_from([1, 100, 1 << 15, 1 << 20, 1 << 31]),
       st.integers(0, 2**32 - 1))
def test_integer_matmul_equals_numpy_including_wraparound(dt, m, k, n, hi, seed):
    """``executor.matmul`` (float32 or float64 BLAS when every sum is exact) == numpy's integer matmul,
    bit for bit, also where int32 sums wrap or the operands hold the most negative int."""
    from kbtrace.capture.executor import matmul
    rng = np.random.default_rng(seed)
    info = np.iinfo(dt)
    lo = max(-hi, int(info.min))
    a = rng.integers(lo, min(hi, int(info.max)), (m, k), dtype=dt, endpoint=True)
    b = rng.integers(lo, min(hi, int(info.max)), (k, n), dtype=dt, endpoint=True)
    got, want = matmul(a, b), a @ b
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_integer_matmul_exact_cases():
    from kbtrace.capture.executor import matmul
    a = np.array([[2**31 - 1, 1]], dtype=np.int32)
    b = np.array([[2], [3]], dtype=np.int32)
    assert matmul(a, b).tolist() == (a @ b).tolist() == [[1]]       # wraps: 2**32 + 1 -> 1
    big = np.full((1, 1), np.iinfo(np.int32).min, dtype=np.int32)
    assert matmul(big, big).tolist() == (big @ big).tolist() == [[0]]   # 2**62 mod 2**32
    assert matmul(np.zeros((2, 0), np.int32), np.zeros((0, 3), np.int32)).tolist() == [[0] * 3] * 2

"""The compiled fast-mode core (Cython twins of ``fabric/booking.py`` and ``fabric/fast.py``,
built by ``pip install -e .``) and the pure-Python reference write byte-identical outputs;
the pure core says so once; a compiled core older than its source is not used. In CI
(``CI`` set) the compiled core must be built: ``.ci/run`` installs with ``pip install -e``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

from kbtrace.replay.fabric import core

ROOT = Path(__file__).resolve().parents[1]
_REPLAY = ("import sys\n"
           "from kbtrace.replay import ReplayOptions, replay\n"
           "from kbtrace.replay.fabric.core import status\n"
           "replay(sys.argv[1], sys.argv[2], ReplayOptions(fidelity=sys.argv[4], "
           "out_dir=sys.argv[3], hbm_pcs=sys.argv[5] == '1'))\n"
           "print(status()[1])\n")


def _replay(trace: Path, topo: Path, out: Path, pure: bool, fidelity: str = "fast",
            hbm_pcs: bool = False) -> str:
    env = {k: v for k, v in os.environ.items() if k != core.PURE_ENV}
    env["PYTHONPATH"] = str(ROOT / "src")
    if pure:
        env[core.PURE_ENV] = "1"
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", _REPLAY, str(trace), str(topo),
                          str(out), fidelity, "1" if hbm_pcs else "0"], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


def _digest(run: Path) -> dict[str, str]:
    return {f: hashlib.sha256((run / f).read_bytes()).hexdigest()
            for f in ("op_timing.parquet", "hops.parquet", "hbm_pcs.parquet")
            if (run / f).is_file()}


def test_compiled_core_is_built_in_ci():
    if not os.environ.get("CI"):
        pytest.skip("outside CI the compiled core is optional")
    assert core.status()[1] == "compiled"


@pytest.mark.parametrize("workload, params, fidelity", [
    ("gemm", {"M": 512, "N": 512, "K": 256}, "fast"), ("all_gather", {}, "fast"),
    ("gemm_sharded", {}, "fast-fcfs")])
def test_compiled_and_pure_cores_write_identical_outputs(tmp_path, workload, params, fidelity):
    """Byte for byte, on gemm (free paths, plans), all_gather (every pair of PEs: links
    shared, gaps, bandwidth shares) and gemm_sharded in fast-fcfs (HBM reads and writes
    queueing on the pseudo-channels) over small.yaml, the pseudo-channel log too."""
    from kbtrace.capture import capture
    topo = ROOT / "topologies" / "small.yaml"
    capture(ROOT / "capture" / f"{workload}.py", topo, params, tmp_path / "tr")
    pure = _replay(tmp_path / "tr", topo, tmp_path / "pure", True, fidelity, hbm_pcs=True)
    other = _replay(tmp_path / "tr", topo, tmp_path / "default", False, fidelity, hbm_pcs=True)
    assert pure.startswith("switched off")
    if other != "compiled" and not os.environ.get("CI"):
        pytest.skip(f"compiled core not available here: {other}")
    assert other == "compiled"
    got = _digest(tmp_path / "pure")
    assert "hbm_pcs.parquet" in got
    assert got == _digest(tmp_path / "default")
    # hops.parquet keeps statistics where a reader can skip by them (``critpred`` scans
    # ``queue_ns``), none on the dictionary column ``stage`` (every row group has its values)
    import pyarrow.parquet as pq
    rg = pq.ParquetFile(tmp_path / "default" / "hops.parquet").metadata.row_group(0)
    stats = {rg.column(i).path_in_schema: rg.column(i).statistics for i in range(rg.num_columns)}
    assert stats["stage"] is None
    assert stats["queue_ns"].has_min_max and stats["op_id"].has_min_max


def test_pure_core_says_so_once(monkeypatch):
    from kbtrace.replay.fabric.fast import FastFabric
    monkeypatch.setattr(core, "status", lambda: (FastFabric, "not built"))
    monkeypatch.setattr(core, "_warned", False)
    monkeypatch.setattr(core, "_tty", lambda: False)       # a pipe: nothing said
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert core.fast_fabric() is FastFabric
    assert seen == []
    monkeypatch.setattr(core, "_tty", lambda: True)        # a terminal: said once
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert core.fast_fabric() is FastFabric
        assert core.fast_fabric() is FastFabric
    assert [str(w.message) for w in seen] == [
        "kbtrace: fast replay runs its pure-Python core (not built); results are identical, "
        "only slower"]
    assert seen[0].category is core.PurePythonCore


def test_a_compiled_core_older_than_its_source_is_not_used(monkeypatch):
    """A twin whose recorded source hash differs from today's source: the reference runs."""
    from kbtrace.replay.fabric.fast import FastFabric
    suffix = ".cpython-311-x86_64-linux-gnu.so"
    monkeypatch.setattr(core, "_ext_suffixes", lambda: [suffix])
    for name, ref in core.CORE.items():
        fake = types.ModuleType(name)
        fake.__file__ = f"/x/{name.rpartition('.')[2]}{suffix}"
        fake.SOURCE_SHA256 = core.source_digest(ref)
        fake.FastFabric = type("CompiledFastFabric", (), {})
        monkeypatch.setitem(sys.modules, name, fake)
    monkeypatch.delenv(core.PURE_ENV, raising=False)
    core.status.cache_clear()
    try:
        cls, why = core.status()
        assert (cls.__name__, why) == ("CompiledFastFabric", "compiled")   # current: used
        monkeypatch.setattr(sys.modules["kbtrace.replay.fabric._booking_c"], "SOURCE_SHA256", "0")
        core.status.cache_clear()
        assert core.status() == (FastFabric, "built from an older booking.py or booking.pxd; "
                                              "rebuild with pip install -e .")
    finally:
        core.status.cache_clear()


def test_a_source_digest_covers_the_types_of_its_pxd(tmp_path):
    """Changing only a module's ``.pxd`` (its types) changes its digest, so a twin built
    before is not used; a module without one is digested by its ``.py`` alone."""
    py, pxd = tmp_path / "m.py", tmp_path / "m.pxd"
    py.write_text("def f(x):\n    return x + 1\n")
    alone = core.source_digest(py)
    assert alone == hashlib.sha256(py.read_bytes()).hexdigest()
    pxd.write_text("cpdef f(double x)\n")
    typed = core.source_digest(py)
    pxd.write_text("cpdef f(long x)\n")
    assert len({alone, typed, core.source_digest(py)}) == 3
    assert core.source_digest(py) == hashlib.sha256(py.read_bytes() + pxd.read_bytes()).hexdigest()


def test_fast_mode_pe_model_is_compiled_with_the_core(monkeypatch):
    """With the compiled core, fast mode's stations, servers and PE_CPU are the typed twins
    of ``stations.py`` / ``cpu.py`` (extension types: their fields are slots, not a
    ``__dict__``); switched off, the ``.py`` modules run (as flit mode's always do)."""
    from kbtrace.replay import cpu, stations
    if core.status()[1] != "compiled":
        if os.environ.get("CI"):
            pytest.fail(core.status()[1])
        pytest.skip(f"compiled core not available here: {core.status()[1]}")
    mod, cpu_cls = core.pe_model()
    assert (mod.__name__, cpu_cls.__module__) == ("kbtrace.replay.fabric._stations_c",
                                                  "kbtrace.replay.fabric._cpu_c")
    assert type(mod.Server.__dict__["t0"]).__name__ == "getset_descriptor"
    assert type(stations.Server.__dict__["t0"]).__name__ == "member_descriptor"
    assert mod.Server._ok is True and cpu_cls._ok is True      # what env.step reads
    assert issubclass(mod.DmaReadFast, mod.StageServer) and mod.Command is not stations.Command
    monkeypatch.setenv(core.PURE_ENV, "1")
    core.status.cache_clear()
    try:
        assert core.pe_model() == (stations, cpu.Cpu)
    finally:
        core.status.cache_clear()


def test_fast_mode_op_core_is_compiled_with_the_core(monkeypatch):
    """With the compiled core, fast mode's per-op work (``opcore.OpCore``: plans, issues,
    completions, HBM reads) and the recorder's completions (``rowbuf.DoneRows``) are the typed
    twins; switched off, the ``.py`` classes run (as flit mode's always do)."""
    from kbtrace.replay import opcore, rowbuf
    if core.status()[1] != "compiled":
        if os.environ.get("CI"):
            pytest.fail(core.status()[1])
        pytest.skip(f"compiled core not available here: {core.status()[1]}")
    cls = core.op_core()
    assert cls.__module__ == "kbtrace.replay.fabric._opcore_c"
    assert type(cls.__dict__["done"]).__name__ == "getset_descriptor"
    assert core.row_buffers()[2].__module__ == "kbtrace.replay.fabric._rowbuf_c"
    monkeypatch.setenv(core.PURE_ENV, "1")
    core.status.cache_clear()
    try:
        assert core.op_core() is opcore.OpCore
        assert core.row_buffers()[2] is rowbuf.DoneRows
    finally:
        core.status.cache_clear()


@pytest.mark.parametrize("compiled", [False, True])
def test_op_core_records_a_completion_flushes_a_full_batch_then_calls_back_in_order(
        tmp_path, compiled):
    """``OpCore.complete``: the completion record (a full batch flushed with it: the op's rows
    written, its ``t_end`` the later of now and its last row), the done flag, then the op's
    callbacks in registration order; the compiled twin the same."""
    import simpy

    from kbtrace.replay import opcore, rowbuf
    from kbtrace.replay.recorder import Recorder
    if compiled:
        if core.status()[1] != "compiled":
            pytest.skip(f"compiled core not available here: {core.status()[1]}")
        rows, cls = core.row_buffers(), core.op_core()
    else:
        rows, cls = (rowbuf.HopRows, rowbuf.CompactRows, rowbuf.DoneRows), opcore.OpCore
    rec = Recorder(tmp_path, 4, 0, 2, rows=rows)
    oc = cls(simpy.Environment(initial_time=2.5), None, rec, {}, None, 4, "fast")
    calls: list[str] = []
    oc.on_done(1, lambda: calls.append(f"a{rec.n_hops}"))
    oc.on_done(1, lambda: calls.append(f"b{oc.done[1]}"))
    oc.issue(0, 0.0)
    oc.issue(1, 0.5)
    rec.row(1, -1, 0, 5, -1, 0.5, 1.0, 0.5, 0.0, 0)
    assert not rec.dones.add(0, 0.0, 0.0, 0.25, "pe0")     # 1 pending row < batch_rows 2
    rec.row(1, -1, 0, 5, -1, 1.0, 3.0, 2.0, 0.0, 0)
    oc.complete(types.SimpleNamespace(op_id=1), 0.5, 0.75, "pe1")
    assert calls == ["a2", "b1"]                           # after the flush and the flag
    assert (rec.n_done, rec.dones.n, bytes(oc.done)) == (2, 0, b"\x00\x01\x00\x00")
    assert rec.t_end[:2].tolist() == [0.25, 3.0] and rec.t_start[1] == 0.75
    assert rec.engine[:3].tolist() == [0, 1, -1] and rec.engine_names == ["pe0", "pe1"]
    assert rec.iss.take().tolist() == [[0.0, 0.0], [0.5, 1.0]]
    rec.close()

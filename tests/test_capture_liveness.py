"""Where written buffers die in an execution order (``capture._liveness``): what verify's
image forgets, and that a verify forgetting them gives the same report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from kbtrace import schema
from kbtrace.capture import _liveness as lv

HBM, T0, T1, S0, S1 = 0x1000, 0x8000, 0x8020, 0x9000, 0x9100


def _ops(rows: list[dict]) -> pa.Table:
    cols = {n: [r.get(n) for r in rows] for n in lv.ACCESS_COLUMNS}
    for n in ("in_addrs", "in_shapes", "in_dtypes", "mem_strides"):
        cols[n] = [v or [] for v in cols[n]]
    return pa.table({n: pa.array(v, schema.OPS.field(n).type if n != "kind" and n != "out_dtype"
                                 else pa.string()) for n, v in cols.items()})


def _load(i: int, src: int, dst: int, strides: list[int] | None = None) -> dict:
    return dict(op_id=i, kind="load", src_addr=src, dst_addr=dst, out_shape=[2, 4],
                out_dtype="i32", mem_strides=strides or [])


def _math(i: int, ins: list[tuple[int, list[int]]], dst: int, kind: str = "math") -> dict:
    return dict(op_id=i, kind=kind, dst_addr=dst, in_addrs=[a for a, _ in ins],
                in_shapes=[s for _, s in ins], in_dtypes=["i32"] * len(ins), out_shape=[2, 4],
                out_dtype="i32")


TRACE = [
    _load(0, HBM, T0),                                  # T0 written (32 B)
    _load(1, HBM + 64, T1, [16, 1]),                    # T1 written; reads a strided tile
    _math(2, [(T0, [2, 4]), (T1, [2, 4])], S0, "dot"),  # reads T0, T1; S0 written
    dict(op_id=3, kind="store", src_addr=S0, dst_addr=HBM + 4096, out_shape=[2, 4],
         out_dtype="i32", mem_strides=[]),              # reads S0 (an output span)
    _load(4, HBM, T0),                                  # T0 written again
    _math(5, [(T0, [2, 4]), (T1 + 16, [4])], S1),       # reads T0 and half of T1
    _math(6, [(S1, [2, 4])], S1),                       # reads S1, writes it in place
]


def test_accesses_are_the_executors_reads_and_writes():
    acc = lv.accesses(_ops(TRACE))
    got = sorted(zip(acc["op_id"].tolist(), acc["addr"].tolist(), acc["nbytes"].tolist(),
                     acc["write"].tolist(), acc["dirty"].tolist(), strict=True))
    assert got == sorted([
        (0, HBM, 32, False, False), (0, T0, 32, True, True),
        (1, HBM + 64, 4 * (1 + 16 + 3), False, False), (1, T1, 32, True, True),
        (2, T0, 32, False, False), (2, T1, 32, False, False), (2, S0, 32, True, True),
        (3, S0, 32, False, False), (3, HBM + 4096, 32, True, False),
        (4, HBM, 32, False, False), (4, T0, 32, True, True),
        (5, T0, 32, False, False), (5, T1 + 16, 16, False, False), (5, S1, 32, True, True),
        (6, S1, 32, False, False), (6, S1, 32, True, True)])


def test_a_write_dies_after_its_last_read_in_the_order_given():
    def acc():                      # (``drops`` empties what it is given)
        return lv.accesses(_ops(TRACE))

    at, addr, nb = lv.drops(acc(), np.arange(7), [])
    # T0 after the dot reads it, S0 after the store, T0 again after op 5; S1's first write
    # is read by op 6, which writes S1 again (no drop), its second write by nothing; T1 is
    # read in part by op 5 (not a slot: never dropped), HBM by strided tiles
    assert (at.tolist(), addr.tolist(), nb.tolist()) == (
        [2, 3, 5, 6], [T0, S0, T0, S1], [32, 32, 32, 32])
    # another order (op 5 before op 4 reloads T0: it reads the first T0): the same rule
    at, addr, _ = lv.drops(acc(), np.array([0, 1, 2, 3, 5, 4, 6]), [])
    assert (at.tolist(), addr.tolist()) == ([3, 4, 5, 6], [S0, T0, T0, S1])
    # spans read after the ops (outputs) are never dropped, nor what overlaps them
    at, addr, _ = lv.drops(acc(), np.arange(7), [(S0 + 8, 4), (S1, 32)])
    assert (at.tolist(), addr.tolist()) == ([2, 5], [T0, T0])


def test_last_reads_are_each_tile_address_last_load_in_the_order_given():
    acc = lv.accesses(_ops(TRACE))
    assert acc["tile"].tolist() == [(w is False and k in (0, 1, 4)) for w, k in zip(
        acc["write"].tolist(), acc["op_id"].tolist(), strict=True)]
    # HBM is tile-read by ops 0 and 4, HBM + 64 by op 1 (T0, T1 are read by other ops only)
    at, addr = lv.last_reads(acc, np.arange(7))
    assert (at.tolist(), addr.tolist()) == ([1, 4], [HBM + 64, HBM])
    at, addr = lv.last_reads(acc, np.array([5, 6, 2, 3, 0, 1, 4]))   # op 4 first, op 1 last
    assert (at.tolist(), addr.tolist()) == ([5, 6], [HBM, HBM + 64])
    at, addr, _ = lv.drops(acc, np.arange(7), [])    # (``drops`` ignores the tile reads)
    assert (at.tolist(), addr.tolist()) == ([2, 3, 5, 6], [T0, S0, T0, S1])


def test_verify_forgets_dead_buffers_with_the_same_report(tmp_path, monkeypatch):
    """gemm on small.yaml with a tight TCM (buffers reused): after verify's ops the image
    holds no buffer's bytes as an array (every one was dead), where it held all 384 of
    them; the report is the same either way."""
    from kbtrace.analysis import verifier
    from kbtrace.capture import capture
    from kbtrace.capture.image import MemoryImage, _Dead
    from kbtrace.replay import ReplayOptions, replay
    from kbtrace.topology import compile_topology

    root = Path(__file__).resolve().parents[1]
    topo = compile_topology(root / "topologies" / "small.yaml",
                            overrides={"pe.tcm.size_kb": 64, "pe.tcm.scratch_kb": 32})
    tr = capture(root / "capture" / "gemm.py", topo, {"M": 256, "N": 256, "K": 512},
                 tmp_path / "trace")
    replay(tr, topo, ReplayOptions(out_dir=str(tmp_path / "run")))
    held: list[tuple[int, int, int]] = []
    execute = verifier._execute

    machines, pages = [], []
    references = verifier._references

    def spy(machine, *a):           # type: ignore[no-untyped-def]
        machines.append(machine)
        execute(machine, *a)
        d = machine.mem._dirty
        held.append((sum(v.__class__ is not _Dead for v in d.values()),
                     sum(v.__class__ is _Dead for v in d.values()), len(machine.mem._cache)))

    def refs_spy(path):             # type: ignore[no-untyped-def]
        pages.append(len(machines[-1].mem._pages))
        return references(path)

    monkeypatch.setattr(verifier, "_execute", spy)
    monkeypatch.setattr(verifier, "_references", refs_spy)
    forgot = verifier.verify(tmp_path / "run")
    monkeypatch.setattr(MemoryImage, "drop", lambda self, spans: None)
    monkeypatch.setattr(MemoryImage, "forget_reads_at", lambda self, addrs: None)
    kept = verifier.verify(tmp_path / "run")
    # the A and B tiles' cached reads (8 x 8 + 8 x 8 = 128) are forgotten after their last
    # loads: nothing is left cached (the C tiles' stores go to the pages)
    assert held == [(0, 384, 0), (384, 0, 128)]
    # the image's pages (the inputs, the output) are gone before the references are read
    assert pages == [0, 0] and len(machines[0].mem._pages) == 0
    assert forgot.ok and forgot.n_ops == 1_664
    assert forgot.render("json") == kept.render("json")


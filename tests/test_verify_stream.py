"""verify reads the trace in batches and spills (``analysis/_traceops.py``): the same ops in
the same order as from the whole table, the same results, nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kbtrace import schema
from kbtrace._io import write_json, write_table
from kbtrace.analysis import _traceops
from kbtrace.analysis.verifier import execution_order, verify
from kbtrace.capture import capture
from kbtrace.capture import executor as ex
from kbtrace.errors import SchemaError
from kbtrace.replay import ReplayOptions, replay

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "topologies" / "small.yaml"


@pytest.fixture(scope="module")
def gemm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("stream")
    capture(ROOT / "capture" / "gemm.py", SMALL, out_dir=d / "t")
    replay(d / "t", SMALL, ReplayOptions(out_dir=str(d / "r")))
    return d / "r"


def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 100 ops, buckets of 64 positions, at most 4 buckets."""
    monkeypatch.setattr(_traceops, "READ_ROWS", 100)
    monkeypatch.setattr(_traceops, "SPILL_ROWS", 64)
    monkeypatch.setattr(_traceops, "MAX_BUCKETS", 4)


@pytest.mark.parametrize("small", [False, True])
def test_ops_come_in_execution_order_as_from_the_whole_table(gemm_run: Path, monkeypatch,
                                                             small: bool) -> None:
    trace = gemm_run.parent / "t"
    ops, timing = pq.read_table(trace / "ops.parquet"), pq.read_table(gemm_run / "op_timing.parquet")
    order = execution_order(ops, timing)
    cols = [c for c in ex.op_columns(ops) if c in ex.EXEC_FIELDS]
    want = ex.exec_ops_from_table(ops.take(pa.array(order)), cols)   # op_id = row
    if small:
        _small(monkeypatch)
    with _traceops.TraceOps(trace / "ops.parquet", ex.EXEC_FIELDS) as t:
        assert t.columns == cols
        assert len(t.starts) - 1 == (-(-ops.num_rows // 100) if small else 1)
        batches = list(t.in_order(np.asarray(order), 50))
    assert [op for b in batches for op in b] == want
    assert max(len(b) for b in batches) == 50 and len(want) == 512
    assert t.graph is not None and t.graph.column("op_id").to_pylist() == list(range(len(want)))



@pytest.mark.parametrize("small", [False, True])
def test_accesses_come_back_from_their_spill_as_from_the_whole_table(
        gemm_run: Path, monkeypatch, small: bool) -> None:
    """The memory accesses written to a file batch by batch (not held while verify validates
    the trace and finds the order) come back as ``_liveness.accesses`` of the batches,
    joined: the same arrays, dtypes and rows (512 ops, 6 batches of 100 when small), once."""
    from kbtrace.capture import _liveness as lv

    trace = gemm_run.parent / "t"
    ops = pq.read_table(trace / "ops.parquet", columns=list(lv.ACCESS_COLUMNS))
    rows = 100 if small else ops.num_rows
    want = lv.concat([lv.accesses(ops.slice(a, rows)) for a in range(0, ops.num_rows, rows)])
    if small:
        _small(monkeypatch)
    with _traceops.TraceOps(trace / "ops.parquet", ex.EXEC_FIELDS, access=True) as t:
        assert len(t.starts) - 1 == (6 if small else 1)
        got = t.take_accesses()
        with pytest.raises(AssertionError):
            t.take_accesses()
    assert list(got) == list(want) and len(got["addr"]) == len(want["addr"]) > 512
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k

def test_small_batches_give_the_same_verdict_and_text(gemm_run: Path, monkeypatch,
                                                      tmp_path: Path) -> None:
    """Many batches and buckets: the same result; the spills are unnamed (or removed), so
    the temporary directory stays empty while verify runs and after."""
    whole = verify(gemm_run)
    _small(monkeypatch)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    seen: list[list[str]] = []
    res = verify(gemm_run, progress=lambda done, total: seen.append(os.listdir(tmp)))
    assert res.ok and res.text() == whole.text() and res.to_dict() == whole.to_dict()
    assert len(seen) > 2 and not any(seen) and os.listdir(tmp) == []


def test_an_unpaired_ipcq_op_found_across_batches_is_named(tmp_path: Path, monkeypatch) -> None:
    """The IPCQ pairing is checked over every batch at the end; the op it names is read
    back from the file (op_id, kind, launch, program, seq)."""
    from test_analysis_verify import _memory_table, _ops_table, _timing_table  # type: ignore

    trace, run = tmp_path / "trace", tmp_path / "run"
    ops = _ops_table()
    match = ops.column("match_op_id").to_pylist()
    match[6] = 4                       # the recv names the store, not its send
    ops = ops.set_column(ops.schema.get_field_index("match_op_id"), "match_op_id",
                         pa.array(match, ops.schema.field("match_op_id").type))
    write_table(trace / "ops.parquet", ops)
    write_table(trace / "memory.parquet", _memory_table())
    write_table(run / "op_timing.parquet", _timing_table({i: (i, i + 1) for i in range(9)}))
    write_json(run / "run.json", {"run_id": "v", "trace_dir": str(trace),
                                  "schema_version": schema.SCHEMA_VERSION})
    monkeypatch.setattr(_traceops, "READ_ROWS", 4)
    with pytest.raises(SchemaError) as e:
        verify(run)
    assert str(e.value) == (f"{trace / 'ops.parquet'}: op 6 (recv, launch 0, program 1, seq 0): "
                            "its IPCQ match op 4 is a store, not a send (sends and receives "
                            "must be paired); re-capture the workload")


def test_references_are_read_again_from_their_row_groups_only(tmp_path: Path,
                                                                monkeypatch) -> None:
    """Verify reads the references once the ops ran, decoding only the row groups whose
    statistics may hold them: with memory.parquet written in small batches (reference
    blocks in row groups of their own) the report is the one of the single-batch trace,
    and a changed reference still fails."""
    from kbtrace.analysis import verifier
    from kbtrace.capture import trace as T

    capture(ROOT / "capture" / "gemm.py", SMALL, {"M": 64, "N": 64, "K": 64},
            out_dir=tmp_path / "one")
    replay(tmp_path / "one", SMALL, ReplayOptions(out_dir=str(tmp_path / "r1")))
    monkeypatch.setattr(T, "MEMORY_BATCH_BYTES", 3000)
    capture(ROOT / "capture" / "gemm.py", SMALL, {"M": 64, "N": 64, "K": 64},
            out_dir=tmp_path / "many")
    replay(tmp_path / "many", SMALL, ReplayOptions(out_dir=str(tmp_path / "r2")))
    path = tmp_path / "many" / "memory.parquet"
    meta = pq.ParquetFile(path).metadata
    roles = [set(pq.ParquetFile(path).read_row_group(g, columns=["role"]).column(0).to_pylist())
             for g in range(meta.num_row_groups)]
    with_refs = [g for g, r in enumerate(roles) if "reference" in r]
    assert roles == [{"input"}, {"input"}, {"output"}] + [{"reference"}] * 3
    assert with_refs == [3, 4, 5]
    read: list[list[int]] = []
    real = pq.ParquetFile.read_row_groups

    def spy(self, groups, *a, **k):      # type: ignore[no-untyped-def]
        read.append(list(groups))
        return real(self, groups, *a, **k)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    refs = verifier._references(path)
    assert read == [with_refs]
    assert set(refs.column("role").to_pylist()) == {"reference"}
    assert refs.num_rows == sum(r == "reference" for r in pq.read_table(
        path, columns=["role"]).column(0).to_pylist())
    one, many = verify(tmp_path / "r1"), verify(tmp_path / "r2")
    assert one.ok and many.ok
    assert one.render("json").replace("r1", "r2") == many.render("json")
    # the comparison is made with what it read: a reference block changed there fails
    def changed(p):                  # type: ignore[no-untyped-def]
        t = refs
        data = t.column("data").to_pylist()
        data[1] = bytes(len(data[1]))
        return t.set_column(t.schema.get_field_index("data"), "data",
                            pa.array(data, t.schema.field("data").type))

    monkeypatch.setattr(verifier, "_references", changed)
    bad = verify(tmp_path / "r2")
    block = np.frombuffer(refs.column("data")[1].as_py(), np.float32)
    assert not bad.ok and bad.tensors[0].n_bad == np.count_nonzero(block) > 0

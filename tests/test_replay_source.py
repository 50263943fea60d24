"""Replay reads its trace once in batches and feeds each program's ops as it runs (issue 22):
the records alive at a time are bounded by the feed chunk, not by the trace, and nothing in
the outputs depends on how the trace was chunked."""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kbtrace import schema
from kbtrace._io import ROW_GROUP_SIZE, write_table
from kbtrace.replay import ReplayOptions, replay, source
from kbtrace.replay.ops import Op
from kbtrace.replay.recorder import Recorder
from kbtrace.replay.source import OpSource
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR, SynthTrace, hbm, load, on


@pytest.fixture(scope="module")
def tiny():
    return compile_topology(TOPO_DIR / "tiny.yaml")


def _two_programs(tiny, n: int) -> SynthTrace:
    """``n`` loads on each of two PEs, interleaved in op_id order as capture may write them."""
    rows = []
    for i in range(n):
        for pe in (0, 1):
            rows.append(load(hbm(0, 0, pe, tiny, (i % 8) * 4096), 4096,
                             pe=pe, program=pe, seq=i))
    return SynthTrace(rows, name=f"two{n}")


def test_feed_gives_a_programs_ops_in_seq_order_a_chunk_at_a_time(tiny, monkeypatch):
    monkeypatch.setattr(source, "FEED_ROWS", 16)
    src = OpSource(_two_programs(tiny, 100).ops())
    try:
        assert src.n == 200 and sorted(src.progs) == [(0, 0), (0, 1)]
        assert src.used == {(0, 0, 0), (0, 0, 1)} and src.first == {0: 0}
        feed = src.feed(0, 1)
        assert len(feed) == 100 and feed.coord == (0, 0, 1)
        seen = []
        for i in range(len(feed)):
            seen.append(feed[i].op_id)
            assert len(feed._ops) <= 16          # one chunk of records at a time
        assert seen == list(range(1, 200, 2))
        with pytest.raises(IndexError):
            feed[0]                              # consumed: records are not kept
        # iterated, as the PE_CPU reads it: the same ops in the same order
        assert [o.op_id for o in src.feed(0, 1)] == list(range(1, 200, 2))
    finally:
        src.close()
    assert not src._spill.exists()


def test_program_out_of_seq_order_is_sorted_whole(tiny):
    rows = [load(hbm(0, 0, 0, tiny, i * 4096), 4096, seq=s) for i, s in
            enumerate((2, 0, 1, 1))]
    src = OpSource(SynthTrace(rows).ops())
    try:
        feed = src.feed(0, 0)
        assert [feed[i].op_id for i in range(4)] == [1, 2, 3, 0]   # stable by seq
        assert [o.op_id for o in src.feed(0, 0)] == [1, 2, 3, 0]
    finally:
        src.close()


def test_records_alive_are_bounded_by_the_feed_not_the_trace(tiny, tmp_path, monkeypatch):
    """Mid-run, far fewer ``Op`` records exist than the trace has ops."""
    monkeypatch.setattr(source, "FEED_ROWS", 8)
    tr = _two_programs(tiny, 400)
    alive = []

    def count():
        return sum(type(o) is Op for o in gc.get_objects())

    base = count()         # what earlier tests may still hold

    def probe(p):
        alive.append(count() - base)

    import kbtrace.replay.engine as engine
    monkeypatch.setattr(engine, "PROGRESS_EVERY", 256)
    replay(tr, tiny, ReplayOptions(out_dir=str(tmp_path / "run")), progress=probe)
    assert len(alive) > 3 and max(alive) < 100, alive      # 800 ops in the trace


def test_outputs_do_not_depend_on_the_chunking(tiny, tmp_path, monkeypatch):
    tr = _two_programs(tiny, 60)
    runs = []
    for rows in (4, 1 << 8):
        monkeypatch.setattr(source, "FEED_ROWS", rows)
        monkeypatch.setattr(source, "READ_ROWS", rows * 3)
        runs.append(replay(tr, tiny, ReplayOptions(out_dir=str(tmp_path / f"r{rows}"))).run_dir)
    for f in ("op_timing.parquet", "hops.parquet"):
        assert (runs[0] / f).read_bytes() == (runs[1] / f).read_bytes(), f


def test_op_timing_streamed_is_the_table_written_whole(tmp_path):
    """More than one row group, engines first used out of op_id order: the streamed file is
    byte for byte what writing one whole, sorted table gave."""
    n = ROW_GROUP_SIZE + 4_500
    rng = np.random.default_rng(7)
    names = [f"sip0.cube0.pe{i}.dma" for i in range(5)]
    rec = Recorder(tmp_path, n, 1, 1024)
    done = rng.permutation(n)                            # completion order
    eng = rng.integers(0, 5, n)
    for i in done.tolist():
        rec.op_done(i, 1.0, 2.0, 3.0, names[eng[i]])
    rec.t_issue[:] = rng.random(n)
    rec.t_start[:] = rng.random(n)
    rec.t_end[:] = rng.random(n)
    rec.queue[:] = rng.random(n)
    ids = pa.table({
        "op_id": pa.array(np.arange(n), pa.int64()), "launch": pa.array(np.zeros(n, np.int32)),
        "program": pa.array(np.arange(n, dtype=np.int32) % 3), "sip": pa.array(np.zeros(n, np.int16)),
        "cube": pa.array(np.zeros(n, np.int16)), "pe": pa.array(np.zeros(n, np.int16)),
        "seq": pa.array(np.arange(n, dtype=np.int32)),
        "kind": pa.array(np.where(np.arange(n) % 2, "load", "dot")).dictionary_encode(),
        "name": pa.array(np.where(np.arange(n) % 3, "load", "dot")).dictionary_encode(),
        "nbytes": pa.array(np.arange(n) * 4, pa.int64())})
    rec.write_op_timing(tmp_path / "streamed.parquet", ids.to_batches(10_000))
    engine = [names[e] for e in eng.tolist()]
    whole = pa.table({**{c: ids.column(c) for c in ids.column_names if c != "nbytes"},
                      "engine": pa.array(engine, pa.string()).dictionary_encode(),
                      "t_issue_ns": rec.t_issue, "t_start_ns": rec.t_start,
                      "t_end_ns": rec.t_end, "queue_ns": rec.queue,
                      "nbytes": ids.column("nbytes")}).sort_by("op_id")
    whole = pa.Table.from_arrays([whole.column(f.name).cast(f.type) for f in schema.OP_TIMING],
                                 schema=schema.OP_TIMING)
    write_table(tmp_path / "whole.parquet", whole)
    assert pq.ParquetFile(tmp_path / "streamed.parquet").metadata.num_row_groups == 2
    assert (tmp_path / "streamed.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    rec.hops.abort()


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/fd"),
                    reason="the spill is unlinked at once only where /proc/self/fd exists")
def test_the_spill_has_no_name_while_the_replay_runs(tiny, tmp_path, monkeypatch):
    """A replay killed by a signal must leave nothing in the temporary directory: the spill
    file is unlinked as soon as it is open and read back through its descriptor."""
    import tempfile

    spill_dir = tmp_path / "tmp"
    spill_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill_dir))
    import kbtrace.replay.engine as engine
    monkeypatch.setattr(engine, "PROGRESS_EVERY", 64)
    seen: list[list[str]] = []
    tr = _two_programs(tiny, 200)
    run = replay(tr, tiny, ReplayOptions(out_dir=str(tmp_path / "run")),
                 progress=lambda p: seen.append(sorted(x.name for x in spill_dir.iterdir())))
    assert len(seen) > 3 and not any(seen), seen      # mid-run: no file by any name
    assert list(spill_dir.iterdir()) == []
    monkeypatch.setattr(tempfile, "tempdir", None)
    again = replay(tr, tiny, ReplayOptions(out_dir=str(tmp_path / "again")))
    for f in ("op_timing.parquet", "hops.parquet"):
        assert (run.run_dir / f).read_bytes() == (again.run_dir / f).read_bytes()


def test_columns_become_python_values_as_to_pylist_gives_them():
    """A feed batch's columns are read through numpy (``source._pylist``, ``_tuples_of``):
    the values, their types and the nulls are what ``to_pylist`` (then ``ops._tuples``) gives,
    sliced or not."""
    from kbtrace.replay.ops import _tuples
    big = 2**64 - 5
    cols = {
        "i16": pa.array([3, None, -7, 0, None], pa.int16()),
        "u64": pa.array([big, 1, None, 2**63, 0], pa.uint64()),
        "i64": pa.array([1, 2, 3, 4, 5], pa.int64()),
        "none": pa.array([None] * 5, pa.int32()),
        "flag": pa.array([True, False, True, True, False]),
        "s": pa.array(["a", None, "bc", "", "a"]),
    }
    for name, arr in cols.items():
        for a in (arr, arr.slice(1, 3)):
            got = source._pylist(a)
            assert got == a.to_pylist(), name
            assert [type(x) for x in got] == [type(x) for x in a.to_pylist()], name
    assert source._pylist(cols["u64"]) == [big, 1, None, 2**63, 0]
    lists = {
        "ints": (pa.array([[1, 2], None, [], [big], [None, 4]], pa.list_(pa.uint64())), False),
        "strs": (pa.array([["tcm", "hbm"], [], None, ["hbm"], ["tcm", "hbm"]],
                          pa.list_(pa.string())), False),
        "nested": (pa.array([[[1, 2], [3]], None, [], [[4], None, []], [[1, 2], [3]]],
                            pa.list_(pa.list_(pa.int64()))), True),
    }
    for name, (arr, nested) in lists.items():
        for a in (arr, arr.slice(1, 4)):
            memo: dict = {}
            got = source._tuples_of(a, memo, nested)
            assert got == _tuples(a.to_pylist(), None, nested), name
    got = source._tuples_of(lists["nested"][0], {}, True)
    assert got == [((1, 2), (3,)), (), (), ((4,), None, ()), ((1, 2), (3,))]
    assert got[0] is got[4]             # equal tuples shared through the memo


def test_records_are_the_rows_values_through_the_template_coding(monkeypatch):
    """Records built from per-template values and the varying columns (``spillcode``) hold
    what ``load_ops`` (the column-wise conversion) gives for every field, with its type:
    list columns with nulls inside, strings holding separators, nullable scalars, equal
    values spread over read batches, the varying columns (ops.VARYING) sliced per program."""
    from kbtrace.replay.ops import _FIELDS, TEMPLATE, load_ops
    monkeypatch.setattr(source, "READ_ROWS", 7)       # templates met again in later batches
    monkeypatch.setattr(source, "FEED_ROWS", 4)
    rng = np.random.default_rng(3)
    shapes = [[], [[32, 64], [64, 32]], [[1], None, []], [[2**40, -3]], [[32, 64]], [[]]]
    spaces = [[], ["tcm", "hbm"], ["tcm", None], ["a\x1fb"], ["a", "b"], ["ab"]]
    rows = []
    for i in range(60):
        v = int(rng.integers(0, 8))           # the call: its template fields follow from it
        k = v % 3
        rows.append({**on(program=i % 3, pe=i % 3, seq=i // 3),
                     "kind": ("load", "dot", "math")[k], "name": ("load", "dot", "exp")[k],
                     "is_async": v % 2 == 1, "src_addr": int(rng.integers(0, 9)),
                     "in_shapes": shapes[v % len(shapes)], "in_spaces": spaces[v % len(spaces)],
                     "in_dtypes": [["f32"], [], ["f16", "i8"]][v % 3],
                     "out_shape": [[32, 32], [], [7]][v // 3], "m": [None, 32, 64][v % 3],
                     "k": 16 if k == 1 else None, "extra_json": [None, '{"a": 1}'][v // 4],
                     "in_addrs": [int(x) for x in rng.integers(0, 2**40, int(rng.integers(0, 3)))],
                     "deps": list(range(max(0, i - int(rng.integers(0, 3))), i))})
    table = SynthTrace(rows).ops()
    want = load_ops(table)
    src = OpSource(table)
    try:
        got = [src.feed(0, p)[i] for p in range(3) for i in range(20)]
        assert sorted(o.op_id for o in got) == list(range(60))
        for o in got:
            w = want[o.op_id]
            for f in _FIELDS:
                assert getattr(o, f) == getattr(w, f), (o.op_id, f)
                assert type(getattr(o, f)) is type(getattr(w, f)), (o.op_id, f)
        distinct = {tuple(repr(getattr(w, f)) for f in TEMPLATE) for w in want}
        assert len(src.coder.templates) == len(distinct) == 8
        nested = [o for o in got if o.in_shapes == ((1,), None, ())]
        assert len(nested) > 1 and all(o.in_shapes is nested[0].in_shapes for o in nested)
    finally:
        src.close()


@pytest.mark.parametrize(("n", "hi"), [(3000, 5), (100, 2000)])
def test_groups_are_the_distinct_rows_in_order(n, hi):
    """``spillcode._groups``: per row the index of its distinct row (in row-tuple order) and
    each one's first row, as ``np.unique`` over the rows gives them, whether the combined
    key is narrow enough to count (3000 rows of 3 x 6 values) or is sorted (100 of 3 x 2000)."""
    from kbtrace.replay.spillcode import _groups
    rng = np.random.default_rng(n)
    cols = [rng.integers(0, 3, n), rng.integers(-hi // 2, hi - hi // 2, n)]
    _, first, inv = np.unique(np.stack(cols, 1), axis=0, return_index=True, return_inverse=True)
    got_inv, got_first = _groups(cols)
    assert got_inv.tolist() == inv.reshape(-1).tolist() and got_first.tolist() == first.tolist()
    assert len(first) == 18 if hi == 5 else len(first) > 90     # (every pair / most rows)

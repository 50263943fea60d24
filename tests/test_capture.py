"""End-to-end capture of every workload in capture/: determinism, op counts, numerics, IPCQ."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from kbtrace.capture import capture, execute, open_trace
from kbtrace.capture.dtypes import allclose
from kbtrace.capture.executor import reference_outputs
from kbtrace.errors import SchemaError
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ["gemm", "gemm_composite", "softmax", "ring_allreduce", "data_dependent", "attention",
             "gemm_sharded", "all_gather"]


@pytest.fixture(scope="module")
def small():
    return compile_topology(ROOT / "topologies" / "small.yaml")


def _wl(name: str) -> Path:
    return ROOT / "capture" / f"{name}.py"


@pytest.mark.parametrize("name", WORKLOADS)
def test_capture_twice_is_byte_identical(small, tmp_path, name):
    a = capture(_wl(name), small, out_dir=tmp_path / "a")
    b = capture(_wl(name), small, out_dir=tmp_path / "b")
    for f in ("ops.parquet", "memory.parquet", "trace.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert a.n_ops == b.n_ops > 0


def test_gemm_reference_in_k_blocks_equals_the_whole_product():
    """gemm's reference sums K blocks (bounded float64 copies); on integers it is exact."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gemm_wl", _wl("gemm"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(3)
    v = {"a": rng.integers(-99, 99, (8, 200)).astype(np.int32),
         "b": rng.integers(-99, 99, (200, 5)).astype(np.int32)}
    want = v["a"].astype(np.int64) @ v["b"].astype(np.int64)
    for block in (7, 64, 200, 4096):
        assert np.array_equal(mod.reference(v, block=block), want)   # float32 blocks
    big = {"a": rng.integers(-2**20, 2**20, (8, 200)).astype(np.int32),
           "b": rng.integers(-2**20, 2**20, (200, 5)).astype(np.int32)}
    want = big["a"].astype(np.int64) @ big["b"].astype(np.int64)     # sums past 2**24
    for block in (7, 200):
        got = mod.reference(big, block=block)
        assert got.dtype == np.float64 and np.array_equal(got, want)
    f = {"a": rng.standard_normal((8, 200)).astype(np.float32),
         "b": rng.standard_normal((200, 5)).astype(np.float32)}
    want = f["a"][:, :64].astype(np.float64) @ f["b"][:64].astype(np.float64)
    for k0 in range(64, 200, 64):
        want += f["a"][:, k0:k0 + 64].astype(np.float64) @ f["b"][k0:k0 + 64].astype(np.float64)
    assert np.array_equal(mod.reference(f, block=64), want)          # floats: float64 blocks


def test_memory_parquet_keeps_no_statistics_of_tensor_bytes(small, tmp_path):
    """The writer would copy each tensor value several times to find its min and max (and
    drop them when large): +3 GB at the peak for one 426 MiB tensor. The data column has
    none; every other column, nested ones included, keeps its statistics; ops.parquet keeps
    all of them."""
    capture(_wl("softmax"), small, out_dir=tmp_path)
    md = pq.ParquetFile(tmp_path / "memory.parquet").metadata
    cols = {md.row_group(0).column(i).path_in_schema: md.row_group(0).column(i)
            for i in range(md.num_columns)}
    assert cols["data"].statistics is None
    assert cols["shape.list.element"].statistics.has_min_max
    assert cols["tensor"].statistics.has_min_max and cols["nbytes"].statistics.has_min_max
    ops = pq.ParquetFile(tmp_path / "ops.parquet").metadata.row_group(0)
    assert all(ops.column(i).statistics is not None for i in range(ops.num_columns))


@pytest.mark.parametrize("name", WORKLOADS)
def test_executor_reproduces_reference(small, tmp_path, name):
    tr = capture(_wl(name), small, out_dir=tmp_path)
    assert all(c["ok"] for c in tr.meta["reference_check"].values())
    t = open_trace(tmp_path)
    res = t.execute()
    refs = reference_outputs(t.memory())
    assert set(res.outputs) == set(refs) != set()
    dtypes = {r["tensor"]: r["dtype"] for r in t.memory().to_pylist()}
    for out, want in refs.items():
        assert allclose(res.outputs[out], want, dtypes[out]), out
    ops = t.ops()
    digests = dict(zip(ops.column("op_id").to_pylist(), ops.column("out_digest").to_pylist(),
                       strict=True))
    assert res.digests == {k: v for k, v in digests.items() if v is not None}


def test_gemm_op_counts_via_duckdb(small, tmp_path):
    # M=N=K=128, tiles 32/64/32: MT=NT=4, KT=2 -> 2*4*4*2 loads, 4*4*2 dots, 16 fills, 16 stores
    capture(_wl("gemm"), small, params=["M=128", "N=128", "K=128"], out_dir=tmp_path)
    path = str(tmp_path / "ops.parquet")
    rows = duckdb.sql(f"SELECT kind, count(*) FROM '{path}' GROUP BY kind ORDER BY kind").fetchall()
    assert rows == [("dot", 32), ("fill", 16), ("load", 64), ("store", 16)]
    gemm = duckdb.sql(f"SELECT DISTINCT m, n, k FROM '{path}' WHERE kind = 'dot'").fetchall()
    assert gemm == [(32, 32, 64)]
    nbytes = duckdb.sql(f"SELECT sum(nbytes) FROM '{path}' WHERE kind = 'load'").fetchall()[0][0]
    assert nbytes == 32 * (32 * 64 * 4) + 32 * (64 * 32 * 4)
    # 16 tiles over 32 programs: programs 0..15 get one tile each, in program order
    progs = duckdb.sql(f"SELECT DISTINCT program FROM '{path}' ORDER BY 1").fetchall()
    assert [p for (p,) in progs] == list(range(16))
    ids = duckdb.sql(f"SELECT op_id FROM '{path}'").fetchall()
    assert [i for (i,) in ids] == list(range(128))


def test_gemm_default_and_deps(small, tmp_path):
    tr = capture(_wl("gemm"), small, out_dir=tmp_path)
    assert tr.op_counts == {"load": 256, "dot": 128, "fill": 64, "store": 64}
    ops = {r["op_id"]: r for r in tr.ops().to_pylist()}
    for r in ops.values():
        if r["kind"] == "dot":
            kinds = sorted(ops[d]["kind"] for d in r["deps"])
            assert kinds in (["fill", "load", "load"], ["dot", "load", "load"])
        if r["kind"] == "store":
            assert [ops[d]["kind"] for d in r["deps"]] == ["dot"]
            assert r["mem_strides"] == [256, 1]
    # placement: program (pid0, pid1) runs on cube pid1, PE pid0
    assert all(r["pe"] == r["pid0"] and r["cube"] == r["pid1"] for r in ops.values())


def test_ring_allreduce_matched_send_recv_all_8_pes(small, tmp_path):
    tr = capture(_wl("ring_allreduce"), small, out_dir=tmp_path)
    ops = tr.ops().to_pylist()
    sends = {r["op_id"]: r for r in ops if r["kind"] == "send"}
    recvs = {r["op_id"]: r for r in ops if r["kind"] == "recv"}
    assert len(sends) == len(recvs) == 8 * 14
    assert {r["pe"] for r in sends.values()} == {r["pe"] for r in recvs.values()} == set(range(8))
    for rid, r in recvs.items():
        s = sends[r["match_op_id"]]
        assert s["match_op_id"] == rid
        assert s["direction"] == "intra_E" and r["direction"] == "intra_W"
        assert s["peer_program"] == r["program"] and r["peer_program"] == s["program"]
        assert r["program"] == (s["program"] + 1) % 8
        assert s["ipcq_seq"] == r["ipcq_seq"] and r["deps"] == [s["op_id"]]
    seqs = sorted(r["ipcq_seq"] for r in sends.values() if r["program"] == 3)
    assert seqs == list(range(14))


def test_data_dependent_two_inputs_give_different_streams(small, tmp_path):
    a = capture(_wl("data_dependent"), small, params={"flag_seed": 1}, out_dir=tmp_path / "a")
    b = capture(_wl("data_dependent"), small, params={"flag_seed": 7}, out_dir=tmp_path / "b")
    names_a = [r for r in a.ops().select(["program", "name"]).to_pylist()]
    names_b = [r for r in b.ops().select(["program", "name"]).to_pylist()]
    assert names_a != names_b
    flags = a.memory().to_pylist()
    f = next(np.frombuffer(r["data"], np.int32) for r in flags if r["tensor"] == "flags")
    n_exp = sum(1 for r in names_a if r["name"] == "exp")
    n_clamp = sum(1 for r in names_a if r["name"] == "clamp")
    assert n_exp == int((f > 0).sum()) and n_clamp == int((f == 0).sum())
    for t in (a, b):
        assert t.meta["reference_check"]["y"]["ok"]


def test_open_trace_rejects_bad_dirs(small, tmp_path):
    with pytest.raises(SchemaError, match="no trace.json"):
        open_trace(tmp_path)
    capture(_wl("softmax"), small, out_dir=tmp_path)
    ops = tmp_path / "ops.parquet"
    data = ops.read_bytes()
    ops.write_bytes(data[:-10] + b"0123456789")
    with pytest.raises(SchemaError, match="content hash"):
        open_trace(tmp_path)
    ops.write_bytes(data)
    mem = tmp_path / "memory.parquet"
    mdata = mem.read_bytes()
    mid = len(mdata) // 2                 # a data page: the footer (schema) stays readable
    mem.write_bytes(mdata[:mid] + bytes([mdata[mid] ^ 0xFF]) + mdata[mid + 1:])
    with pytest.raises(SchemaError, match="memory.parquet: content hash"):
        open_trace(tmp_path)
    assert open_trace(tmp_path, hashed=("ops.parquet",)).n_ops > 0   # what replay checks
    mem.write_bytes(mdata)
    meta = (tmp_path / "trace.json").read_text().replace('"schema_version": "1.0"',
                                                           '"schema_version": "9.0"')
    (tmp_path / "trace.json").write_text(meta)
    with pytest.raises(SchemaError, match="schema 9.0"):
        open_trace(tmp_path)


def test_memory_table_and_trace_json(small, tmp_path):
    tr = capture(_wl("ring_allreduce"), small, out_dir=tmp_path)
    mem = pq.read_table(tmp_path / "memory.parquet").to_pylist()
    shards = [r for r in mem if r["role"] == "output"]
    assert [r["pe"] for r in shards] == list(range(8))
    assert all(r["shape"] == [1, 1024] and r["nbytes"] == 4096 for r in shards)
    assert [r["offset"] for r in shards] == [[i, 0] for i in range(8)]
    m = tr.meta
    assert m["topology"]["name"] == "small" and m["launches"][0]["grid"] == [8, 1]
    assert m["params"] == {"N": 1024, "P": 8, "dtype": "f32", "seed": 0}
    res = execute(tr.ops(), tr.memory())
    assert np.allclose(res.outputs["x"][0], res.outputs["x"][7])


def test_streaming_small_batches_hold_back_unmatched_sends(small, tmp_path, monkeypatch):
    import kbtrace.capture.tracer as tracer_mod
    ref = capture(_wl("ring_allreduce"), small, out_dir=tmp_path / "ref").ops()
    monkeypatch.setattr(tracer_mod, "BATCH_ROWS", 7)
    small_batches = capture(_wl("ring_allreduce"), small, out_dir=tmp_path / "b")
    pf = pq.ParquetFile(small_batches.ops_path)
    assert pf.metadata.num_row_groups > 10           # really written in many small batches
    assert small_batches.ops().to_pylist() == ref.to_pylist()   # every match_op_id filled in
    assert ref.column("match_op_id").null_count == ref.num_rows - 2 * 112


def test_cli_capture_and_trace_show(tmp_path, capsys):
    from kbtrace.cli import main
    out = tmp_path / "t"
    rc = main(["capture", str(_wl("gemm")), "-p", "M=128", "-p", "N=128",
               "--topology", str(ROOT / "topologies" / "small.yaml"), "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "captured gemm: 128 ops (dot=32, fill=16, load=64, store=16)" in text
    assert "output c (f32) matches its numpy reference" in text and str(out) in text
    assert main(["trace", "show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "launch 0: kernel gemm_kernel grid (8, 4) (32 programs), 128 ops" in text
    assert "16 PEs active" in text and "c (output, 1 shard)" in text
    assert "c (reference, 1 block)" in text
    assert main(["capture", str(_wl("gemm")), "-p", "M=abc", "-o", str(out)]) == 2
    assert "expected int" in capsys.readouterr().err
    assert main(["capture", str(_wl("all_gather")), "-p", "peer=3", "-o", str(out)]) == 2
    assert ("unknown parameter 'peer'; did you mean 'peers'? this workload takes N, R, dtype, "
            "peers, seed") in capsys.readouterr().err
    assert main(["capture", str(_wl("all_gather")), "-p", "zzz=3", "-o", str(out)]) == 2
    assert "unknown parameter 'zzz'; this workload takes N, R" in capsys.readouterr().err


@pytest.mark.parametrize("name, params, msg", [
    ("gemm_sharded", {"BM": 0}, "BM=0 must be >= 1"),
    ("gemm_sharded", {"M": 96}, "M=96 must split into whole BM=32-row tiles over 4 cubes: pass "
                                "a multiple of 128"),
    ("ring_allreduce", {"P": 0}, r"P=0 must be >= 1 \(the PEs in the ring\)"),
    ("ring_allreduce", {"P": 16}, "P=16 PEs but a cube of 'small' has 8; pass -p P=8 or less"),
    ("all_gather", {"peers": 33}, "peers=33 must be between 0 \\(all\\) and the 32 PEs of 'small'"),
    ("all_gather", {"R": 0}, "R=0 must be >= 1"),
])
def test_workload_parameters_are_checked_with_the_fix(small, tmp_path, name, params, msg):
    from kbtrace.errors import CaptureError

    with pytest.raises(CaptureError, match=msg):
        capture(_wl(name), small, params, tmp_path)


def test_memory_parquet_in_batches_and_reference_blocks(small, tmp_path, monkeypatch):
    """memory.parquet is written a few tensor bytes at a time, references in blocks along
    axis 0; reading it back gives the same inputs, outputs and references as one batch."""
    from kbtrace.capture import trace as T
    from kbtrace.capture.executor import reference_outputs
    whole = capture(_wl("gemm"), small, {"M": 64, "N": 64, "K": 64}, out_dir=tmp_path / "a")
    monkeypatch.setattr(T, "MEMORY_BATCH_BYTES", 1000)
    tiny = capture(_wl("gemm"), small, {"M": 64, "N": 64, "K": 64}, out_dir=tmp_path / "b")
    a, b = (pq.read_table(t.path / "memory.parquet") for t in (whole, tiny))
    refs_b = [r for r in b.drop_columns(["data"]).to_pylist() if r["role"] == "reference"]
    # c is 64 x 64 f32 = 256 B per row: 3 rows per 1000 B block
    assert [r["offset"] for r in refs_b] == [[lo, 0] for lo in range(0, 64, 3)]
    assert [r["shard"] for r in refs_b] == list(range(22))
    assert [r["shape"] for r in refs_b] == [[3, 64]] * 21 + [[1, 64]]
    assert pq.ParquetFile(tiny.path / "memory.parquet").num_row_groups > 1
    ra, rb = reference_outputs(a), reference_outputs(b)
    assert ra.keys() == rb.keys() == {"c"} and np.array_equal(ra["c"], rb["c"])
    assert [r for r in a.to_pylist() if r["role"] != "reference"] == \
        [r for r in b.to_pylist() if r["role"] != "reference"]     # inputs and outputs
    assert (tiny.path / "ops.parquet").read_bytes() == (whole.path / "ops.parquet").read_bytes()


def test_reference_blocks_round_trip_edge_shapes(monkeypatch):
    """0-d, empty and multi-block references come back from memory rows unchanged."""
    from types import SimpleNamespace

    import pyarrow as pa

    from kbtrace import schema
    from kbtrace.capture import trace as T
    from kbtrace.capture.executor import reference_outputs

    def tensor(name, shape):
        return SimpleNamespace(name=name, shape=shape, dtype="f32", shards=[], role="output")

    w = SimpleNamespace(tensors={"a": tensor("a", (0, 4)), "b": tensor("b", ()),
                                 "c": tensor("c", (5, 3))})
    refs = {"a": np.zeros((0, 4), np.float32), "b": np.float32(2.5),
            "c": np.arange(15, dtype=np.float32).reshape(5, 3)}
    monkeypatch.setattr(T, "MEMORY_BATCH_BYTES", 20)          # 12 B rows: one per block
    rows = list(T._memory_rows(w, refs))
    assert [r["shape"] for r, _d in rows] == [[0, 4], []] + [[1, 3]] * 5
    out = reference_outputs(pa.Table.from_arrays(T._memory_batch(rows), schema=schema.MEMORY))
    assert out["a"].shape == (0, 4) and out["b"].shape == () and float(out["b"]) == 2.5
    assert np.array_equal(out["c"], refs["c"])

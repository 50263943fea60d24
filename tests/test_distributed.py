"""The torch.distributed-like facade: rank = SIP, per-rank tensors, all_reduce, barrier."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

import kbtrace
from kbtrace.errors import CaptureError
from kbtrace.replay import ReplayOptions
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def four():
    return compile_topology(ROOT / "topologies" / "small.yaml",
                            overrides={"system.sips.count": 4, "system.sips.topology": "torus_2d"})


def _scale(tl, x_ptr, n):
    tl.store(x_ptr, tl.load(x_ptr, (n,), "f16") * 2.0)


def test_spawn_workers_all_reduce_and_barrier(four, tmp_path):
    seen = {}

    def build(w, p):
        dist = w.distributed()
        dist.init_process_group(backend="kbtrace")
        ts = {}

        def worker(rank):
            seen[rank] = (dist.get_rank(), dist.get_world_size())
            t = ts[rank] = w.tensor(f"g{rank}", (256,), "f16", np.full(256, rank + 1.0),
                                    pe=(rank, 0, 0))
            w.launch(_scale, args=(t, 256), sips=rank, cubes=0, pes=0)   # on the rank
            dist.all_reduce(t, algorithm="lrab", buffer_kind="sram")
            dist.barrier()
        dist.spawn(worker)
        assert dist.get_rank() == 0 and dist.is_initialized()
        for r, t in ts.items():
            w.output(t, reference=lambda v, r=r: np.full(256, 2.0 * (1 + 2 + 3 + 4)))
    tr = kbtrace.capture(SimpleNamespace(build=build, NAME="ddp"), four, out_dir=tmp_path / "t")
    assert seen == {r: (r, 4) for r in range(4)}
    assert all(c["ok"] for c in tr.meta["reference_check"].values())
    launches = tr.meta["launches"]
    assert [la["kernel"] for la in launches] == ["_scale"] * 4 + ["lrab_kernel"]
    ops = pq.read_table(tr.path / "ops.parquet", columns=["kind", "extra_json"]).to_pylist()
    assert {o["extra_json"] for o in ops if o["kind"] == "send"} == \
        {'{"ipcq": {"buffer_kind": "sram"}}'}
    run = kbtrace.replay(tr, four, ReplayOptions(out_dir=tmp_path / "r"))
    assert kbtrace.verify(run.run_dir).ok


def test_single_driver_all_reduce_of_a_tensor_on_every_rank(four, tmp_path):
    def build(w, p):
        dist = w.distributed()
        dist.init_process_group()
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 4, "kbtrace")
        x = w.tensor("x", (16, 64), "f32", w.random(0), shard="cubes")
        dist.all_reduce(x, algorithm="hier3")
        dist.barrier()
        w.output(x, reference=lambda v: np.broadcast_to(v["x"].sum(0), (16, 64)))
    tr = kbtrace.capture(SimpleNamespace(build=build, NAME="one"), four, out_dir=tmp_path / "t")
    assert tr.meta["reference_check"]["x"]["ok"]


@pytest.mark.parametrize("case, want", [
    ("no_init", "all_reduce: the default process group is not initialized; call "
                "dist.init_process_group() first"),
    ("backend", "init_process_group: unsupported backend 'nccl'; use 'kbtrace' or 'ahbm'"),
    ("missing", "all_reduce: ranks [0, 1, 2] wait for rank 3, whose worker returned without "
                "calling it; every rank must make the same collective calls in the same order"),
    ("mismatch", "collective mismatch: rank 0 in barrier; rank 1 in all_reduce"),
    ("dtype", "all_reduce: tensors 'g0' (f16) and 'g1' (f32) have different dtypes"),
    ("op", "all_reduce: unsupported op 'prod'; supported: sum"),
    ("nprocs", "spawn: nprocs=2 but the topology has 4 SIP(s) (rank = SIP)"),
])
def test_facade_errors(four, tmp_path, case, want):
    def build(w, p):
        dist = w.distributed()
        if case != "no_init":
            dist.init_process_group(backend="nccl" if case == "backend" else "kbtrace")

        def worker(rank):
            dt = "f32" if case == "dtype" and rank == 1 else "f16"
            t = w.tensor(f"g{rank}", (64,), dt, pe=(rank, 0, 0))
            if case == "missing" and rank == 3:
                return
            if case == "mismatch" and rank == 0:
                dist.barrier()
            dist.all_reduce(t, op="prod" if case == "op" else "sum")
        if case == "no_init":
            dist.all_reduce(w.tensor("z", (64,), "f16", pe=(0, 0, 0)))
        dist.spawn(worker, nprocs=2 if case == "nprocs" else None)
    with pytest.raises(CaptureError) as e:
        kbtrace.capture(SimpleNamespace(build=build, NAME="bad"), four, out_dir=tmp_path / "t")
    assert want in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "t").exists()


def test_reference_layout_dp_row_wise_cubes(tmp_path):
    """ADR-0032 D2: per rank ``zeros((n_cubes, n_elem))`` with DPPolicy(cube="row_wise",
    pe="replicate", num_pes=1): one shard per cube's PE 0; after dist.all_reduce every cube of
    every rank holds the sum over all 2 x 4 cubes."""
    from kbtrace.host import DPPolicy
    topo = compile_topology(ROOT / "topologies" / "small.yaml",
                            overrides={"system.sips.count": 2})

    def build(w, p):
        dist = w.distributed()
        dist.init_process_group()
        dp = DPPolicy(cube="row_wise", pe="replicate", num_cubes=4, num_pes=1)
        ts = []

        def worker(rank):
            vals = np.arange(4 * 32, dtype=np.float32).reshape(4, 32) + 100 * rank
            t = w.tensor(f"t{rank}", (4, 32), "f16", vals, dp=dp, sip=rank)
            ts.append(t)
            dist.all_reduce(t)
        dist.spawn(worker)
        total = sum((np.arange(128, dtype=np.float32).reshape(4, 32) + 100 * r) for r in (0, 1))
        for t in ts:
            w.output(t, reference=lambda v: np.broadcast_to(total.sum(0), (4, 32)))
    tr = kbtrace.capture(SimpleNamespace(build=build, NAME="d2"), topo, out_dir=tmp_path / "t")
    assert all(c["ok"] for c in tr.meta["reference_check"].values())
    assert kbtrace.verify(kbtrace.replay(tr, topo, ReplayOptions(out_dir=tmp_path / "r"))
                          .run_dir).ok

"""TCM and scratch: a bump allocator until full, then the buffers of dead handles are reused
(first fit), never those an asynchronous op may still read; addresses stay deterministic
and the replayed trace still verifies against numpy."""

from __future__ import annotations

import weakref
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtrace.analysis import verify
from kbtrace.capture import capture, ring
from kbtrace.capture.memory import Allocator
from kbtrace.errors import SanitizerError
from kbtrace.replay import ReplayOptions, replay
from kbtrace.topology import compile_topology

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "topologies" / "small.yaml"
#: 32 KiB of load TCM and 32 KiB of scratch per PE: the default gemm (M = N = 256) loads
#: 64 KiB per program, which overflowed before buffers were reused
TIGHT = {"pe.tcm.size_kb": 64, "pe.tcm.scratch_kb": 32}


def loads(trace_dir: Path) -> list[tuple[int, int, int]]:
    """(program, dst_addr, nbytes) of every load, in program order."""
    return duckdb.sql(f"SELECT program, dst_addr, nbytes FROM '{trace_dir}/ops.parquet' "
                      "WHERE kind = 'load' ORDER BY program, seq").fetchall()


def test_allocator_bumps_then_reuses_the_lowest_dead_gap():
    class H:                            # a handle stand-in: addr, nbytes, weak-referenceable
        def __init__(self, addr):
            self.addr, self.nbytes = addr, 16

    a = Allocator(0x1000, 64, "TCM of pe")
    hs = [H(0x1000 + 16 * i) for i in range(4)]          # bump: 0, 16, 32, 48
    a.cursor = 64
    a.owned = [weakref.ref(h) for h in hs]
    assert a.reclaim(16) is None        # every buffer owned by a live handle
    del hs[1]                           # frees [16, 32)
    a.pin(0x1000 + 32, 16)
    del hs[1]                           # [32, 48) is pinned: stays
    assert a.reclaim(16) == 16 and a.cursor == 64      # parked: later allocations reclaim
    # dead owners below the gap are forgotten as the walk passes them
    assert [(s, e) for s, e, _ in a._spans] == [(0, 16), (32, 48), (48, 64)]
    assert a.reclaim(32) is None
    assert "TCM of pe overflow: x needs 32 B but 3 live buffer(s) (1 pinned by sends, " \
           "composites or receives) hold 48 of 64 B and no gap fits" in a.full(32, "x")


def test_gemm_larger_than_tcm_captures_reuses_and_verifies(tmp_path):
    topo = compile_topology(SMALL, overrides=TIGHT)
    a = capture(ROOT / "capture" / "gemm.py", topo, out_dir=tmp_path / "a")
    capture(ROOT / "capture" / "gemm.py", topo, out_dir=tmp_path / "b")
    assert all(c["ok"] for c in a.meta["reference_check"].values())
    for name in ("ops.parquet", "memory.parquet"):     # reuse is deterministic
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    rows = loads(tmp_path / "a")
    per_prog: dict[int, list[tuple[int, int]]] = {}
    for prog, addr, nb in rows:
        per_prog.setdefault(prog, []).append((addr, nb))
    p0 = per_prog[0]
    assert len(p0) == 8 and sum(nb for _a, nb in p0) == 64 * 1024     # twice the TCM
    base = min(addr for addr, _nb in p0)
    assert all(base <= addr and addr + nb <= base + 32 * 1024 for addr, nb in p0)
    assert len({addr for addr, _nb in p0}) < len(p0)                 # addresses reused
    run = replay(tmp_path / "a", topo, ReplayOptions(out_dir=str(tmp_path / "run")))
    res = verify(run.run_dir)
    assert res.ok, res.text()


def test_default_tcm_keeps_plain_bump_addresses(tmp_path):
    capture(ROOT / "capture" / "gemm.py", compile_topology(SMALL), out_dir=tmp_path / "t")
    per_prog: dict[int, list[int]] = {}
    for prog, addr, _nb in loads(tmp_path / "t"):
        per_prog.setdefault(prog, []).append(addr)
    for addrs in per_prog.values():      # strictly increasing: no reuse while the bump fits
        assert addrs == sorted(addrs) and len(set(addrs)) == len(addrs)


def test_a_sent_buffer_is_never_reused(tmp_path):
    def k(tl, x, y):
        tl.send("intra_E", tl.load(x, (256,), "f32"))        # handle dropped at once
        for _ in range(2000):                                 # 2 MiB of dead 1 KiB loads
            tl.load(x, (256,), "f32")
        got = tl.recv("intra_W", (256,), "f32")
        tl.store(y, got)

    def build(w, p):
        x = w.tensor("x", (256,), "f32", init=w.random(0))
        y = w.tensor("y", (256,), "f32")
        w.launch(k, grid=(2, 1), args=(x, y), neighbors=ring(2))
        w.output(y, reference=lambda v: v["x"])

    wl = SimpleNamespace(NAME="pinned", PARAMS={}, build=build)
    topo = compile_topology(SMALL)
    tr = capture(wl, topo, out_dir=tmp_path / "t")
    assert all(c["ok"] for c in tr.meta["reference_check"].values())
    sent = duckdb.sql(f"SELECT program, src_addr, nbytes FROM '{tmp_path}/t/ops.parquet' "
                      "WHERE kind = 'send'").fetchall()
    rows = loads(tmp_path / "t")
    assert len(rows) == 2 * 2001
    for prog, s_addr, s_nb in sent:
        later = [(a, nb) for p, a, nb in rows if p == prog and a != s_addr]
        assert len(later) == 2000
        assert all(a + nb <= s_addr or a >= s_addr + s_nb for a, nb in later)
    assert len({a for p, a, _nb in rows if p == 0}) < 2001        # the others were reused
    run = replay(tmp_path / "t", topo, ReplayOptions(out_dir=str(tmp_path / "run")))
    assert verify(run.run_dir).ok


@pytest.mark.parametrize("keep", [True, False])
def test_only_live_tiles_count(tmp_path, keep):
    """Many short-lived tiles fit; the same tiles kept alive overflow, naming the holders."""
    def k(tl, x, y):
        live = []
        for _ in range(1100):           # 1100 x 1 KiB > 1 MiB
            t = tl.load(x, (256,), "f32")
            if keep:
                live.append(t)

    def build(w, p):
        w.launch(k, grid=(1, 1), args=(w.tensor("x", (256,), "f32", init=w.random(0)), 0))

    wl = SimpleNamespace(NAME="live", PARAMS={}, build=build)
    if keep:
        with pytest.raises(SanitizerError, match=r"1024 live buffer\(s\) hold 1048576 of "
                                                 r"1048576 B"):
            capture(wl, compile_topology(SMALL), out_dir=tmp_path / "t")
    else:
        assert capture(wl, compile_topology(SMALL), out_dir=tmp_path / "t").n_ops == 1100


@pytest.mark.parametrize("with_callback", [True, False])
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "alloc", "drop", "pin"]),
                          st.integers(1, 6), st.integers(0, 50)), max_size=80))
def test_reclaim_is_first_fit_over_live_and_pinned_buffers(with_callback, steps):
    """Against a brute-force first fit over every buffer still owned or pinned, each walk
    from the bottom (``reclaim`` resumes where its last walk stopped when nothing below
    changed; owners' references made without ``died`` are re-made with it)."""
    class H:
        def __init__(self, addr, nbytes):
            self.addr, self.nbytes = addr, nbytes

    base, cap, al = 0x4000, 256, 16
    a = Allocator(base, cap, "TCM of pe", align=al)
    a.cursor = cap                                   # full: every allocation reclaims
    live: list[H] = []
    pinned: dict[int, int] = {}
    for what, units, pick in steps:
        if what == "alloc":
            nb = units * 8
            spans = sorted({(h.addr - base, h.addr - base + h.nbytes) for h in live}
                           | set(pinned.items()))
            pos, want = 0, None
            for s, e in spans:
                if s - pos >= nb:
                    want = pos
                    break
                pos = max(pos, -(-e // al) * al)
            else:
                want = pos if cap - pos >= nb else None
            got = a.reclaim(nb)
            assert got == want
            if got is not None:
                h = H(base + got, nb)
                live.append(h)
                a.owned.append(weakref.ref(h, a.died) if with_callback else weakref.ref(h))
                del h                                # the list holds the only reference
        elif what == "drop" and live:
            live.pop(pick % len(live))
        elif what == "pin" and live:
            h = live[pick % len(live)]
            a.pin(h.addr, h.nbytes)
            pinned[h.addr - base] = h.addr - base + h.nbytes
            del h


def test_capture_cli_takes_topology_overrides(tmp_path, capsys):
    import json

    from kbtrace.cli import main

    sets = [a for k, v in TIGHT.items() for a in ("--set", f"{k}={v}")]
    assert main(["capture", "gemm", *sets, "-o", str(tmp_path / "t")]) == 0
    assert "matches its numpy reference" in capsys.readouterr().out
    meta = json.loads((tmp_path / "t" / "trace.json").read_text())
    assert meta["topology"]["content_hash"] == compile_topology(SMALL, overrides=TIGHT).content_hash
    # the stock topology gives different (bump-only) load addresses
    capture(ROOT / "capture" / "gemm.py", compile_topology(SMALL), out_dir=tmp_path / "s")
    assert loads(tmp_path / "t") != loads(tmp_path / "s")

"""The contention scenario set: synthetic traces where transfers share links, nodes and HBM
pseudo-channels, built for any topology, and the fast-vs-flit comparison they are judged by.

Used by ``tests/test_replay_contention_set.py`` (asserts the agreement) and
``benchmarks/bench_contention.py`` (prints the table for the README). Every scenario puts its
PEs in cube 0 (and its neighbour cube 1, adjacent on every stock topology) and starts all of
them at once, so their transfers overlap:

``one_to_many``      8 PEs each read 2 x 64 KiB from PE 0's HBM slice (one slice feeds many)
``many_to_one``      8 PEs each write 4 x 16 KiB into PE 0's slice (many feed one slice)
``cross_mesh``       PE i reads 2 x 64 KiB from PE 7 - i's slice: routes cross in the mesh
``ucie_readers_2``   PEs 0, 1 of cube 0 read 64 KiB from their counterparts' slices in cube 1
``ucie_readers_4``   the same with 4 PEs (the README's 25% case)
``ucie_crossing``    PEs 0..3 of cube 0 read from cube 1 while PEs 0..3 of cube 1 read from
                     cube 0, 2 x 32 KiB each: streams cross on the UCIe seam both ways
``mixed_sizes``      PEs 0..7 read 512 B, 1 KiB, 2 KiB, ... 64 KiB (2 rounds) from cube 1's
                     slices
``far_readers_4``    PEs 0..3 of cube 0 read 32 KiB each from the last cube of the topology
                     (small: the diagonal cube; default: the other SIP, over PCIe)
``readers_writers``  PEs 0..3 read 2 x 32 KiB from PE 7's slice while PEs 4..6 write 2 x 32
                     KiB into it

plus the replay fuzz test's random kernels (``fuzz_specs``), drawn for the topology.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kbtrace.replay.compare import compare_runs
from test_replay_util import SynthTrace, hbm, load, store

KIB = 1024


def _one_to_many(t: Any) -> list[dict]:
    nb = 64 * KIB
    return [load(hbm(0, 0, 0, t, (p * 2 + r) * nb), nb, pe=p, program=p, seq=r)
            for p in range(8) for r in range(2)]


def _many_to_one(t: Any) -> list[dict]:
    nb = 16 * KIB
    return [store(hbm(0, 0, 0, t, (p * 4 + r) * nb), nb, pe=p, program=p, seq=r)
            for p in range(8) for r in range(4)]


def _cross_mesh(t: Any) -> list[dict]:
    nb = 64 * KIB
    return [load(hbm(0, 0, 7 - p, t, r * nb), nb, pe=p, program=p, seq=r)
            for p in range(8) for r in range(2)]


def _ucie_readers(n: int) -> Callable[[Any], list[dict]]:
    def rows(t: Any) -> list[dict]:
        nb = 64 * KIB
        return [load(hbm(0, 1, p, t, 0), nb, pe=p, program=p) for p in range(n)]
    return rows


def _ucie_crossing(t: Any) -> list[dict]:
    nb = 32 * KIB
    rows = []
    for c in (0, 1):
        for p in range(4):
            rows += [load(hbm(0, 1 - c, p, t, r * nb), nb, cube=c, pe=p, program=c * 4 + p,
                          seq=r) for r in range(2)]
    return rows


def _mixed_sizes(t: Any) -> list[dict]:
    return [load(hbm(0, 1, p, t, r * (512 << p)), 512 << p, pe=p, program=p, seq=r)
            for p in range(8) for r in range(2)]


def _far_readers(t: Any) -> list[dict]:
    nb = 32 * KIB
    sip, cube = t.n_sips - 1, t.cubes_per_sip - 1
    return [load(hbm(sip, cube, p, t, 0), nb, pe=p, program=p) for p in range(4)]


def _readers_writers(t: Any) -> list[dict]:
    nb = 32 * KIB
    rows = [load(hbm(0, 0, 7, t, (p * 2 + r) * nb), nb, pe=p, program=p, seq=r)
            for p in range(4) for r in range(2)]
    rows += [store(hbm(0, 0, 7, t, (8 + p * 2 + r) * nb), nb, pe=p, program=p, seq=r)
             for p in range(4, 7) for r in range(2)]
    return rows


SCENARIOS: dict[str, Callable[[Any], list[dict]]] = {
    "one_to_many": _one_to_many,
    "many_to_one": _many_to_one,
    "cross_mesh": _cross_mesh,
    "ucie_readers_2": _ucie_readers(2),
    "ucie_readers_4": _ucie_readers(4),
    "ucie_crossing": _ucie_crossing,
    "mixed_sizes": _mixed_sizes,
    "far_readers_4": _far_readers,
    "readers_writers": _readers_writers,
}


def scenario(name: str, topo: Any) -> SynthTrace:
    """The synthetic trace of scenario ``name`` on ``topo``."""
    return SynthTrace(SCENARIOS[name](topo), f"{name}_{topo.params.name}")


@dataclass(frozen=True)
class Errors:
    """fast against flit on one trace: makespans, their relative error, and the distribution
    of per-op latency (``t_end - t_issue``) relative errors."""
    flit_ns: float
    fast_ns: float
    makespan_err: float
    op_median: float
    op_p95: float
    op_max: float
    ops: int
    flit_wall_s: float
    fast_wall_s: float


def errors(fast: Any, flit: Any) -> Errors:
    """``Errors`` of two ``Run``s of the same trace (``fast`` against the ``flit`` reference)."""
    ag = compare_runs(fast, flit)
    return Errors(flit.makespan_ns, fast.makespan_ns, ag.makespan_err, ag.median_op_err,
                  ag.p95_op_err, ag.max_op_err, ag.ops, flit.wall_s, fast.wall_s)


def compare(trace: Any, topo: Any, out: Any) -> Errors:
    """Replay ``trace`` in both modes into ``out``/flit and ``out``/fast; their ``Errors``."""
    from kbtrace.replay import ReplayOptions, replay
    runs = {f: replay(trace, topo, ReplayOptions(fidelity=f, out_dir=str(out / f)))
            for f in ("flit", "fast")}
    return errors(runs["fast"], runs["flit"])


def fuzz_specs(topo_name: str, n: int) -> list[Any]:
    """``n`` random kernels of the replay fuzz test (``test_replay_fuzz.KernelSpec``) on the
    plain ``topo_name`` topology, drawn deterministically (the same list every run)."""
    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st

    import test_replay_fuzz as fz

    specs: list[Any] = []

    @st.composite
    def on_topo(draw: Any) -> Any:
        t = fz.topo(topo_name)
        multi = t.n_sips * t.cubes_per_sip > 1 and t.pes_per_cube > 4
        grid = st.sampled_from([(1, 1), (2, 1)] + ([(2, 2), (3, 1), (8, 1), (4, 2)] if multi
                                                   else []))
        return fz._Drawer(draw, topo_name, ()).spec(draw(st.lists(grid, min_size=1,
                                                                  max_size=2)))

    @settings(fz._SETTINGS, max_examples=n, derandomize=True, phases=(Phase.generate,))
    @given(spec=on_topo())
    def draw_all(spec: Any) -> None:
        specs.append(spec)

    draw_all()
    return specs


def fuzz_trace(spec: Any, d: Any) -> Any:
    """Capture a fuzz kernel into ``d`` (as the fuzz test does); the ``Trace``."""
    import test_replay_fuzz as fz
    return fz._capture(spec, d)

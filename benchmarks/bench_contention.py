"""Fast-vs-flit fidelity on both stock topologies: every workload in ``capture/``, the
contention scenario set (``tests/contention_set.py``) and random kernels of the replay fuzz
test (not part of the default test run; flit replays of the larger workloads take minutes).

Run:  python benchmarks/bench_contention.py [small|default ...] [--fuzz N] [--nudge] [--floor]
                                           [--only NAME ...]
      pytest benchmarks/bench_contention.py -m benchmark

For each trace, both modes replay it; printed per row: the flit and fast makespans, the
makespan error, and the distribution of per-op latency (``t_end - t_issue``) relative errors
(median, p95, max), with the speed-up (flit wall / fast wall). Fuzz kernels are summarised
per topology: the worst makespan error, and the per-op error distribution over all their ops.

Issue 25 targets: every stock workload on small and default within 2% makespan, median per-op
error within 1%, p95 within 5%; every contention scenario within 2% makespan.

``--nudge``: each stock workload is also replayed in fast mode on the topology with one
parameter moved by a millionth (``NUDGES``: the mesh router's overhead, and on topologies with
PCIe its switch overhead and bandwidth), and the worst makespan error against the unmoved flit
run is printed per workload (flit mode moves by ~1e-5 there). A model on a knife edge shows
here: llama_layer on default.yaml came out 61-77% late at ``switch_overhead_ns`` 5.000001
before a moved IPCQ credit stopped pushing the heads at later nodes (dbafbc5), and 0.97%
at 5.0. A nudged makespan over 2% is a miss like the stock one.

``--floor``: the reference's own sensitivity. Each stock workload is also replayed in *flit*
mode with the mesh router's overhead moved by +-1e-6 (``FLOOR``), and the per-op errors of
those replays against the unmoved flit run are printed (median, p95, max), beside fast mode's
against the unmoved flit run. Where flit mode moves its ops that much under a millionth, the
per-op targets measure which of several equally likely event orders each mode happened to
take, not the model: all_gather on small.yaml has a flit-vs-flit per-op p95 of 12.2-12.8%
(makespan 0.2-0.4%), fast-vs-flit 12.97% (2026-11-26).

Beside the strict per-op error (each op against the same op), two order-insensitive p95s
(``compare.matched_op_errors``): the ops matched rank by rank, shortest latency to shortest,
within groups of interchangeable ops: one program's ops of one kind, name and size ("matched
in program": which of a PE's equal loads met a delay does not count), and every program's
ops of one kind, name and size ("matched in kind": the latency distribution of each kind of
op). Both are printed for flit against itself under ``--floor`` too. The targets stay the
strict ones (``misses``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from _cli import parser

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from contention_set import SCENARIOS, compare, errors, fuzz_specs, fuzz_trace, scenario  # noqa: E402
from kbtrace.capture import capture  # noqa: E402
from kbtrace.replay import ReplayOptions, replay  # noqa: E402
from kbtrace.replay.compare import Agreement, compare_runs, matched_op_errors  # noqa: E402
from kbtrace.replay.options import Run  # noqa: E402
from kbtrace.topology import compile_topology  # noqa: E402

TOPOS = ("small", "default")
#: (dotted key, getter of its value on the compiled params, factor) moved by ``--nudge``
NUDGES = (("cube.mesh.router_overhead_ns", lambda p: p.cube.mesh.router_overhead_ns, 1 + 1e-6),
          ("system.pcie.switch_overhead_ns", lambda p: p.system.pcie.switch_overhead_ns,
           1 + 1e-6),
          ("system.pcie.bw_gbps", lambda p: p.system.pcie.bw_gbps, 1 - 1e-6))
#: the parameter moves of ``--floor`` (flit mode against itself)
FLOOR = (("cube.mesh.router_overhead_ns", lambda p: p.cube.mesh.router_overhead_ns, 1 + 1e-6),
         ("cube.mesh.router_overhead_ns", lambda p: p.cube.mesh.router_overhead_ns, 1 - 1e-6))
FUZZ = 12                       # random kernels per topology
NAN = float("nan")
#: workload parameters a topology needs (gemm_sharded splits M over every cube: 32 on default)
PARAMS = {"default": {"gemm_sharded": ["M=1024", "N=1024"], "all_gather": ["peers=16"]}}


def _row(kind: str, name: str, e, d: Path | None = None) -> tuple:
    """A table row of ``Errors`` ``e``; with ``d`` (the directory holding the two runs, flit
    and fast) also the order-insensitive p95s (``matched``), else NaN there."""
    m = matched(_run(d / "fast"), _run(d / "flit")) if d is not None else (NAN, NAN)
    return (kind, name, e.flit_ns, e.fast_ns, e.makespan_err, e.op_median, e.op_p95, e.op_max,
            e.flit_wall_s / e.fast_wall_s if e.fast_wall_s > 0 else float("inf"), *m)


def matched(a: Run, ref: Run) -> tuple[float, float]:
    """The p95 per-op errors of ``a`` against ``ref`` with ops matched rank by rank within
    groups of interchangeable ops (``compare.matched_op_errors``): within one program's ops
    of a kind and size, and within every program's ops of a kind and size."""
    out = []
    for g in ("program", "kind"):
        e = matched_op_errors(a, ref, g)
        out.append(float(np.percentile(e, 95)) if e.size else 0.0)
    return out[0], out[1]


def nudged(tr, topo_name: str, flit_ns: float, out: Path) -> list[tuple[str, float, float]]:
    """Fast-mode makespans of ``tr`` with each ``NUDGES`` parameter the topology has moved:
    ``(key, makespan_ns, error against flit_ns)``."""
    path = ROOT / "topologies" / f"{topo_name}.yaml"
    params = compile_topology(path).params
    res = []
    for i, (key, get, factor) in enumerate(NUDGES):
        if key.startswith("system.pcie") and params.system.sips.count < 2:
            continue            # (no PCIe between SIPs to move)
        t = compile_topology(path, {key: get(params) * factor})
        ms = replay(tr, t, ReplayOptions(fidelity="fast", out_dir=str(out / f"nudge{i}"))).makespan_ns
        res.append((key, ms, abs(ms - flit_ns) / flit_ns))
    return res


def _run(d: Path) -> Run:
    """The ``Run`` written into ``d`` (its run.json's headline figures)."""
    js = json.loads((d / "run.json").read_text())
    return Run(d, js["run_id"], js["fidelity"], js["makespan_ns"], js["ops"], js["hops"],
               js["events"], js["wall_s"])


def floor(tr, topo_name: str, out: Path) -> list[tuple[str, float, Agreement, tuple]]:
    """Flit mode against itself: ``(key, moved value, agreement of the flit replay with
    key moved against the unmoved one in out/flit, its ``matched`` p95s)`` for each
    ``FLOOR`` move."""
    path = ROOT / "topologies" / f"{topo_name}.yaml"
    params = compile_topology(path).params
    ref = _run(out / "flit")
    res = []
    for i, (key, get, factor) in enumerate(FLOOR):
        v = get(params) * factor
        t = compile_topology(path, {key: v})
        r = replay(tr, t, ReplayOptions(fidelity="flit", out_dir=str(out / f"floor{i}")))
        res.append((key, v, compare_runs(r, ref), matched(r, ref)))
    return res


def measure(topo_name: str, tmp: Path, n_fuzz: int = FUZZ,
            only: set[str] | None = None, nudge: dict | None = None,
            floors: dict | None = None) -> list[tuple]:
    """The rows of ``topo_name``; with ``nudge`` (a dict), its ``nudged`` results per
    workload too (``nudge[(topo_name, workload)]``), with ``floors`` its ``floor``s."""
    topo = compile_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    rows = []
    for w in sorted((ROOT / "capture").glob("*.py")):
        if only and w.stem not in only:
            continue
        tr = capture(w, topo, PARAMS.get(topo_name, {}).get(w.stem, []),
                     tmp / topo_name / w.stem / "trace")
        d = tmp / topo_name / w.stem
        rows.append(_row("workload", w.stem, compare(tr, topo, d), d))
        print(_fmt(topo_name, rows[-1]), flush=True)
        if nudge is not None:
            nudge[(topo_name, w.stem)] = nudged(tr, topo_name, rows[-1][2],
                                                tmp / topo_name / w.stem)
        if floors is not None:
            floors[(topo_name, w.stem)] = (rows[-1],
                                           floor(tr, topo_name, tmp / topo_name / w.stem))
    for name in SCENARIOS:
        if only and name not in only:
            continue
        d = tmp / topo_name / name
        rows.append(_row("contention", name, compare(scenario(name, topo), topo, d), d))
        print(_fmt(topo_name, rows[-1]), flush=True)
    if n_fuzz:
        worst, errs, fl, fa = 0.0, [], 0.0, 0.0
        for i, spec in enumerate(fuzz_specs(topo_name, n_fuzz)):
            d = tmp / topo_name / f"fuzz{i}"
            tr = fuzz_trace(spec, d)
            t = compile_topology(ROOT / "topologies" / f"{topo_name}.yaml")
            runs = {f: replay(tr, t, ReplayOptions(fidelity=f, out_dir=str(d / f)))
                    for f in ("flit", "fast")}
            e = errors(runs["fast"], runs["flit"])
            worst = max(worst, e.makespan_err)
            fl, fa = fl + e.flit_wall_s, fa + e.fast_wall_s
            a, r = runs["fast"].op_timing(), runs["flit"].op_timing()
            la = a["t_end_ns"].to_numpy() - a["t_issue_ns"].to_numpy()
            lr = r["t_end_ns"].to_numpy() - r["t_issue_ns"].to_numpy()
            keep = lr > 0
            errs.append(np.abs(la[keep] - lr[keep]) / lr[keep])   # pooled over the kernels
        allerr = np.concatenate(errs) if errs else np.zeros(1)
        rows.append(("fuzz", f"{n_fuzz} fuzz kernels (worst)", float("nan"), float("nan"), worst,
                     float(np.median(allerr)), float(np.percentile(allerr, 95)),
                     float(allerr.max()), fl / fa if fa else float("inf"), NAN, NAN))
        print(_fmt(topo_name, rows[-1]), flush=True)
    return rows


def _pct(x: float) -> str:
    return "–" if np.isnan(x) else f"{100 * x:.2f}%"


def _fmt(topo_name: str, r: tuple) -> str:
    kind, name, fl, fa, me, med, p95, mx, sp, mp, mk = r
    ms = "–" if np.isnan(fl) else f"{fl:,.1f}"
    fs = "–" if np.isnan(fa) else f"{fa:,.1f}"
    return (f"| {topo_name} | {kind} | {name} | {ms} | {fs} | {100 * me:.2f}% | {100 * med:.2f}% "
            f"| {100 * p95:.2f}% | {100 * mx:.2f}% | {_pct(mp)} | {_pct(mk)} | {sp:.1f}x |")


HEADER = ("| topology | set | trace | flit makespan ns | fast makespan ns | makespan err | "
          "op err median | op err p95 | op err max | p95 matched in program | "
          "p95 matched in kind | speed-up |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str], nudge: dict | None = None,
         floors: dict | None = None) -> dict[str, list[tuple]]:
    """The rows per topology; with ``--nudge`` in ``argv`` the nudged makespans go into
    ``nudge`` (and are printed as a second table), with ``--floor`` flit mode's own per-op
    errors under ``FLOOR`` into ``floors`` (a third table)."""
    topos = [a for a in argv if a in TOPOS] or list(TOPOS)
    n_fuzz = int(argv[argv.index("--fuzz") + 1]) if "--fuzz" in argv else FUZZ
    only = set(argv[argv.index("--only") + 1:]) if "--only" in argv else None
    if "--nudge" in argv and nudge is None:
        nudge = {}
    if "--floor" in argv and floors is None:
        floors = {}
    out = {}
    print(HEADER)
    with tempfile.TemporaryDirectory() as d:
        for tn in topos:
            out[tn] = measure(tn, Path(d), n_fuzz, only, nudge, floors)
    if nudge:
        print("\n| topology | trace | parameter moved by 1e-6 | fast makespan ns | makespan err |"
              "\n|---|---|---|---|---|")
        for (tn, w), res in nudge.items():
            for key, ms, err in res:
                print(f"| {tn} | {w} | {key} | {ms:,.1f} | {100 * err:.2f}% |")
    if floors:
        print("\n| topology | trace | fast vs flit p95 (median, max) | matched in program / "
              "kind | flit moved | flit vs flit makespan err | flit vs flit p95 (median, max) | "
              "matched in program / kind |\n|---|---|---|---|---|---|---|---|")
        for (tn, w), (row, res) in floors.items():
            for key, v, ag, (fp, fk) in res:
                print(f"| {tn} | {w} | {100 * row[6]:.2f}% ({100 * row[5]:.2f}%, "
                      f"{100 * row[7]:.2f}%) | {_pct(row[9])} / {_pct(row[10])} | "
                      f"{key.rsplit('.', 1)[-1]} = {v:.6f} | "
                      f"{100 * ag.makespan_err:.2f}% | {100 * ag.p95_op_err:.2f}% "
                      f"({100 * ag.median_op_err:.2f}%, {100 * ag.max_op_err:.2f}%) | "
                      f"{_pct(fp)} / {_pct(fk)} |")
    return out


def misses(res: dict[str, list[tuple]], nudge: dict | None = None) -> list[str]:
    """The issue 25 targets each row misses (and each nudged makespan over 2%)."""
    bad = []
    for (tn, w), rs in (nudge or {}).items():
        for key, _ms, err in rs:
            if err > 0.02:
                bad.append(f"{tn}/{w}: makespan {100 * err:.2f}% with {key} moved by 1e-6")
    for tn, rows in res.items():
        for kind, name, _fl, _fa, me, med, p95, _mx, _sp, _mp, _mk in rows:
            if me > 0.02:
                bad.append(f"{tn}/{name}: makespan {100 * me:.2f}%")
            if kind == "workload" and (med > 0.01 or p95 > 0.05):
                bad.append(f"{tn}/{name}: op median {100 * med:.2f}%, p95 {100 * p95:.2f}%")
    return bad


@pytest.mark.benchmark
def test_bench_contention():
    res = main(["--fuzz", str(FUZZ)])
    bad = misses(res)
    if bad:
        pytest.xfail("issue 25 targets not met (see README, Fidelity): " + "; ".join(bad))


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("topologies", nargs="*", metavar="TOPOLOGY",
                    help=f"stock topologies (default: {' '.join(TOPOS)})")
    ap.add_argument("--fuzz", type=int, default=FUZZ, metavar="N", help=f"fuzz kernels per topology (default {FUZZ})")
    ap.add_argument("--nudge", action="store_true", help="also replay fast with one parameter moved by 1e-6")
    ap.add_argument("--floor", action="store_true", help="also replay flit with the router overhead moved by +-1e-6")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these workloads / scenarios")
    a = ap.parse_args()
    for t in a.topologies:
        if t not in TOPOS:
            ap.error(f"unknown topology {t!r}: choose from {', '.join(TOPOS)}")
    argv = [*a.topologies, "--fuzz", str(a.fuzz), *(["--nudge"] if a.nudge else []),
            *(["--floor"] if a.floor else []), *(["--only", *a.only] if a.only else [])]
    nd: dict = {}
    r = main(argv, nd if a.nudge else None)
    print("\nmisses:", "; ".join(misses(r, nd)) or "none")

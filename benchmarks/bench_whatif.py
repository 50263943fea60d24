"""What-if accuracy and speed: every stock workload x +-50% on each resource class.

Run:  python benchmarks/bench_whatif.py [TOPOLOGY]     (prints the table for docs/insight.md)
      pytest benchmarks/bench_whatif.py -m benchmark

For each workload in ``capture/`` (default parameters, ``topologies/small.yaml``) the
recorded fast replay is prepared once (``Retimer``) and, for each resource class at 1.5x
and 0.5x speed (``resources.scaled``), re-timed (``Retimer.retime``) and replayed in full
(fast, invariants on, as ``kbtrace replay``) on the same compiled topology. Error =
(estimate - replay) / replay makespan; speed-up = replay wall / re-time wall, each the best
of ``REPEATS`` (the machine is shared); the one-off preparation (reading the run, finding
every wait's cause) is reported per workload. A case is "stable" when the re-timing found
no flipped or newly overlapping resource users. Runs with composite ops, which the
re-timing refuses, show ``--exact``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import pytest
from _cli import parser

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 2
FACTORS = (1.5, 0.5)


def _best(fn, n=REPEATS):
    best, out = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def measure(topology: str = "small") -> tuple[list[dict], dict[str, float]]:
    from kbtrace.capture import capture
    from kbtrace.errors import UsageError
    from kbtrace.insight.base import load_base
    from kbtrace.insight.resources import RESOURCES, scaled
    from kbtrace.insight.retime import Retimer
    from kbtrace.insight.whatif import _check_keys
    from kbtrace.replay import ReplayOptions, replay
    from kbtrace.topology import compile_topology

    tpath = ROOT / "topologies" / f"{topology}.yaml"
    topo = compile_topology(tpath)
    rows, prep = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for wl in sorted((ROOT / "capture").glob("*.py")):
            tr = Path(tmp) / f"tr-{wl.stem}"
            capture(wl, topo, {}, tr)
            run = replay(tr, topo, ReplayOptions(out_dir=str(Path(tmp) / wl.stem)))
            base = load_base(run.run_dir, tpath)
            t_prep, rt = _best(lambda b=base: Retimer(b), 1)
            prep[wl.stem] = t_prep
            for rc in RESOURCES:
                row = {"workload": wl.stem, "resource": rc.name, "base_ns": run.makespan_ns}
                for f in FACTORS:
                    ov = scaled(topo.params, rc.name, f)
                    new = compile_topology(tpath, overrides=ov)
                    t_rep, r = _best(lambda n=new, t=tr: replay(t, n, ReplayOptions(
                        out_dir=str(Path(tmp) / "exact"))))
                    try:
                        _check_keys({k: v for k, v in ov.items()})
                        if rt.composite:
                            raise UsageError("composite")
                        t_rt, est = _best(lambda n=new, r_=rt: r_.retime(n))
                    except UsageError:
                        row[f] = {"exact_ns": r.makespan_ns, "est_ns": None}
                        continue
                    row[f] = {"exact_ns": r.makespan_ns, "est_ns": est.makespan_ns,
                              "err_pct": 100 * (est.makespan_ns - r.makespan_ns) / r.makespan_ns,
                              "stable": est.flips == 0 and est.new_overlaps == 0,
                              "covered": abs(est.makespan_ns - r.makespan_ns)
                              <= est.error_bound_ns,
                              "speedup": t_rep / t_rt, "bound_pct":
                              100 * est.error_bound_ns / run.makespan_ns}
                rows.append(row)
    return rows, prep


def table(rows: list[dict], prep: dict[str, float]) -> str:
    out = ["| workload | class | +50%: error | stable | -50%: error | stable | speed-up |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        cells, sp = [], []
        for f in FACTORS:
            c = r[f]
            if c["est_ns"] is None:
                cells += ["--exact", ""]
                continue
            cells += [f"{c['err_pct']:+.1f}%", "yes" if c["stable"] else
                      f"no (est. {c['bound_pct']:.0f}%)"]
            sp.append(c["speedup"])
        speed = f"{statistics.median(sp):.0f}x" if sp else "-"
        out.append(f"| {r['workload']} | {r['resource']} | " + " | ".join(cells)
                   + f" | {speed} |")
    from kbtrace.replay.fabric.core import status

    cases = [r[f] for r in rows for f in FACTORS if r[f]["est_ns"] is not None]
    stable = [c for c in cases if c["stable"]]
    flagged = [c for c in cases if not c["stable"]]
    ok = [c for c in stable if abs(c["err_pct"]) <= 5]
    out.append("")
    out.append(f"{len(cases)} re-timed cases; {len(stable)} with no order flip, of which "
               f"{len(ok)} within 5% (max |error| "
               f"{max((abs(c['err_pct']) for c in stable), default=0):.1f}%); all cases: "
               f"median |error| {statistics.median(abs(c['err_pct']) for c in cases):.1f}%, "
               f"max {max(abs(c['err_pct']) for c in cases):.1f}%; of the {len(flagged)} "
               f"flagged, the error estimate covers the error in "
               f"{sum(c['covered'] for c in flagged)}. Speed-up (re-time vs fast replay, "
               f"its core {status()[1]}; preparation excluded): median "
               f"{statistics.median(c['speedup'] for c in cases):.0f}x, min "
               f"{min(c['speedup'] for c in cases):.0f}x. Preparation per run: "
               + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in prep.items()) + ".")
    return "\n".join(out)


@pytest.mark.benchmark
def test_whatif_table():
    rows, prep = measure()
    print(table(rows, prep))


if __name__ == "__main__":
    ap = parser(__doc__)
    ap.add_argument("topology", nargs="?", default="small", help="stock topology (default small)")
    rows, prep = measure(ap.parse_args().topology)
    print(table(rows, prep))

"""Where fast mode parts from flit mode on one workload (issue 25): replays a stock workload in
both modes (or reads two runs already made) and prints the per-op error summary, the ops over
the threshold per program position (seq, kind), the link classes where the heads of chosen
ops took another time than in flit mode (``kbtrace.replay.diverge``), and the first diverging
hop of the first ops over the threshold.

Run:  python benchmarks/bench_diverge.py llama_layer default [--seqs 47] [--min-bytes 1024]
                                          [--threshold 0.05] [--out DIR] [--first 10]
      python benchmarks/bench_diverge.py --runs FAST_DIR FLIT_DIR [--seqs 47] ...

``--seqs``: the program positions whose ops' heads are compared link by link (default: every
op over the threshold), on SIP 0 only with ``--sip0``. Replays (``--out``, default a temporary
directory) take ~30 s of CPU for llama_layer on default.yaml with the compiled core.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from kbtrace.replay.diverge import first_divergence, head_delays, op_errors, over_by_seq  # noqa: E402
from kbtrace.replay.options import Run  # noqa: E402

#: workload parameters bench_contention uses per topology
PARAMS = {"default": {"gemm_sharded": ["M=1024", "N=1024"], "all_gather": ["peers=16"]}}


def _run(d: Path) -> Run:
    import json
    js = json.loads((d / "run.json").read_text())
    return Run(d, js["run_id"], js["fidelity"], js["makespan_ns"], js["ops"], js["hops"],
               js["events"], js["wall_s"])


def replay_both(workload: str, topo_name: str, out: Path) -> tuple[Run, Run]:
    """Capture ``workload`` on ``topo_name`` and replay it fast and flit into ``out``."""
    from kbtrace.capture import capture
    from kbtrace.replay import ReplayOptions, replay
    from kbtrace.topology import compile_topology
    topo = compile_topology(ROOT / "topologies" / f"{topo_name}.yaml")
    tr = capture(ROOT / "capture" / f"{workload}.py", topo,
                 PARAMS.get(topo_name, {}).get(workload, []), out / "trace")
    for f in ("fast", "flit"):
        replay(tr, topo, ReplayOptions(fidelity=f, out_dir=str(out / f)))
    return _run(out / "fast"), _run(out / "flit")


def report(a: Run, ref: Run, threshold: float, seqs: list[int] | None, sip0: bool,
           min_bytes: int, first: int) -> str:
    err = op_errors(a, ref)
    tr = ref.op_timing()
    lines = [f"makespan {a.makespan_ns:,.1f} against {ref.makespan_ns:,.1f} ns "
             f"({100 * abs(a.makespan_ns - ref.makespan_ns) / ref.makespan_ns:.2f}%); "
             f"per op p95 {100 * np.percentile(err[_kept(ref)], 95):.2f}%, "
             f"{int((err > threshold).sum())} of {len(err)} ops over {100 * threshold:g}%"]
    lines.append("ops over the threshold per (seq, kind): " + ", ".join(
        f"{s}/{k} {n}" for (s, k), n in over_by_seq(a, ref, threshold).items()))
    seq = tr["seq"].to_numpy()
    sel = (np.isin(seq, seqs) if seqs else err > threshold)
    if sip0:
        sel &= tr["sip"].to_numpy() == 0
    ops = np.flatnonzero(sel)
    lines.append(f"heads of {len(ops)} ops, link by link (a - ref, ns):")
    for d in head_delays(a, ref, ops, min_bytes)[:30]:
        lines.append(f"  {d.link:42s} n={d.n:5d}  {d.a_ns:8.1f} vs {d.ref_ns:8.1f}  "
                     f"mean {d.diff_mean_ns:+8.2f}  p5 {d.diff_p5_ns:+8.2f}  "
                     f"p95 {d.diff_p95_ns:+8.2f}")
    order = np.argsort(tr["t_issue_ns"].to_numpy(), kind="stable")
    shown = 0
    for o in order.tolist():
        if err[o] <= threshold or shown >= first:
            continue
        shown += 1
        fd = first_divergence(a, ref, o)
        where = ("no hop differs" if fd is None else
                 f"hop {fd[0]} {fd[1]} ({fd[2]}): {fd[3]:.2f} vs {fd[4]:.2f} ns")
        lines.append(f"  op {o} (seq {int(seq[o])}, {tr['kind'][o].as_py()}) "
                     f"{100 * err[o]:.2f}%: first apart at {where}")
    return "\n".join(lines)


def _kept(ref: Run) -> np.ndarray:
    tr = ref.op_timing()
    return (tr["t_end_ns"].to_numpy() - tr["t_issue_ns"].to_numpy()) > 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("workload", nargs="?")
    p.add_argument("topology", nargs="?", default="default")
    p.add_argument("--runs", nargs=2, metavar=("FAST_DIR", "FLIT_DIR"))
    p.add_argument("--out")
    p.add_argument("--threshold", type=float, default=0.05)
    p.add_argument("--seqs", type=int, nargs="*")
    p.add_argument("--sip0", action="store_true")
    p.add_argument("--min-bytes", type=int, default=0)
    p.add_argument("--first", type=int, default=10)
    args = p.parse_args(argv)
    if args.runs:
        a, ref = _run(Path(args.runs[0])), _run(Path(args.runs[1]))
    elif args.workload:
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="diverge-"))
        a, ref = replay_both(args.workload, args.topology, out)
    else:
        p.error("a workload (and topology) or --runs FAST_DIR FLIT_DIR")
    print(report(a, ref, args.threshold, args.seqs, args.sip0, args.min_bytes, args.first))
    return 0


if __name__ == "__main__":
    sys.exit(main())

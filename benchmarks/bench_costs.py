"""What one more replayed op costs, by function, in instructions and simulated cache misses
(issue 22, target 2); deterministic, so it resolves changes the wall clock cannot. Not part
of the default test run; needs valgrind.

Run:  python benchmarks/bench_costs.py [--ops 10000 30000] [--fidelity fast] [--top 25]
                                       [--src DIR [DIR ...]] [--l1 BYTES] [--ll BYTES]
      pytest benchmarks/bench_costs.py -m benchmark

On a busy 2-core machine the same replay's CPU time moves ±25% from one run to the next,
and a 30 k-op replay's whole instruction count is half start-up (imports, the topology, the
first routes). This captures gemm over every PE of ``default.yaml`` at two sizes (as
``bench_core.py``: M = N = 1024, K from the ops asked), replays each once under valgrind's
cachegrind, and divides the difference of the two runs by the difference of their ops:
what the replay spends per added op, start-up cancelled, in total and per function.

Events per op: ``Ir`` instructions; ``D1mr`` / ``D1mw`` misses of a simulated first-level data
cache (``--l1``, default this CPU's L1d); ``DLmr`` / ``DLmw`` misses of a simulated last level
(``--ll``, default this CPU's L2: the replay's working set is far larger, so what leaves L2
is what it waits for). Cython functions are shown as ``module.Class.method`` (their compiled
twins' names, ``_routes_c`` as ``routes``). Valgrind runs the code ~50× slower: the default
sizes take ~4 minutes.

``--src`` replays each source tree given (a checkout's ``src``, or a frozen copy of one, its
compiled core built in place) on the same traces, and prints the per-op totals of each and
the functions whose per-op cost moved most against the first: an A/B of a change without
the machine's noise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
from _cli import parser

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ("Ir", "D1mr", "D1mw", "DLmr", "DLmw")


def parse(text: Iterable[str]) -> tuple[list[str], dict[str, list[int]]]:
    """A cachegrind output file's event names and per-function totals (summed over files)."""
    events: list[str] = []
    funcs: dict[str, list[int]] = {}
    cur: list[int] | None = None
    for line in text:
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("fn="):
            cur = funcs.setdefault(line[3:].strip(), [0] * len(events))
        elif line[:1].isdigit() and cur is not None:
            for i, v in enumerate(line.split()[1:]):
                cur[i] += int(v)
    return events, funcs


def marginal(small: tuple[list[str], dict[str, list[int]]],
             large: tuple[list[str], dict[str, list[int]]], d_ops: int) -> dict[str, dict[str, float]]:
    """Per function, ``(large - small) / d_ops`` for each event of ``EVENTS`` both runs have."""
    (ev_s, fs), (ev_l, fl) = small, large
    names = [e for e in EVENTS if e in ev_s and e in ev_l]
    out: dict[str, dict[str, float]] = {}
    for fn in set(fs) | set(fl):
        a, b = fs.get(fn), fl.get(fn)
        out[fn] = {e: ((b[ev_l.index(e)] if b else 0) - (a[ev_s.index(e)] if a else 0)) / d_ops
                   for e in names}
    return out


def demangle(fn: str) -> str:
    """``__pyx_f_7kbtrace_6replay_6fabric_9_routes_c_5_Plan_take`` -> ``routes._Plan.take``;
    other names as they are. Cython names a function by its module's dotted path and then
    its class, each length-prefixed, and the function (a ``def``'s with a counter first)."""
    m = re.match(r"^__pyx_(pf|pw|f|tp_dealloc|tp_new)_((?:\d+\w+?)+?)(?:\.[\w.]+)?$", fn)
    if not m:
        return fn
    rest, path = m.group(2), []
    for seg in ("kbtrace", "replay", "fabric"):
        if rest.startswith(f"{len(seg)}{seg}_"):
            path.append(seg)
            rest = rest[len(str(len(seg))) + len(seg) + 1:]
    n = re.match(r"^(\d+)(\w+)$", rest)          # the module (its twin's name)
    if not path or not n or len(n.group(2)) < int(n.group(1)):
        return fn
    mod, rest = n.group(2)[:int(n.group(1))], n.group(2)[int(n.group(1)):].lstrip("_")
    names = [re.sub(r"^_(\w+)_c$", r"\1", mod)]
    c = re.match(r"^(\d+)(\w+)$", rest)
    if c and len(c.group(2)) > int(c.group(1)) and c.group(2)[int(c.group(1))] == "_":
        names.append(c.group(2)[:int(c.group(1))])          # a class, then its method
        rest = c.group(2)[int(c.group(1)) + 1:]
    if rest:
        names.append(re.sub(r"^\d+", "", rest) if m.group(1) in ("pf", "pw") else rest)
    return ("dealloc " if m.group(1) == "tp_dealloc" else "") + ".".join(names)


def _cache_size(index: int, default: int) -> int:
    """Bytes of this CPU's cache ``index`` (sysfs: 0 L1d, 2 L2), else ``default``."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read_text().strip()
    except OSError:
        return default
    unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * unit


def child(trace: str, out: str, fidelity: str) -> None:
    from kbtrace._hugepages import install
    install()                    # as the kbtrace command
    from kbtrace.replay import ReplayOptions, replay
    from kbtrace.replay.fabric.core import status
    from kbtrace.topology import compile_topology

    r = replay(trace, compile_topology(ROOT / "topologies" / "default.yaml"),
               ReplayOptions(fidelity=fidelity, out_dir=out))
    print(status()[1], r.ops, r.hops)


def run(src: Path, trace: Path, out: Path, fidelity: str, l1: int, ll: int
        ) -> tuple[tuple[list[str], dict[str, list[int]]], int, str]:
    """One replay of ``trace`` with ``src`` first on the path, under cachegrind: its
    per-function counts, its ops and which core ran."""
    cg = out.with_suffix(".cg")
    env = {k: v for k, v in os.environ.items() if k != "KBTRACE_PURE_PYTHON"}
    env["PYTHONPATH"] = str(src) + os.pathsep + str(Path(__file__).parent)
    # numpy's BLAS threads spin a while after start-up, a count that varies run to run
    # (valgrind runs threads one at a time): ~2,000 instructions per op of noise
    env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"
    # a fixed string hash: with a random one the same tree's count moved by ~1,300
    # instructions per op between two runs (dict and set layouts, type-cache collisions)
    env["PYTHONHASHSEED"] = "0"
    res = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=yes",
                          "--I1=32768,8,64", f"--D1={l1},8,64", f"--LL={ll},8,64",
                          f"--cachegrind-out-file={cg}", sys.executable, "-W", "ignore",
                          __file__, "--child", str(trace), str(out), fidelity],
                         env=env, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    core, ops, _hops = res.stdout.split()[-3:]
    with open(cg) as fh:
        return parse(fh), int(ops), core


def measure(sizes: list[int], srcs: list[Path], tmp: Path, fidelity: str = "fast",
            l1: int = 32768, ll: int = 524288) -> list[dict]:
    """Per source tree: its core, the ops of each trace and the per-op costs by function."""
    from kbtrace.capture import capture

    traces = []
    for ops in sorted(sizes):
        k = 64 * max(1, -(-(ops // 1024 - 2) // 3))
        capture(ROOT / "capture" / "gemm.py", ROOT / "topologies" / "default.yaml",
                {"M": 1024, "N": 1024, "K": k}, tmp / f"trace{ops}")
        traces.append(tmp / f"trace{ops}")
    results = []
    for i, src in enumerate(srcs):
        (a, n_a, core), (b, n_b, core_b) = (run(src, t, tmp / f"run{i}_{j}", fidelity, l1, ll)
                                           for j, t in enumerate(traces))
        if core != core_b:      # (a .py edited during the runs makes its compiled twin stale)
            raise RuntimeError(f"{src}: the two replays ran different cores ({core!r}, then "
                               f"{core_b!r}); rebuild it and leave its sources alone meanwhile")
        results.append({"src": str(src), "core": core, "ops": (n_a, n_b),
                        "per_op": marginal(a, b, n_b - n_a)})
    return results


def _total(per_op: dict[str, dict[str, float]], e: str) -> float:
    return sum(v[e] for v in per_op.values())


def report(results: list[dict], top: int = 25) -> str:
    first = results[0]["per_op"]
    ev = [e for e in EVENTS if e in next(iter(first.values()))]
    lines = ["| source | core | ops | " + " | ".join(f"{e} per op" for e in ev) + " |",
             "|---|---|---|" + "---:|" * len(ev)]
    for r in results:
        lines.append(f"| {r['src']} | {r['core']} | {r['ops'][0]:,} → {r['ops'][1]:,} | "
                     + " | ".join(f"{_total(r['per_op'], e):,.0f}" for e in ev) + " |")
    ll = [e for e in ("DLmr", "DLmw") if e in ev]
    for title, key in (("instructions", lambda v: v["Ir"]),
                       ("last-level misses", lambda v: sum(v[e] for e in ll))):
        tot = sum(key(v) for v in first.values()) or 1.0
        lines += ["", f"Top {top} functions of {results[0]['src']} by {title} per op:", "",
                  "| function | " + " | ".join(ev) + " | share |", "|---|" + "---:|" * (len(ev) + 1)]
        for fn, v in sorted(first.items(), key=lambda kv: -key(kv[1]))[:top]:
            lines.append(f"| {demangle(fn)[:90]} | " + " | ".join(f"{v[e]:,.1f}" for e in ev)
                         + f" | {100 * key(v) / tot:.1f}% |")
    for r in results[1:]:
        d = {fn: {e: r["per_op"].get(fn, {}).get(e, 0.0) - first.get(fn, {}).get(e, 0.0)
                  for e in ev} for fn in set(first) | set(r["per_op"])}
        lines += ["", f"{r['src']} against {results[0]['src']}: Ir per op "
                      f"{_total(d, 'Ir'):+,.0f}, LL misses per op "
                      f"{sum(_total(d, e) for e in ll):+,.1f}; the {top} largest moves:", "",
                  "| function | Δ Ir | Δ LL misses |", "|---|---:|---:|"]
        for fn, v in sorted(d.items(), key=lambda kv: -abs(kv[1]["Ir"]))[:top]:
            lines.append(f"| {demangle(fn)[:90]} | {v['Ir']:+,.1f} | "
                         f"{sum(v[e] for e in ll):+,.1f} |")
    return "\n".join(lines)


@pytest.mark.benchmark
def test_costs(tmp_path):
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed")
    res = measure([2048, 4096], [ROOT / "src"], tmp_path)
    print(report(res, 10))
    assert res[0]["ops"][1] > res[0]["ops"][0]
    assert _total(res[0]["per_op"], "Ir") > 0


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--ops", type=int, nargs=2, default=[10_000, 30_000], metavar="N")
    ap.add_argument("--fidelity", default="fast")
    ap.add_argument("--src", type=Path, nargs="+", default=[ROOT / "src"])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--l1", type=int, default=_cache_size(0, 32768), help="bytes")
    ap.add_argument("--ll", type=int, default=_cache_size(2, 524288), help="bytes")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if shutil.which("valgrind") is None:
        ap.error("valgrind is not installed; install it (e.g. apt-get install valgrind)")
    if len(set(args.ops)) < 2 or min(args.ops) < 1024:
        ap.error("--ops: two different sizes of at least 1024 ops")
    for src in args.src:
        if not (src / "kbtrace" / "__init__.py").is_file():
            ap.error(f"--src {src}: no kbtrace package there; give a checkout's src directory")
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(args.ops, [p.resolve() for p in args.src], Path(tmp), args.fidelity,
                      args.l1, args.ll)
    print(report(res, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())

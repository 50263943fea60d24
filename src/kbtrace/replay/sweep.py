"""Sweeps: replay traces on topologies over a grid of parameter values (DESIGN §9).

A sweep config (YAML; examples in the top-level ``replay/``) names what to replay
and the grid::

    traces: [data/traces/gemm]         # trace directories written by `kbtrace capture`
    workloads:                         # and/or workloads, captured once per topology
      - capture/softmax.py             #   a path, or {path: ..., params: {R: 64}, name: ...}
      - path: capture/gemm.py          #   its own parameters gridded: one trace per
        grid: {BM: [16, 32, 64]}       #   combination (gemm-BM16, ...), a points column each
    topologies: [topologies/small.yaml]
    fidelity: [fast]                   # optional, default [fast]
    grid:                              # topology parameter (YAML path) -> values
      cube.hbm.pc_bw_gbps: [8, 16, 32]
      cube.mesh.link_bw_gbps: [128, 256]

Points are the product traces × topologies × fidelities × grid values, enumerated in
that nesting order (config order; grid keys in the order written, the last varying
fastest); ``point`` is that index. Relative paths are relative to the current
directory. Every point is one ``replay`` into its own hive-partitioned directory::

    OUT/trace=gemm/topology=small/fidelity=fast/cube.hbm.pc_bw_gbps=8/cube.mesh.link_bw_gbps=128/
        op_timing.parquet  hops.parquet  nodes.parquet  links.parquet  run.json  point.json

``point.json`` holds the point's config, its status (``ok`` / ``error``) and the error
line (plus the traceback of an internal error). The sweep writes ``OUT/points.parquet``
(``schema.SWEEP_POINTS`` followed by one typed column per grid key and one nullable
column per workload grid key, one row per point, sorted by ``point``) and ``OUT/sweep.json`` (the resolved config). Captured
workload traces go to ``OUT/traces/<name>-<topology>/``.

A point that fails (a grid value the topology compiler rejects, a trace that does
not fit the topology) is recorded and does not stop the others; the sweep's result
lists the failures and the CLI exits 1. A bad config is refused before anything runs.

Executors: ``local`` runs points in this process (``jobs=1``) or in ``jobs`` worker
processes (spawned, so no inherited threads); ``ray`` submits one task per point to
a Ray cluster (``ray.init()`` honours ``RAY_ADDRESS``; OUT must be on a filesystem
the workers share). With ``jobs > 1`` (local), this process and ``jobs - 1`` workers share
the work; workers start only when it pays for their start-up (``_sweepsafe``) and get jobs
only once they are up. Two or more workloads to capture make the captures and the points one
set of jobs (``_piped``): every capture first, each point once its own trace is captured, so
no process waits for all captures; a failed capture stops the hand-out and is raised once
the running jobs end. ``SweepResult.cpu`` says where the CPU time went (``_sweepcpu``).
Determinism: a point's outputs do not depend on the executor or
on the order points finish in; ``points.parquet`` and ``sweep.json`` carry no wall
times, so the same config gives byte-identical sweep files (wall times stay in each
point's ``run.json`` / ``point.json``). ``resume=True`` skips points whose
``point.json`` says ``ok`` for the same point key (config, trace and topology
content, kbtrace version).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from kbtrace import __version__, schema
from kbtrace._io import claim_dir, read_json_object, stable_hash, write_json, write_table
from kbtrace._owned import MARKER, owner
from kbtrace.errors import KbtraceError, SweepError
from kbtrace.replay._sweepcost import cost
from kbtrace.replay._sweepcpu import Clock, JobCpu, SweepCpu, children_cpu_s
from kbtrace.replay._sweepsafe import (
    Pool,
    check_pinned,
    execute,
    pin_traces,
    write_point,
)
from kbtrace.replay.sweep_config import (
    NAME_OK,
    SweepConfig,
    TraceSpec,
    fmt_value,
    load_config,
)

__all__ = ["SweepConfig", "TraceSpec", "Point", "SweepResult", "load_config", "run_sweep",
           "run_point", "EXECUTORS"]

EXECUTORS = ("local", "ray")
#: What a point's replay yields (point.json; all but wall_s and cpu_s, the CPU seconds of
#: the point in the process that ran it, also go to points.parquet).
_RESULT = ("status", "error", "run_id", "makespan_ns", "body_ns", "ops", "hops", "events",
           "wall_s", "cpu_s")

@dataclass(frozen=True)
class Point:
    """One replay of a sweep."""
    index: int
    trace: str
    trace_dir: str
    topology: str
    topology_name: str
    fidelity: str
    params: tuple[tuple[str, Any], ...]
    check_invariants: bool = True
    workload_params: tuple[tuple[str, Any], ...] = ()    # the trace's workload grid values

    @property
    def rel_dir(self) -> str:
        """The point's hive-partitioned directory, relative to the sweep's."""
        parts = [f"trace={self.trace}", f"topology={self.topology_name}",
                 f"fidelity={self.fidelity}"]
        return "/".join(parts + [f"{k}={fmt_value(v)}" for k, v in self.params])

    def as_json(self) -> dict[str, Any]:
        return {"point": self.index, "trace": self.trace, "trace_dir": self.trace_dir,
                "topology": self.topology, "topology_name": self.topology_name,
                "fidelity": self.fidelity, "params": dict(self.params),
                "check_invariants": self.check_invariants, "run_dir": self.rel_dir,
                **({"workload_params": dict(self.workload_params)}
                   if self.workload_params else {})}


@dataclass
class SweepResult:
    """A finished sweep: its directory, the points table, what failed and what was reused,
    and where its CPU time went (``cpu``: ``_sweepcpu.SweepCpu``)."""
    out_dir: Path
    points: pa.Table
    failed: list[dict[str, Any]] = field(default_factory=list)
    reused: int = 0
    cpu: SweepCpu = field(default_factory=SweepCpu)

    @property
    def ok(self) -> bool:
        return not self.failed


# --------------------------------------------------------------------------- points

def _topologies(cfg: SweepConfig) -> list[Any]:
    """The config's topologies compiled (without grid values); their names must be usable
    as distinct ``topology=`` partitions."""
    from kbtrace.topology import compile_topology
    topos = [compile_topology(t) for t in cfg.topologies]
    names = [t.params.name for t in topos]
    for n, t in zip(names, cfg.topologies, strict=True):
        if names.count(n) > 1:
            raise SweepError(f"{cfg.source}: topologies: two files are named {n!r} (one is {t}); "
                             "give each topology YAML a distinct name:")
        if not NAME_OK.match(n):
            raise SweepError(f"{t}: topology name {n!r} cannot name a directory; rename it")
    return topos


def _capture_one(workload: str, topology: Any, params: dict[str, Any], out: str) -> str:
    """Capture one workload (top level: worker processes import it)."""
    from kbtrace.capture import capture
    capture(workload, topology, params, out)
    return out


def _capture_args(a: tuple[str, Any, dict[str, Any], str]) -> float:
    """Capture one workload; its CPU seconds (in the process that ran it)."""
    c0 = time.process_time()
    _capture_one(*a)
    return time.process_time() - c0


def _job(job: tuple[str, Any]) -> Any:
    """One job of a pipelined sweep (top level: workers import it): a capture or a point."""
    kind, a = job
    return _capture_args(a) if kind == "capture" else run_point(a)


#: a workload to capture: (workload, topology path, params, trace directory)
_Cap = tuple[str, str, dict[str, Any], str]


def _trace_dirs(cfg: SweepConfig, out: Path,
                topos: list[Any]) -> tuple[dict[tuple[str, str], str], list[_Cap]]:
    """Trace directory per (trace, topology path), and the workloads to capture (once per
    topology, into ``OUT/traces/<name>-<topology>``)."""
    dirs: dict[tuple[str, str], str] = {}
    caps: list[_Cap] = []
    for t in cfg.traces:
        for topo, compiled in zip(cfg.topologies, topos, strict=True):
            if t.path is not None:
                if not (Path(t.path) / "ops.parquet").is_file():
                    raise SweepError(f"{cfg.source}: traces: {t.path} is not a trace directory "
                                     "(no ops.parquet); run `kbtrace capture` first")
                dirs[t.name, topo] = t.path
            else:
                d = str(out / "traces" / f"{t.name}-{compiled.params.name}")
                caps.append((t.workload or "", topo, dict(t.params), d))
                dirs[t.name, topo] = d
    return dirs, caps


def _capture_error(cfg: SweepConfig, caps: Sequence[_Cap],
                   errors: Mapping[int, KbtraceError]) -> SweepError:
    """The first failed capture in config order, as the sweep's error."""
    k = min(errors)
    return SweepError(f"{cfg.source}: workloads: {caps[k][0]} on {caps[k][1]}: {errors[k]}")


def _capture_all(cfg: SweepConfig, caps: list[_Cap], pool: Pool | None, cpu: SweepCpu) -> None:
    """Capture every workload before any point runs: in this process, or, when there are
    several and a ``pool``, here and in its workers at once (each capture's CPU seconds to
    ``cpu.jobs``)."""
    errors: dict[int, KbtraceError] = {}
    took = [0.0] * len(caps)

    def done(k: int, ok: bool, res: Any) -> None:
        if not ok:
            if not isinstance(res, KbtraceError):
                raise res
            errors[k] = res
        else:
            took[k] = res

    if pool is not None and len(caps) > 1:
        here = pool.run(_capture_args, caps, done)    # here and in the workers at once
    else:
        here = set(range(len(caps)))
        for k, a in enumerate(caps):
            try:
                done(k, True, _capture_args(a))
            except KbtraceError as e:
                done(k, False, e)
    cpu.jobs += [JobCpu("capture", k, took[k], k in here) for k in range(len(caps))]
    if errors:
        raise _capture_error(cfg, caps, errors) from None


def points(cfg: SweepConfig, trace_dirs: Mapping[tuple[str, str], str],
           topo_names: Sequence[str]) -> list[Point]:
    keys = [k for k, _ in cfg.grid]
    combos = list(itertools.product(*(v for _, v in cfg.grid)))
    out: list[Point] = []
    for t in cfg.traces:
        for topo, tname in zip(cfg.topologies, topo_names, strict=True):
            for fid in cfg.fidelities:
                for combo in combos:
                    out.append(Point(len(out), t.name, trace_dirs[t.name, topo], topo, tname, fid,
                                     tuple(zip(keys, combo, strict=True)), cfg.check_invariants,
                                     t.grid))
    return out


def _point_keys(pts: Sequence[Point]) -> list[str]:
    """Identity of each point's result: its config plus trace and topology content (each
    trace.json and topology YAML read once)."""
    trace_hash: dict[str, Any] = {}
    topo_text: dict[str, str] = {}
    keys = []
    for p in pts:
        if p.trace_dir not in trace_hash:
            meta = Path(p.trace_dir) / "trace.json"
            trace_hash[p.trace_dir] = (read_json_object(meta, "re-capture the workload")
                                       .get("content_hash") if meta.is_file() else None)
        if p.topology not in topo_text:
            topo_text[p.topology] = Path(p.topology).read_text()
        cfg = {k: v for k, v in p.as_json().items() if k not in ("trace_dir", "topology")}
        keys.append(stable_hash(cfg, trace_hash[p.trace_dir], topo_text[p.topology], __version__))
    return keys


# --------------------------------------------------------------------------- running

def run_point(job: dict[str, Any]) -> dict[str, Any]:
    """Replay one point (``job``: ``Point.as_json()`` plus ``out`` and ``key``); write its
    ``point.json``; return its result fields. Top-level so worker processes and Ray can
    import it. Errors are recorded, never raised."""
    from kbtrace.replay.engine import replay
    from kbtrace.replay.options import ReplayOptions
    from kbtrace.topology import compile_topology
    c0 = time.process_time()
    out = Path(job["out"])
    res: dict[str, Any] = {**dict.fromkeys(_RESULT), "status": "ok"}
    try:
        check_pinned(job)
        topo = compile_topology(job["topology"], overrides=dict(job["params"]))
        # the point's run replaces its earlier one whole (replay's atomic_dir)
        run = replay(job["trace_dir"], topo, ReplayOptions(
            fidelity=job["fidelity"], out_dir=str(out), check_invariants=job["check_invariants"]))
        check_pinned(job, out / "run.json")
        res.update(run_id=run.run_id, makespan_ns=run.makespan_ns, ops=run.ops, hops=run.hops,
                   events=run.events, wall_s=round(run.wall_s, 3), body_ns=_body_ns(out))
    except KbtraceError as e:
        res.update(status="error", error=str(e))
    except Exception as e:  # a model bug: keep the traceback, let the other points run
        res.update(status="error", error=f"internal error: {type(e).__name__}: {e}",
                   traceback=traceback.format_exc())
    point = {k: v for k, v in job.items() if k != "out"}
    res["cpu_s"] = round(time.process_time() - c0, 4)    # (the point.json write left out)
    write_point(out, {**point, **res})
    return res


def _body_ns(run_dir: Path) -> float | None:
    """Kernel body time of a run: per launch, barrier to last program end, summed."""
    launches = read_json_object(run_dir / "run.json", "re-run the sweep").get("launches") or []
    if not launches:
        return None
    return float(sum(ln["t_body_end_ns"] - ln["t_barrier_ns"] for ln in launches))


def _reusable(job: dict[str, Any]) -> dict[str, Any] | None:
    f = Path(job["out"]) / "point.json"
    if not f.is_file() or not (Path(job["out"]) / "run.json").is_file():
        return None
    try:
        prev = json.loads(f.read_text())
    except ValueError:
        return None
    if prev.get("key") != job["key"] or prev.get("status") != "ok":
        return None
    return {k: prev.get(k) for k in _RESULT}


def _took(jobs: Sequence[dict[str, Any]]) -> list[float] | None:
    """Each point's CPU seconds in the sweep's previous run (its point.json ``cpu_s``) when
    every one of them has it, else None: a re-run hands points out largest first by these
    (trace ops cannot tell two points of one trace apart; the points' outputs do not depend
    on the order)."""
    out = []
    for j in jobs:
        f = Path(j["out"]) / "point.json"
        try:
            c = json.loads(f.read_text()).get("cpu_s") if f.is_file() else None
        except (OSError, ValueError, AttributeError):
            c = None
        if not isinstance(c, (int, float)) or isinstance(c, bool) or c <= 0:
            return None
        out.append(float(c))
    return out


def _grid_type(vals: Sequence[Any]) -> pa.DataType:
    if all(isinstance(v, bool) for v in vals):
        return pa.bool_()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return pa.int64()
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return pa.float64()
    return pa.string()


def points_table(cfg: SweepConfig, pts: Sequence[Point],
                 results: Sequence[dict[str, Any]]) -> pa.Table:
    """``schema.SWEEP_POINTS`` columns, then one typed column per grid key, then one per
    workload grid key."""
    cols: dict[str, list[Any]] = {
        "point": [p.index for p in pts], "trace": [p.trace for p in pts],
        "topology": [p.topology_name for p in pts], "fidelity": [p.fidelity for p in pts],
        "params_json": [json.dumps(dict(p.params), sort_keys=True) for p in pts],
        "run_dir": [p.rel_dir for p in pts]}
    fields = list(schema.SWEEP_POINTS)      # the rest: the replay's result fields
    arrays = [pa.array(cols[f.name] if f.name in cols else [r.get(f.name) for r in results],
                       f.type) for f in fields]
    for key, vals in cfg.grid:
        typ = _grid_type(vals)
        fields.append(pa.field(key, typ, nullable=False,
                               metadata={"unit": "-", "doc": f"grid value of {key}"}))
        arrays.append(pa.array([dict(p.params)[key] for p in pts], typ))
    for key in cfg.workload_grid_keys:     # null for traces not gridded over the key
        wvals = [dict(p.workload_params).get(key) for p in pts]
        typ = _grid_type([v for v in wvals if v is not None])
        fields.append(pa.field(key, typ, nullable=True,
                               metadata={"unit": "-", "doc": f"workload grid value of {key}"}))
        arrays.append(pa.array(wvals, typ))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields,
                                                          metadata=schema.SWEEP_POINTS.metadata))


def run_sweep(config: str | Path | Mapping[str, Any] | SweepConfig, out_dir: str | Path, *,
              jobs: int = 1, executor: str = "local", resume: bool = False,
              grid: Mapping[str, Sequence[Any]] | None = None,
              on_point: Callable[[Point, dict[str, Any]], None] | None = None) -> SweepResult:
    """Run a sweep (see module docstring); return its ``SweepResult``.

    ``on_point(point, result)`` is called as each point finishes (in finishing order).
    Failed points are listed in ``SweepResult.failed``; they do not raise."""
    cpu = SweepCpu()
    clock, children0 = Clock(cpu), children_cpu_s()
    cfg = config if isinstance(config, SweepConfig) else load_config(config, grid)
    clock.lap("config")
    if executor not in EXECUTORS:
        raise SweepError(f"executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    if jobs < 1:
        raise SweepError(f"jobs: {jobs} must be >= 1")
    out = Path(out_dir)
    meta = {"kbtrace_version": __version__, "schema_version": schema.SCHEMA_VERSION,
            "config": cfg.as_json(), "source": cfg.source}
    prev = out / "sweep.json"
    inputs = [cfg.source, *cfg.topologies, *(t.path for t in cfg.traces)]
    if prev.is_file() and owner(out) == "sweep":
        try:
            old = json.loads(prev.read_text()).get("config")
        except ValueError:
            old = None
        if old != meta["config"]:
            raise SweepError(f"{out}: holds a different sweep (sweep.json); write to another "
                             "-o directory or delete this one")
    created = not out.exists()
    claim_dir(out, "sweep", inputs)        # ours, empty or nothing; never an input
    pool = Pool(jobs) if jobs > 1 and executor == "local" else None
    try:
        res = _run(cfg, out, meta, created, pool, executor, resume, on_point, clock)
    finally:
        if pool is not None:
            pool.close()
    clock.lap("close")
    cpu.workers_s = children_cpu_s() - children0      # (reaped by close)
    return res


def _undo(out: Path, created: bool) -> None:
    """Nothing ran: leave no empty directories behind (captures are atomic: a failed one
    left nothing in traces/)."""
    if created:
        (out / MARKER).unlink(missing_ok=True)
    for d in (out / "traces", out) if created else (out / "traces",):
        with contextlib.suppress(OSError):
            d.rmdir()                   # only if empty


def _run(cfg: SweepConfig, out: Path, meta: dict[str, Any], created: bool, pool: Pool | None,
         executor: str, resume: bool,
         on_point: Callable[[Point, dict[str, Any]], None] | None, clock: Clock) -> SweepResult:
    """``run_sweep`` once its output directory is claimed; ``clock`` charges this process's
    CPU to the sweep's phases (``_sweepcpu``)."""
    cpu = clock.cpu
    try:
        topos = _topologies(cfg)
        dirs, caps = _trace_dirs(cfg, out, topos)
        pts = points(cfg, dirs, [t.params.name for t in topos])
        clock.lap("plan")
        # two or more workloads and workers at hand: each trace's points start once it is
        # captured (_piped); else every capture first, then the points
        piped = pool is not None and len(caps) > 1 and not resume
        if not piped:
            _capture_all(cfg, caps, pool, cpu)
            clock.lap("capture")
    except KbtraceError:
        _undo(out, created)
        raise
    meta["points"] = len(pts)
    jobs_l = [{**p.as_json(), "out": str(out / p.rel_dir)} for p in pts]
    running = [False]

    def prepare(idx: Sequence[int]) -> None:
        """Pin the points' traces and key the points (once the traces exist)."""
        sub = [pts[i] for i in idx]
        pinned = pin_traces(p.trace_dir for p in sub)
        for i, key in zip(idx, _point_keys(sub), strict=True):
            jobs_l[i].update(key=key, trace_hash=pinned[pts[i].trace_dir])
        if not running[0] and idx:
            # until every point is done, the sweep says so: an interrupted sweep is re-run
            # or resumed (same config), and never reads as complete with points of two runs
            (out / "points.parquet").unlink(missing_ok=True)
            write_json(out / "sweep.json", {**meta, "status": "running"})
            running[0] = True

    results: list[dict[str, Any] | None] = [None] * len(pts)

    def finished(i: int, res: dict[str, Any]) -> None:
        results[i] = res
        if on_point:
            on_point(pts[i], res)

    cap_of = {c[3]: k for k, c in enumerate(caps)}     # trace dir -> its capture
    took = _took(jobs_l) if not created else None
    # largest first: by the CPU seconds of the previous run, else by a prediction
    # (``_sweepcost``; asked for a point once its trace is captured)
    size = (lambda i: took[i]) if took else (lambda i: cost(jobs_l[i]))
    order: list[int] = []      # the points in the order -j N prefers them
    if piped:
        assert pool is not None
        here, errors = _piped(caps, pts, jobs_l, pool, prepare, finished, cap_of, cpu, size)
        if errors:                  # raised once the running jobs ended
            if not running[0]:
                _undo(out, created)
            raise _capture_error(cfg, caps, errors) from None
        todo = list(range(len(pts)))
        reused = 0
        order = sorted(todo, key=lambda i: (-size(i), i))
    else:
        prepare(range(len(pts)))
        todo, reused = [], 0
        for i, j in enumerate(jobs_l):
            r = _reusable(j) if resume else None
            if r is None:
                todo.append(i)
            else:
                reused += 1
                finished(i, r)
        clock.lap("prepare")
        order_k, here_k = execute(run_point, [jobs_l[i] for i in todo], pool, executor,
                                  lambda k, res: finished(todo[k], res),
                                  [took[i] for i in todo] if took else None, cost)
        here = {todo[k] for k in here_k}
        order = [todo[k] for k in order_k]
    clock.lap("run")
    # the points as -j N prefers them (largest first), each after its trace's capture
    cpu.jobs += [JobCpu("point", i, float((results[i] or {}).get("cpu_s") or 0.0), i in here,
                        (cap_of[pts[i].trace_dir],) if pts[i].trace_dir in cap_of else ())
                 for i in order]
    res_l = [r for r in results if r is not None]
    table = points_table(cfg, pts, res_l)
    write_table(out / "points.parquet", table)
    write_json(out / "sweep.json", {**meta, "status": "complete"})
    failed = [{"point": p.index, "run_dir": p.rel_dir, "error": r.get("error")}
              for p, r in zip(pts, res_l, strict=True) if r.get("status") != "ok"]
    clock.lap("write")
    return SweepResult(out, table, failed, reused, cpu)


def _piped(caps: list[_Cap], pts: list[Point], jobs_l: list[dict[str, Any]], pool: Pool,
           prepare: Callable[[Sequence[int]], None],
           finished: Callable[[int, dict[str, Any]], None], cap_of: Mapping[str, int],
           cpu: SweepCpu, size: Callable[[int], float]) -> tuple[set[int], dict[int, KbtraceError]]:
    """Captures and points as one set of jobs (``Pool.run``): every capture first (config
    order), each point once its trace is captured (pinned and keyed then), largest first
    (``size``: of a point, ranked once its trace is captured).
    Returns the points run here and the captures that failed (no job starts after the
    first failure; those running end)."""
    n_caps = len(caps)
    by_cap: dict[int, list[int]] = {}
    for i, p in enumerate(pts):
        if p.trace_dir in cap_of:
            by_cap.setdefault(cap_of[p.trace_dir], []).append(i)
    prepare([i for i, p in enumerate(pts) if p.trace_dir not in cap_of])   # traces given
    took = [0.0] * n_caps
    errors: dict[int, KbtraceError] = {}

    def rank(j: int) -> tuple[int, float, int]:
        return (0, 0.0, j) if j < n_caps else (1, -size(j - n_caps), j)

    def done(j: int, ok: bool, res: Any) -> None:
        if j < n_caps:
            if ok:
                took[j] = res
                prepare(by_cap.get(j, []))      # (before its points are released)
            elif isinstance(res, KbtraceError):
                errors[j] = res
                pool.halt()
            else:
                raise res
        elif ok:
            finished(j - n_caps, res)
        elif not errors:        # (the points of a failed capture are not run)
            raise res

    args: list[tuple[str, Any]] = [("capture", c) for c in caps]
    args += [("point", j) for j in jobs_l]
    after = [()] * n_caps + [(cap_of[p.trace_dir],) if p.trace_dir in cap_of else ()
                             for p in pts]
    here = pool.run(_job, args, done, after, rank)
    cpu.jobs += [JobCpu("capture", k, took[k], k in here) for k in range(n_caps)]
    return {j - n_caps for j in here if j >= n_caps}, errors

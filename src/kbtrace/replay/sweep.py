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
only once they are up. Two or more workloads are captured here and in the workers at once.
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
from kbtrace.replay._sweepsafe import Pool, check_pinned, execute, pin_traces, write_point
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
#: What a point's replay yields (point.json; all but wall_s also go to points.parquet).
_RESULT = ("status", "error", "run_id", "makespan_ns", "body_ns", "ops", "hops", "events",
           "wall_s")

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
    """A finished sweep: its directory, the points table, what failed and what was reused."""
    out_dir: Path
    points: pa.Table
    failed: list[dict[str, Any]] = field(default_factory=list)
    reused: int = 0

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


def _capture_args(a: tuple[str, Any, dict[str, Any], str]) -> str:
    return _capture_one(*a)


def _trace_dirs(cfg: SweepConfig, out: Path, topos: list[Any],
                pool: Pool | None = None) -> dict[tuple[str, str], str]:
    """Trace directory per (trace, topology path); workloads are captured once each, in this
    process and, when there are several, in ``pool``'s workers at the same time."""
    dirs: dict[tuple[str, str], str] = {}
    todo: list[tuple[Any, str, Any, Path]] = []
    for t in cfg.traces:
        for topo, compiled in zip(cfg.topologies, topos, strict=True):
            if t.path is not None:
                if not (Path(t.path) / "ops.parquet").is_file():
                    raise SweepError(f"{cfg.source}: traces: {t.path} is not a trace directory "
                                     "(no ops.parquet); run `kbtrace capture` first")
                dirs[t.name, topo] = t.path
            else:
                d = out / "traces" / f"{t.name}-{compiled.params.name}"
                todo.append((t, topo, compiled, d))
                dirs[t.name, topo] = str(d)
    args = [(t.workload, topo, dict(t.params), str(d)) for t, topo, _compiled, d in todo]
    errors: dict[int, KbtraceError] = {}

    def done(k: int, ok: bool, res: Any) -> None:
        if not ok:
            if not isinstance(res, KbtraceError):
                raise res
            errors[k] = res

    if pool is not None and len(todo) > 1:
        pool.run(_capture_args, args, done)    # here and in the workers at once
    else:
        for k, a in enumerate(args):
            try:
                done(k, True, _capture_args(a))
            except KbtraceError as e:
                done(k, False, e)
    if errors:                           # in config order: the first failure is reported
        k = min(errors)
        raise SweepError(f"{cfg.source}: workloads: {todo[k][0].workload} on {todo[k][1]}: "
                         f"{errors[k]}") from None
    return dirs


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
    cfg = config if isinstance(config, SweepConfig) else load_config(config, grid)
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
        return _run(cfg, out, meta, created, pool, executor, resume, on_point)
    finally:
        if pool is not None:
            pool.close()


def _run(cfg: SweepConfig, out: Path, meta: dict[str, Any], created: bool, pool: Pool | None,
         executor: str, resume: bool,
         on_point: Callable[[Point, dict[str, Any]], None] | None) -> SweepResult:
    """``run_sweep`` once its output directory is claimed."""
    try:
        topos = _topologies(cfg)
        pts = points(cfg, _trace_dirs(cfg, out, topos, pool), [t.params.name for t in topos])
    except KbtraceError:
        # nothing ran: leave no empty directories behind (captures are atomic: a failed one
        # left nothing in traces/)
        if created:
            (out / MARKER).unlink(missing_ok=True)
        for d in (out / "traces", out) if created else (out / "traces",):
            with contextlib.suppress(OSError):
                d.rmdir()                   # only if empty
        raise
    meta["points"] = len(pts)
    pinned = pin_traces(p.trace_dir for p in pts)
    jobs_l = [{**p.as_json(), "out": str(out / p.rel_dir), "key": k,
               "trace_hash": pinned[p.trace_dir]}
              for p, k in zip(pts, _point_keys(pts), strict=True)]
    # until every point is done, the sweep says so: an interrupted sweep is re-run or
    # resumed (same config), and never reads as complete with points of two runs
    (out / "points.parquet").unlink(missing_ok=True)
    write_json(out / "sweep.json", {**meta, "status": "running"})
    results: list[dict[str, Any] | None] = [None] * len(pts)
    todo: list[int] = []
    reused = 0
    for i, j in enumerate(jobs_l):
        r = _reusable(j) if resume else None
        if r is None:
            todo.append(i)
        else:
            results[i] = r
            reused += 1
            if on_point:
                on_point(pts[i], r)

    def done(k: int, res: dict[str, Any]) -> None:
        i = todo[k]
        results[i] = res
        if on_point:
            on_point(pts[i], res)

    execute(run_point, [jobs_l[i] for i in todo], pool, executor, done)
    res_l = [r for r in results if r is not None]
    table = points_table(cfg, pts, res_l)
    write_table(out / "points.parquet", table)
    write_json(out / "sweep.json", {**meta, "status": "complete"})
    failed = [{"point": p.index, "run_dir": p.rel_dir, "error": r.get("error")}
              for p, r in zip(pts, res_l, strict=True) if r.get("status") != "ok"]
    return SweepResult(out, table, failed, reused)

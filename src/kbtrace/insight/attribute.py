"""Bottleneck attribution: which resource class, made faster, shortens the run most.

For each resource class (``resources.RESOURCES``) the run's trace is replayed on its
topology with that one class made ``factor`` times faster, and (``reverse``) ``factor``
times slower, through the sweep machinery (``replay.sweep.run_point`` / ``execute``:
one process per point with ``jobs > 1``, or Ray). The makespans are ranked into
``attribution.parquet`` (``schema.ATTRIBUTION``) in ``RUN/attribution/`` (or ``out``);
``kbtrace report RUN`` shows that table and a tornado chart. A class whose parameters are
all zero (nothing to scale) is not replayed: its makespan is the base one.

The point replays are written into the output's staging directory and deleted when the
makespans are read (they would otherwise nest run directories inside the run).
``method="whatif"`` estimates each class with ``Retimer`` (``whatif``'s re-timing; the run
is prepared once) instead, replaying only what it cannot price: several times cheaper, an
estimate (``kbtrace run``'s headline uses it).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from kbtrace import schema
from kbtrace._io import atomic_dir, stable_hash, write_json, write_table
from kbtrace.errors import ReplayError, UsageError
from kbtrace.insight.base import BaseRun, load_base
from kbtrace.insight.resources import RESOURCES, check_resources, get_param, scaled

__all__ = ["attribute", "Attribution", "MARKER"]

MARKER = "attribution.json"
_BY_NAME = {r.name: r for r in RESOURCES}


@dataclass
class Attribution:
    """A finished attribution: the ranked table (``schema.ATTRIBUTION``) and where it went."""
    out_dir: Path
    table: pa.Table
    base_makespan_ns: float
    replays: int
    wall_s: float
    estimates: int = 0         # makespans re-timed (method="whatif") instead of replayed
    #: re-timed classes whose recorded service order could flip (``whatif``'s flag): class ->
    #: the largest error estimate (ns) of its factors; those gains are rougher estimates
    flagged: dict[str, float] = field(default_factory=dict)

    @property
    def top(self) -> dict[str, Any] | None:
        """The first-ranked row (None when no class changes the makespan)."""
        rows = self.table.to_pylist()
        return rows[0] if rows and rows[0]["faster_gain_pct"] > 0 else None

    def frame(self) -> Any:
        """The ranked table as a polars frame (``--format csv|md|json``)."""
        import polars as pl
        return pl.from_arrow(self.table)

    def text(self) -> str:
        rows = self.table.to_pylist()
        f = rows[0]["factor"] if rows else 2.0
        rev = any(r["slower_makespan_ns"] is not None for r in rows)
        head = (f"| rank | resource | {f:g}x faster: makespan ns | gain | elasticity |"
                + (f" {f:g}x slower: makespan ns | loss |" if rev else ""))
        how = (f" ({self.estimates} re-timed estimates, {self.replays} replays"
               + (f"; order could flip for {', '.join(self.flagged)}: replay those with "
                  "method=replay" if self.flagged else "") + ")" if self.estimates else "")
        lines = [f"base makespan {self.base_makespan_ns:,.1f} ns; each resource class "
                 f"{f:g}x faster" + (" and slower" if rev else "") + how + ":", head,
                 "|" + "---|" * (head.count("|") - 1)]
        for r in rows:
            line = (f"| {r['rank']} | {r['resource']} | {r['faster_makespan_ns']:,.1f} | "
                    f"{r['faster_gain_pct']:+.2f}% | {r['elasticity']:.3f} |")
            if rev:
                line += f" {r['slower_makespan_ns']:,.1f} | {r['slower_loss_pct']:+.2f}% |"
            lines.append(line)
        return "\n".join(lines)


def _changes(base: BaseRun, name: str, factor: float) -> dict[str, Any] | None:
    """The class's overrides at ``factor``, or None when they change nothing (all zero)."""
    p = base.topology.params
    ov = scaled(p, name, factor)
    cur = {k: [asdict(c) for c in p.sip.io_chiplets] if k == "sip.io_chiplets"
           else get_param(p, k) for k in ov}
    return None if ov == cur else ov


def attribute(run: str | os.PathLike[str], *, factor: float = 2.0, reverse: bool = True,
              resources: list[str] | tuple[str, ...] | None = None,
              topology: str | os.PathLike[str] | None = None,
              overrides: dict[str, Any] | None = None, jobs: int = 1, executor: str = "local",
              out: str | os.PathLike[str] | None = None, method: str = "replay"
              ) -> Attribution:
    """Replay the run's trace with each resource class ``factor`` x faster (and, with
    ``reverse``, ``factor`` x slower); rank the makespan sensitivities; write
    ``attribution.parquet`` and ``attribution.json`` into ``out`` (default
    ``RUN/attribution``). ``topology`` / ``overrides``: the machine the run was replayed on
    when run.json's path no longer gives it (checked against the recorded hash).
    ``method="whatif"``: estimate each class with the what-if re-timing (``Retimer``, the
    run prepared once) instead of replaying it; classes it cannot price and runs with
    composite ops are still replayed. Cheaper, and an estimate."""
    from kbtrace.analysis.reporter import run_inputs
    from kbtrace.replay.sweep import EXECUTORS, execute, run_point

    if method not in ("replay", "whatif"):
        raise UsageError(f"attribute: method {method!r}: use replay or whatif")
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 1):
        raise UsageError(f"attribute: factor {factor}: must be a number > 1 (2 = twice as "
                         "fast; the reverse 1/factor is replayed with --reverse)")
    if executor not in EXECUTORS:
        raise UsageError(f"attribute: executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    if jobs < 1:
        raise UsageError(f"attribute: jobs {jobs}: must be >= 1")
    names = check_resources(resources, "attribute")
    t0 = time.perf_counter()
    base = load_base(run, topology, overrides, where="attribute")
    out_dir = Path(out) if out is not None else base.run_dir / "attribution"
    factors = (factor, 1.0 / factor) if reverse else (factor,)
    inputs = run_inputs([base.run_dir], base.trace_dir, skip=("attribution",))
    with atomic_dir(out_dir, "attribution", inputs) as stage:
        jobs_l: list[dict[str, Any]] = []
        slots: list[tuple[str, int]] = []
        makespan: dict[tuple[str, int], float] = {}
        retimer = _retimer(base) if method == "whatif" else None
        estimated: list[str] = []
        flagged: dict[str, float] = {}
        for name in names:
            for i, f in enumerate(factors):
                ov = _changes(base, name, f)
                if ov is None:
                    makespan[name, i] = base.makespan_ns
                    continue
                params = {**base.overrides, **ov}
                est = _estimate(retimer, base, params) if retimer is not None else None
                if est is not None:
                    makespan[name, i] = est.makespan_ns
                    estimated.append(name)
                    if est.flips or est.new_overlaps:
                        flagged[name] = max(flagged.get(name, 0.0), est.error_bound_ns)
                    continue
                jobs_l.append({"point": len(jobs_l), "trace": base.trace_dir.name,
                               "trace_dir": str(base.trace_dir), "topology": base.topology_path,
                               "topology_name": base.topology.params.name,
                               "fidelity": base.fidelity, "params": params,
                               "check_invariants": base.check_invariants,
                               "run_dir": f"{name}-{'faster' if i == 0 else 'slower'}",
                               "out": str(stage / "points" / f"{name}-{i}"),
                               "key": stable_hash(name, f, str(base.trace_dir))})
                slots.append((name, i))
        errors: list[str] = []

        def done(k: int, res: dict[str, Any]) -> None:
            if res.get("status") != "ok":
                errors.append(f"{slots[k][0]} x{factors[slots[k][1]]:g}: {res.get('error')}")
            else:
                makespan[slots[k]] = float(res["makespan_ns"])

        execute(run_point, jobs_l, jobs, executor, done)
        if errors:
            raise ReplayError(f"attribute: {len(errors)} replay(s) failed; first: {errors[0]}")
        shutil.rmtree(stage / "points", ignore_errors=True)
        table = _table(base, names, factor, reverse, makespan)
        write_table(stage / "attribution.parquet", table)
        write_json(stage / MARKER, {
            "run": str(base.run_dir), "run_id": base.info.get("run_id"),
            "trace": str(base.trace_dir), "topology": base.topology_path,
            "overrides": base.overrides, "fidelity": base.fidelity, "factor": factor,
            "reverse": reverse, "resources": {n: list(_BY_NAME[n].keys) for n in names},
            "replays": len(jobs_l), "method": method,
            "estimated": list(dict.fromkeys(estimated)),
            "flagged": {k: round(v, 3) for k, v in flagged.items()}})
    return Attribution(out_dir, table, base.makespan_ns, len(jobs_l),
                       time.perf_counter() - t0, len(estimated), flagged)


def _retimer(base: BaseRun) -> Any:
    """The run prepared for re-timing, or None when it cannot be (composite ops)."""
    from kbtrace.insight.retime import Retimer
    rt = Retimer(base)
    return None if rt.composite else rt


def _estimate(rt: Any, base: BaseRun, params: dict[str, Any]) -> Any:
    """The re-timing (``retime.Estimate``) with ``params``, or None when it cannot price
    them."""
    from kbtrace.insight.whatif import _check_keys
    from kbtrace.topology import compile_topology
    try:
        _check_keys({k: v for k, v in params.items() if k not in base.overrides
                     or base.overrides[k] != v})
    except UsageError:
        return None
    topo = compile_topology(base.topology_path, overrides=params)
    if len(topo.nodes) != len(base.topology.nodes) or len(topo.links) != len(base.topology.links):
        return None
    return rt.retime(topo)


def _table(base: BaseRun, names: tuple[str, ...], factor: float, reverse: bool,
           makespan: dict[tuple[str, int], float]) -> pa.Table:
    b = base.makespan_ns
    rows: list[dict[str, Any]] = []
    for order, name in enumerate(names):
        fast = makespan[name, 0]
        slow = makespan.get((name, 1)) if reverse else None
        rows.append({
            "resource": name, "keys": ",".join(_BY_NAME[name].keys), "factor": float(factor),
            "base_makespan_ns": b, "faster_makespan_ns": fast,
            "faster_gain_pct": round(100.0 * (b - fast) / b, 6) if b else 0.0,
            "elasticity": round(math.log(b / fast) / math.log(factor), 6) if b and fast else 0.0,
            "slower_makespan_ns": slow,
            "slower_loss_pct": round(100.0 * (slow - b) / b, 6) if slow is not None and b
            else None, "_order": order})
    rows.sort(key=lambda r: (-r["faster_gain_pct"], -(r["slower_loss_pct"] or 0.0), r["_order"]))
    cols: dict[str, list[Any]] = {f.name: [] for f in schema.ATTRIBUTION}
    for rank, r in enumerate(rows, 1):
        r["rank"] = rank
        for c in cols:
            cols[c].append(r[c])
    return pa.Table.from_pydict(cols, schema=schema.ATTRIBUTION)

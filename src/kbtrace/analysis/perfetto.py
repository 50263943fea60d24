"""``kbtrace export perfetto``: the run as Chrome trace-event JSON (opens in ui.perfetto.dev).

Mapping
    process  one per (SIP, cube) (``pid = 1 + sip * 1000 + cube``) plus one "host/io"
             process for engines outside cubes; named ``sipS.cubeC``.
    thread   one track per engine (``op_timing.engine``), named by its node id relative
             to the cube (``pe3.dma``). Ops overlapping on one engine (DMA channels,
             async composites) spill onto extra lanes named ``pe3.dma [2]``, ... so every
             slice nests correctly; lane 1 is the engine's track.
    slice    ``X`` event per op: name ``kind/name``, args op_id, launch, program, seq,
             queue_ns, nbytes. Timestamps are microseconds (ns / 1000).
    flow     ``s``/``f`` pairs for transfers between engines: every IPCQ send -> recv
             pair and every dependency whose producer ran on another engine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kbtrace._io import atomic_path

__all__ = ["export_perfetto", "trace_events"]

_MAX_FLOWS = 50_000


def _split(engine: str) -> tuple[str, str]:
    parts = engine.split(".")
    if len(parts) >= 3 and parts[0].startswith("sip") and parts[1].startswith("cube"):
        return ".".join(parts[:2]), ".".join(parts[2:])
    return "host/io", engine


def trace_events(run: Any) -> list[dict[str, Any]]:
    """Trace events for an open Run (deterministic order)."""
    ops = run.sql("SELECT t.op_id, t.launch, t.program, t.seq, CAST(t.kind AS VARCHAR) AS kind, "
                  "CAST(t.name AS VARCHAR) AS name, CAST(t.engine AS VARCHAR) AS engine, "
                  "t.t_start_ns, t.t_end_ns, t.queue_ns, t.nbytes FROM op_timing t "
                  "ORDER BY engine, t_start_ns, t_end_ns DESC, op_id").rows()
    procs: dict[str, int] = {}
    threads: dict[tuple[str, int], int] = {}
    lane_end: dict[str, list[float]] = {}
    slot: dict[int, tuple[int, int, float, float]] = {}
    events: list[dict[str, Any]] = []
    for (op_id, launch, program, seq, kind, name, engine, t0, t1, q, nb) in ops:
        proc, local = _split(engine)
        if proc not in procs:
            procs[proc] = len(procs) + 1
        lanes = lane_end.setdefault(engine, [])
        lane = next((i for i, end in enumerate(lanes) if end <= t0), None)
        if lane is None:
            lanes.append(t1)
            lane = len(lanes) - 1
        else:
            lanes[lane] = t1
        key = (engine, lane)
        if key not in threads:
            threads[key] = len(threads) + 1
        pid, tid = procs[proc], threads[key]
        slot[op_id] = (pid, tid, t0, t1)
        events.append({"ph": "X", "pid": pid, "tid": tid, "ts": t0 / 1000.0,
                       "dur": max(0.0, t1 - t0) / 1000.0, "name": f"{kind}/{name}", "cat": kind,
                       "args": {"op_id": op_id, "launch": launch, "program": program, "seq": seq,
                                "queue_ns": q, "nbytes": nb}})
    meta: list[dict[str, Any]] = []
    for proc, pid in procs.items():
        meta.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": proc}})
        meta.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index",
                     "args": {"sort_index": pid}})
    for (engine, lane), tid in threads.items():
        proc, local = _split(engine)
        label = local if lane == 0 else f"{local} [{lane + 1}]"
        meta.append({"ph": "M", "pid": procs[proc], "tid": tid, "name": "thread_name",
                     "args": {"name": label}})
        meta.append({"ph": "M", "pid": procs[proc], "tid": tid, "name": "thread_sort_index",
                     "args": {"sort_index": tid}})
    pairs = run.sql(
        "SELECT op_id AS src, match_op_id AS dst, 'ipcq' AS cat FROM ops "
        "WHERE kind = 'send' AND match_op_id IS NOT NULL "
        "UNION ALL SELECT d.dep, d.op_id, 'dep' FROM (SELECT op_id, unnest(deps) AS dep FROM ops) d "
        "JOIN op_timing a ON a.op_id = d.dep JOIN op_timing b ON b.op_id = d.op_id "
        f"WHERE a.engine <> b.engine ORDER BY 1, 2 LIMIT {_MAX_FLOWS}").rows()
    flows: list[dict[str, Any]] = []
    for i, (src, dst, cat) in enumerate(pairs):
        if src not in slot or dst not in slot:
            continue
        sp, st, s0, s1 = slot[src]
        dp, dt, d0, _ = slot[dst]
        t_src = s0 + (s1 - s0) * 0.999   # inside the producer slice, so the flow binds to it
        flows.append({"ph": "s", "id": i + 1, "pid": sp, "tid": st, "ts": t_src / 1000.0,
                      "name": cat, "cat": f"flow.{cat}"})
        flows.append({"ph": "f", "bp": "e", "id": i + 1, "pid": dp, "tid": dt,
                      "ts": d0 / 1000.0, "name": cat, "cat": f"flow.{cat}"})
    return meta + events + flows


def export_perfetto(run: Any, out: str | os.PathLike[str]) -> int:
    """Write the run's timeline as trace-event JSON; return the number of events."""
    from kbtrace.analysis.run import Run, open_run

    owned = not isinstance(run, Run)
    r = open_run(run) if owned else run
    try:
        events = trace_events(r)
        doc = {"traceEvents": events, "displayTimeUnit": "ns",
               "otherData": {"run": str(r.path), "run_id": str(r.info.get("run_id")),
                             "makespan_ns": r.makespan_ns}}
        from kbtrace.analysis.reporter import run_inputs
        with atomic_path(Path(out), run_inputs(r.run_dirs, r.trace_dir)) as tmp:
            tmp.write_text(json.dumps(doc, separators=(",", ":")))
        return len(events)
    finally:
        if owned:
            r.close()

"""The recorded run an insight starts from: its trace, its topology (as replayed) and options."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbtrace.errors import AnalysisError, UsageError

__all__ = ["BaseRun", "load_base"]


@dataclass(frozen=True)
class BaseRun:
    """A replayed run, resolved: where its trace is and the topology it was replayed on."""
    run_dir: Path
    trace_dir: Path
    topology_path: str
    overrides: dict[str, Any]
    topology: Any                 # compiled Topology (hash checked against run.json)
    fidelity: str
    check_invariants: bool
    makespan_ns: float
    info: dict[str, Any]


def load_base(run: str | os.PathLike[str], topology: str | os.PathLike[str] | None = None,
              overrides: dict[str, Any] | None = None, *, where: str = "insight") -> BaseRun:
    """Resolve a run directory: its trace and its topology (``topology`` or run.json
    ``topology.path``, plus ``overrides``), compiled and checked against the run's recorded
    topology hash, so every re-timing starts from the machine the run was timed on."""
    from kbtrace.analysis.run import find_trace_dir, read_run_json
    from kbtrace.topology import compile_topology

    run_dir = Path(run)
    if not run_dir.is_dir():
        raise AnalysisError(f"{run_dir}: no such run directory; pass a directory written by "
                            "`kbtrace replay` or `kbtrace run` (it holds run.json)")
    info = read_run_json(run_dir)
    trace_dir = find_trace_dir(run_dir, info)
    if trace_dir is None:
        raise AnalysisError(f"{run_dir}: its trace ({(info.get('trace') or {}).get('path')}) is "
                            "gone; re-capture it, or replay the trace again")
    rec_any = info.get("topology")
    rec: dict[str, Any] = rec_any if isinstance(rec_any, dict) else {}
    path = str(topology) if topology is not None else rec.get("path")
    if not path or not Path(path).is_file():
        raise UsageError(f"{where}: {run_dir}: its topology file ({path}) is not there; pass "
                         "--topology PATH (and the --set overrides it was replayed with)")
    ov = dict(overrides or {})
    topo = compile_topology(path, overrides=ov)
    if rec.get("hash") and topo.content_hash != rec["hash"]:
        sets = " ".join(f"--set {k}={v}" for k, v in ov.items()) or "no --set"
        raise UsageError(f"{where}: {run_dir} was replayed on topology {rec.get('name')!r} "
                         f"(hash {rec['hash']}), but {path} with {sets} compiles to "
                         f"{topo.content_hash}; pass the --topology and --set overrides it was "
                         "replayed with, or replay it again if the file or kbtrace changed "
                         "since")
    opts = info.get("options") or {}
    return BaseRun(run_dir, trace_dir, path, ov, topo, str(info.get("fidelity") or "fast"),
                   bool(opts.get("check_invariants", True)), float(info["makespan_ns"]), info)

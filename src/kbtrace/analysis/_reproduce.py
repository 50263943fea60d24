"""The commands that reproduce a run: ``kbtrace replay`` (same trace, topology, ``--set``
overrides, fidelity and output) and ``kbtrace capture`` (same workload parameters, topology
and overrides), from what run.json records; printed by the stale-trace error so the user can
re-make exactly the run they had."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from kbtrace._paths import resolve
from kbtrace.errors import KbtraceError

__all__ = ["reproduce_commands", "recorded_trace_path"]


def recorded_trace_path(info: dict[str, Any]) -> str | None:
    """The trace path a run.json records (``trace.path``; ``trace_dir`` in older runs)."""
    tr = info.get("trace")
    return info.get("trace_dir") or (tr.get("path") if isinstance(tr, dict) else None)


def _sets(overrides: Any) -> list[str]:
    return [f"--set {shlex.quote(f'{k}={v}')}" for k, v in sorted(overrides.items())] \
        if isinstance(overrides, dict) else []


def _short(path: str | Path) -> str:
    """``path`` relative to the current directory when it is below it, else as given."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def _topology_arg(path: str | None) -> str:
    """A topology path as ``-t`` takes it: its catalog name when that names the same file."""
    if not path:
        return "TOPOLOGY"
    stem = Path(path).stem
    try:
        if resolve(stem, "topology").resolve() == Path(path).resolve():
            return stem
    except (KbtraceError, OSError):
        pass
    return _short(path)


def reproduce_commands(run_dir: Path, info: dict[str, Any],
                       trace_dir: Path | None = None) -> tuple[str, str | None]:
    """The ``kbtrace replay`` command that re-makes ``run_dir`` from its trace (same topology,
    ``--set`` overrides and fidelity), and the ``kbtrace capture`` command that re-makes the
    trace (its workload parameters, topology and overrides; None when run.json does not
    record the workload, as in runs older than these fields)."""
    def obj(v: Any) -> dict[str, Any]:
        return v if isinstance(v, dict) else {}
    tr, topo, ov = obj(info.get("trace")), obj(info.get("topology")), obj(info.get("overrides"))
    trace = _short(trace_dir or Path(recorded_trace_path(info) or "TRACE_DIR"))
    q = shlex.quote
    replay = ["kbtrace", "replay", q(trace), "-t", q(_topology_arg(topo.get("path"))),
              *_sets(ov.get("topology") or topo.get("overrides"))]
    if info.get("fidelity") in ("flit", "fast-fcfs"):
        replay += ["--fidelity", str(info["fidelity"])]
    replay += ["-o", q(_short(run_dir))]
    wl = tr.get("workload")
    if not wl or "overrides" not in info:
        return " ".join(replay), None
    params = obj(ov.get("params"))
    capture = ["kbtrace", "capture", q(str(wl)),
               *[f"-p {q(f'{k}={v}')}" for k, v in sorted(params.items())],
               "-t", q(_topology_arg(tr.get("topology_path") or topo.get("path"))),
               *_sets(ov.get("capture_topology")), "-o", q(trace)]
    return " ".join(replay), " ".join(capture)

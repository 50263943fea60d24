"""Committed CI baselines: ``data/baselines/<workload>/{summary.json, ops.parquet}``.

``update_baselines`` captures and replays every ``capture/*.py`` workload (default
parameters, ``topologies/small.yaml``, fast fidelity) and writes its summary;
``check_baselines`` does the same into a temporary directory and diffs against the
committed files. Both are deterministic: an unchanged model reproduces the baseline
byte for byte.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kbtrace._paths import DEFAULT_TOPOLOGY, project_dir, resolve
from kbtrace.analysis.differ import DiffResult, diff
from kbtrace.analysis.main import capture_and_replay
from kbtrace.analysis.summary import Summary, summarize, write_summary
from kbtrace.errors import AnalysisError

__all__ = ["workloads", "baseline_root", "update_command", "update_baselines", "check_baselines", "fresh_summary"]


def baseline_root() -> Path:
    return project_dir("data/baselines")


def update_command(name: str, root: str | os.PathLike[str] | None = None,
                   topology: str | os.PathLike[str] | None = None) -> str:
    """The ``kbtrace baseline update`` command that (re)writes ``name``'s baseline under
    ``root``: with ``--root`` unless ``root`` is the default, so following it writes there
    (and with ``-t`` when a topology was named)."""
    cmd = f"kbtrace baseline update {name}" + (f" -t {topology}" if topology else "")
    if root is None:
        return cmd
    try:
        default = Path(root).resolve() == baseline_root().resolve()
    except OSError:
        default = False
    return cmd if default else f"{cmd} --root {root}"


def workloads(names: list[str] | None = None) -> list[Path]:
    """Workload files in capture/ (all, or those named)."""
    d = project_dir("capture")
    found = {p.stem: p for p in sorted(d.glob("*.py")) if not p.name.startswith("_")}
    if not names:
        return list(found.values())
    missing = [n for n in names if n not in found]
    if missing:
        raise AnalysisError(f"unknown workload(s) {', '.join(missing)}; available: "
                            f"{', '.join(found)}")
    return [found[n] for n in names]


def fresh_summary(workload: Path, topology: Path, fidelity: str = "fast") -> Summary:
    with tempfile.TemporaryDirectory(prefix="kbtrace-bl-") as tmp:
        capture_and_replay(workload, topology, [], fidelity, Path(tmp) / "trace",
                           Path(tmp) / "run")
        s = summarize(Path(tmp) / "run")
    meta = {**s.meta, "workload": workload.stem}
    return Summary(f"fresh:{workload.stem}", s.makespan_ns, s.stages, s.util, s.ops, meta)


def update_baselines(names: list[str] | None = None, topology: str | os.PathLike[str] | None = None,
                     root: str | os.PathLike[str] | None = None) -> Iterator[tuple[str, Path]]:
    topo = resolve(topology or DEFAULT_TOPOLOGY, "topology")
    base = Path(root) if root else baseline_root()
    for wl in workloads(names):
        yield wl.stem, write_summary(fresh_summary(wl, topo), base / wl.stem)


def check_baselines(names: list[str] | None = None, topology: str | os.PathLike[str] | None = None,
                    root: str | os.PathLike[str] | None = None,
                    fail_on: list[str] | None = None) -> Iterator[tuple[str, DiffResult]]:
    topo = resolve(topology or DEFAULT_TOPOLOGY, "topology")
    named = topology if topology and topo != resolve(DEFAULT_TOPOLOGY, "topology") else None
    base = Path(root) if root else baseline_root()
    for wl in workloads(names):
        bl = base / wl.stem
        if not (bl / "summary.json").is_file():
            raise AnalysisError(f"no baseline for {wl.stem} in {base}; create it with "
                                f"`{update_command(wl.stem, root, named)}`")
        yield wl.stem, diff(bl, fresh_summary(wl, topo), fail_on or ["makespan>2%"])

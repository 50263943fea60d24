"""``kbtrace list``: what the project holds, as frames (one per kind).

``catalog()`` returns ``{kind: polars.DataFrame}`` for the kinds in ``KINDS``:

* ``workloads``  ``capture/*.py``: name, the first line of the module docstring, PARAMS
* ``topologies`` ``topologies/*.yaml``: name, the first comment line, SIPs x cubes x PEs
* ``sweeps``     ``replay/*.yaml``: name, the first comment line
* ``studies``    the registered studies (``kbtrace study NAME``): name, description
* ``traces``     ``data/traces/*``: name, workload, op count (from trace.json)
* ``runs``       ``data/runs/*``, ``data/sweeps/*``, ``data/baselines/*``, ``data/studies/*``:
  name, kind (run / sweep / baseline / study), what it holds

Catalogs are searched as every path argument is (``kbtrace._paths``): under the current
directory, then under the repository. Nothing is written; a file that cannot be read is
listed with the reason in its description rather than stopping the listing.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import polars as pl

from kbtrace._paths import CATALOGS, REPO_ROOT, catalog_names, resolve
from kbtrace.studies.registry import LIST_KINDS

__all__ = ["KINDS", "catalog"]

KINDS = LIST_KINDS


def _doc_line(path: Path) -> tuple[str, str]:
    """(first docstring line, PARAMS as text) of a workload file, read without importing it
    (listing must not run a workload's top-level code)."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError) as e:
        return f"(unreadable: {type(e).__name__})", ""
    doc = (ast.get_docstring(tree) or "").strip().splitlines()
    params = ""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "PARAMS"
                                                for t in node.targets):
            try:
                val = ast.literal_eval(node.value)
                params = " ".join(f"{k}={v}" for k, v in val.items())
            except ValueError:
                params = ast.unparse(node.value)
    return (doc[0] if doc else ""), params


def _comment_line(path: Path) -> str:
    try:
        for line in path.read_text().splitlines():
            s = line.strip()
            if s.startswith("#"):
                return s.lstrip("#").strip()
            if s:
                return ""
    except OSError as e:
        return f"(unreadable: {e.strerror})"
    return ""


def _topology_size(path: Path) -> str:
    from kbtrace.errors import KbtraceError
    from kbtrace.topology import compile_topology
    try:
        t = compile_topology(path)
    except KbtraceError as e:
        return f"(invalid: {e})"
    return f"{t.n_sips} SIP x {t.cubes_per_sip} cubes x {t.pes_per_cube} PEs"


def _json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _dirs(kind: str) -> list[tuple[str, Path]]:
    """(catalog directory, entry) for every entry of a directory catalog."""
    out: dict[str, tuple[str, Path]] = {}
    for name in catalog_names(kind):
        p = resolve(name, kind)
        out.setdefault(name, (p.parent.name, p))
    return list(out.values())


def _runs() -> list[dict[str, str]]:
    rows = []
    kinds = {"runs": "run", "sweeps": "sweep", "baselines": "baseline"}
    for parent, p in _dirs("run"):
        if (p / "sweep.json").is_file():
            n = _json(p / "sweep.json").get("points")
            what, kind = f"{n} points", "sweep"
        elif (p / "summary.json").is_file():
            r = _json(p / "summary.json")
            m = r.get("meta", {})
            ms = r.get("makespan_ns")
            what = (f"{m.get('workload') or '?'} on {m.get('topology') or '?'} "
                    f"({m.get('fidelity')}), makespan {ms:,.1f} ns"
                    if isinstance(ms, (int, float)) else "summary.json unreadable")
            kind = "baseline"
        elif (p / "run.json").is_file():
            r = _json(p / "run.json")
            ms = r.get("makespan_ns")
            what = (f"{r.get('trace', {}).get('workload') or '?'} on "
                    f"{r.get('topology', {}).get('name') or '?'} ({r.get('fidelity')}), "
                    f"makespan {ms:,.1f} ns" if isinstance(ms, (int, float)) else "run.json unreadable")
            kind = kinds.get(parent, "run")
        else:
            what, kind = "no run.json or sweep.json", kinds.get(parent, "run")
        rows.append({"name": p.name, "kind": kind, "path": _rel(p), "description": what})
    from kbtrace._paths import project_dir
    studies = project_dir("data/studies")
    if studies.is_dir():
        for p in sorted(studies.iterdir()):
            meta = _json(p / "study.json")
            if meta:
                rows.append({"name": p.name, "kind": "study", "path": _rel(p),
                             "description": f"study {meta.get('study')} on "
                                            f"{meta.get('topology')}"
                                            f"{' (quick)' if meta.get('quick') else ''}"})
    return rows


def _rel(p: Path) -> str:
    for root in (Path.cwd(), REPO_ROOT):
        try:
            return str(p.resolve().relative_to(root.resolve()))
        except ValueError:
            continue
    return str(p)


def catalog(kinds: tuple[str, ...] = KINDS) -> dict[str, pl.DataFrame]:
    """One frame per kind (see the module docstring), rows sorted by name."""
    out: dict[str, pl.DataFrame] = {}
    for kind in kinds:
        rows: list[dict[str, str]] = []
        if kind == "workloads":
            for name in catalog_names("workload"):
                p = resolve(name, "workload")
                doc, params = _doc_line(p)
                rows.append({"name": name, "path": _rel(p), "description": doc, "params": params})
        elif kind == "topologies":
            for name in catalog_names("topology"):
                p = resolve(name, "topology")
                rows.append({"name": name, "path": _rel(p), "description": _comment_line(p),
                             "size": _topology_size(p)})
        elif kind == "sweeps":
            for name in catalog_names("sweep"):
                p = resolve(name, "sweep")
                rows.append({"name": name, "path": _rel(p), "description": _comment_line(p)})
        elif kind == "studies":
            from kbtrace.studies.registry import STUDIES
            rows = [{"name": n, "description": s.description, "reference": s.reference}
                    for n, s in sorted(STUDIES.items())]
        elif kind == "traces":
            for _parent, p in _dirs("trace"):
                meta = _json(p / "trace.json")
                rows.append({"name": p.name, "path": _rel(p),
                             "workload": str(meta.get("workload") or "?"),
                             "ops": str(meta.get("n_ops", "?"))})
        elif kind == "runs":
            rows = _runs()
        else:
            raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        cols = list(rows[0]) if rows else ["name"]
        df = pl.DataFrame(rows, schema={c: pl.Utf8 for c in cols}) if rows \
            else pl.DataFrame(schema={"name": pl.Utf8})
        out[kind] = df.sort("name")
    return out


#: where each directory catalog lives (for the CLI's "none in ..." lines)
WHERE = {"workloads": "capture/", "topologies": "topologies/", "sweeps": "replay/",
         "traces": "data/traces/",
         "runs": ", ".join(f"{d}/" for d, _ in CATALOGS["run"]) + ", data/studies/",
         "studies": "kbtrace.studies"}

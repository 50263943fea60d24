"""The SQL view library: load ``analysis/sql/*.sql`` into a DuckDB connection, document it.

Each ``.sql`` file defines ONE view (or table macro) named like the file. Its header
comment is the documentation: first line ``-- name: summary``, free text, then a
``-- Columns:`` block with one ``--   column (unit)  meaning`` line per output column.
Helper views start with ``_``. Dependencies between views are found by name, so files
are created in dependency order without a manifest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from kbtrace.errors import AnalysisError

__all__ = ["ViewDoc", "view_docs", "load_views", "catalogue_markdown", "BASE_VIEWS"]

#: Views created from files (not from SQL): the run's and trace's tables.
BASE_VIEWS = ("ops", "op_timing", "hops", "nodes", "links", "runs", "_config", "_run_meta")

_COL = re.compile(r"^--\s{2,}(\S.*?)\s+\(([^)]*)\)\s+(.*)$")


@dataclass(frozen=True, slots=True)
class ViewDoc:
    """One SQL library entry, parsed from its file header."""

    name: str
    summary: str
    text: str                              # free text below the summary line
    columns: tuple[tuple[str, str, str], ...]  # (column, unit, meaning)
    sql: str
    deps: tuple[str, ...]
    is_macro: bool

    @property
    def public(self) -> bool:
        return not self.name.startswith("_")


def _parse(name: str, src: str) -> ViewDoc:
    lines = src.splitlines()
    head = [ln for ln in lines if ln.startswith("--")]
    if not head or not head[0].startswith(f"-- {name}:"):
        raise AnalysisError(f"analysis/sql/{name}.sql: header must start with '-- {name}: ...'")
    summary = head[0].split(":", 1)[1].strip()
    text: list[str] = []
    cols: list[tuple[str, str, str]] = []
    in_cols = False
    for ln in head[1:]:
        if ln.strip() == "-- Columns:":
            in_cols = True
            continue
        if in_cols:
            m = _COL.match(ln)
            if m:
                cols.append((m.group(1), m.group(2), m.group(3).strip()))
            elif cols and ln[2:].strip():          # continuation of the previous meaning
                c, u, t = cols[-1]
                cols[-1] = (c, u, f"{t} {ln[2:].strip()}")
        else:
            text.append(ln[2:].strip())
    body = "\n".join(ln for ln in lines if not ln.startswith("--"))
    return ViewDoc(name, summary, " ".join(t for t in text if t).strip(), tuple(cols), src,
                   (), "CREATE OR REPLACE MACRO" in body)


@cache
def view_docs() -> tuple[ViewDoc, ...]:
    """Every library view, parsed, in dependency (creation) order."""
    pkg = resources.files("kbtrace.analysis") / "sql"
    raw = {p.name[:-4]: p.read_text() for p in pkg.iterdir() if p.name.endswith(".sql")}
    docs = {n: _parse(n, s) for n, s in sorted(raw.items())}
    out: list[ViewDoc] = []
    done: set[str] = set()

    def deps_of(d: ViewDoc) -> tuple[str, ...]:
        body = "\n".join(ln for ln in d.sql.splitlines() if not ln.startswith("--"))
        return tuple(n for n in docs if n != d.name and re.search(rf"\b{n}\b", body))

    def visit(n: str, stack: tuple[str, ...]) -> None:
        if n in done:
            return
        if n in stack:
            raise AnalysisError(f"analysis/sql: dependency cycle {' -> '.join(stack + (n,))}")
        d = docs[n]
        deps = deps_of(d)
        for dep in deps:
            visit(dep, stack + (n,))
        done.add(n)
        out.append(ViewDoc(d.name, d.summary, d.text, d.columns, d.sql, deps, d.is_macro))

    for n in docs:
        visit(n, ())
    return tuple(out)


def load_views(con: Any) -> None:
    """Create every library view/macro on ``con`` (base views must already exist)."""
    for d in view_docs():
        try:
            con.execute(d.sql)
        except Exception as exc:  # duckdb errors carry the SQL position
            raise AnalysisError(f"analysis/sql/{d.name}.sql: {exc}") from exc


def catalogue_markdown(include_helpers: bool = False) -> str:
    """Markdown catalogue of the SQL views (for README / docs/analysis.md)."""
    parts: list[str] = []
    for d in view_docs():
        if d.public or include_helpers:
            kind = "table macro" if d.is_macro else "view"
            parts.append(f"#### `{d.name}` ({kind})\n\n{d.summary[0].upper()}{d.summary[1:]} {d.text}\n")
            parts.append("| column | unit | meaning |\n|---|---|---|")
            parts.extend(f"| `{c}` | {u} | {m.replace('|', '/')} |" for c, u, m in d.columns)
            parts.append("")
    return "\n".join(parts)

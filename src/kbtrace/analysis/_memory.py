"""DuckDB's memory budget for an open run (issue 22: flat memory at model scale).

Above ``DUCKDB_MEMORY`` (``KBTRACE_DUCKDB_MEMORY`` overrides, e.g. 4GB), views being
materialised spill to a temporary directory of kbtrace's own instead of growing the
process: on gemm, 300k ops / 8.8M hops, the materialisation peak fell 1.87 -> 1.17 GiB with
the same rows; small runs never reach it. 512 MB, not 1 GB: at a million ops (29 M hops)
the budget is what the headline's peak grows to -- ``_crit_pred`` and ``utilisation_windows``
peaked at ~1.28 GiB under 1 GB, 0.79 GiB under 512 MB (the 100 k-op run peaks at ~0.68 GiB
either way: issue 22's target 3 is <= 1.3x per 10x ops), for ~3 CPU s more of spilling
(``_crit_pred`` 9.1-10.9 -> 12.6 s; 2026-11-26). The spill directory is the caller's (``open_run``
creates it and ``Run.close`` removes it), so DuckDB never writes its default ``.tmp`` into
the user's directory.

DuckDB keeps the memory a finished query used (its sorts, hash tables) for later queries,
outside its own accounting (``duckdb_memory()`` shows ~0), until the memory limit is set
again: ``release_cache`` sets it to the same value, which hands it back (the timeline's sort
of a million ops: +150 MiB held after the query, +0 after). The report and the timeline call
it after their large queries, before numpy and matplotlib allocate on top.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from kbtrace.errors import UsageError

__all__ = ["DUCKDB_MEMORY", "MEMORY_ENV", "limit_memory", "release_cache"]

DUCKDB_MEMORY = "512MB"
MEMORY_ENV = "KBTRACE_DUCKDB_MEMORY"
_VAR = "kbtrace_memory_limit"


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _limit() -> str:
    return os.environ.get(MEMORY_ENV) or DUCKDB_MEMORY


def limit_memory(con: duckdb.DuckDBPyConnection, spill: Path) -> None:
    """``DUCKDB_MEMORY`` (or ``$KBTRACE_DUCKDB_MEMORY``) as ``con``'s memory limit, spilling
    to ``spill``; a bad value is one ``UsageError`` line."""
    limit = _limit()
    try:
        con.execute(f"SET memory_limit = {_q(limit)}")
    except duckdb.Error:
        raise UsageError(f"{MEMORY_ENV}={limit!r} is not a memory size; use e.g. 1GB or "
                         "512MB") from None
    con.execute(f"SET temp_directory = {_q(str(spill))}")
    con.execute(f"SET VARIABLE {_VAR} = {_q(limit)}")     # for release_cache


def release_cache(con: duckdb.DuckDBPyConnection) -> None:
    """Hand back the memory DuckDB keeps from finished queries (see the module docstring):
    the memory limit ``limit_memory`` set, set again. Nothing on a connection it did not set
    up, or whose configuration is locked (a sandboxed run)."""
    try:
        limit = con.sql(f"SELECT getvariable({_q(_VAR)})").fetchall()[0][0]
        if limit is not None:
            con.execute(f"SET memory_limit = {_q(limit)}")
    except duckdb.Error:
        pass

"""A trace directory on disk, opened and checked: ``open_trace`` and ``Trace``.

A trace is ``ops.parquet`` (the op log), ``memory.parquet`` (each tensor's initial contents and
numpy references) and ``trace.json`` (workload, parameters, launches, topology, op counts,
content hashes; its keys and types in ``META_KEYS``). ``open_trace`` checks the format, the
schema version, every key of ``trace.json``, both files' schemas and the content hashes of the
files it is asked to, and returns a ``Trace``.

Kept apart from ``kbtrace.capture`` (which writes traces) so that what only reads one, such as
replay, does not import the capture engine (greenlet, the scheduler, the workload loader).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from kbtrace import schema
from kbtrace._io import file_hash, json_type, read_json_object
from kbtrace.errors import SchemaError

if TYPE_CHECKING:
    from kbtrace.capture.executor import ExecResult

__all__ = ["open_trace", "check_meta", "Trace", "TRACE_FORMAT", "META_KEYS"]

TRACE_FORMAT = "kbtrace-trace"


class Trace:
    """A trace directory: ``ops.parquet``, ``memory.parquet``, ``trace.json``."""

    def __init__(self, path: str | os.PathLike[str], meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.meta = meta
        #: wall-clock figures of the capture that produced this object (not persisted)
        self.stats: dict[str, float] = {}

    @property
    def ops_path(self) -> Path:
        return self.path / "ops.parquet"

    @property
    def memory_path(self) -> Path:
        return self.path / "memory.parquet"

    @property
    def name(self) -> str:
        return str(self.meta["workload"])

    @property
    def op_counts(self) -> dict[str, int]:
        return dict(self.meta["op_counts"])

    @property
    def n_ops(self) -> int:
        return int(self.meta["n_ops"])

    def ops(self) -> pa.Table:
        return pq.read_table(self.ops_path)

    def memory(self) -> pa.Table:
        return pq.read_table(self.memory_path)

    def execute(self, order: Sequence[int] | None = None) -> ExecResult:
        """Re-run the trace with the numpy executor (``order``: op_ids, default capture order)."""
        from kbtrace.capture.executor import execute
        return execute(self.ops(), self.memory(), order)

    def __repr__(self) -> str:
        return f"Trace({str(self.path)!r}, workload={self.name!r}, ops={self.n_ops})"


_STR, _INT, _NUM, _BOOL, _OBJ, _LIST = str, int, (int, float), bool, dict, list
#: trace.json keys -> type (every key capture writes; readers rely on each of them)
META_KEYS: dict[str, Any] = {
    "workload": _STR, "workload_file": _STR, "kbtrace_version": _STR, "params": _OBJ,
    "launches": _LIST, "topology": _OBJ, "topology.name": _STR, "topology.content_hash": _STR,
    "n_ops": _INT, "golden": _BOOL, "op_counts": _OBJ, "outputs": _LIST,
    "reference_check": _OBJ, "content_hash": _OBJ, "content_hash.ops.parquet": _STR,
    "content_hash.memory.parquet": _STR,
}
_LAUNCH_KEYS = {"kernel": _STR, "grid": _LIST, "programs": _INT, "first_op": _INT, "n_ops": _INT}
_NAMES = {_STR: "a string", _INT: "an integer", _NUM: "a number", _BOOL: "true or false",
          _OBJ: "an object", _LIST: "an array"}


def _typed(v: Any, want: Any) -> bool:
    if want in (_INT, _NUM) and isinstance(v, bool):
        return False
    return isinstance(v, want)


def check_meta(meta: dict[str, Any], where: Path) -> None:
    """trace.json holds every key capture writes, each of its type (a hand-edited or damaged
    file fails here naming the key, not later with a KeyError or TypeError)."""
    fix = "re-capture the workload (trace.json is written by kbtrace capture)"
    for key, want in META_KEYS.items():
        top, _, sub = key.partition(".")
        holder, leaf = (meta, top) if not sub else (meta.get(top), sub)
        if not isinstance(holder, dict):
            continue                     # the parent's own check reports it
        if leaf not in holder:
            raise SchemaError(f"{where}: corrupt: key {key!r} is missing; {fix}")
        v = holder[leaf]
        if not _typed(v, want):
            raise SchemaError(f"{where}: corrupt: {key} is a JSON {json_type(v)}, expected "
                              f"{_NAMES[want]}; {fix}")
    if meta["n_ops"] < 0:
        raise SchemaError(f"{where}: corrupt: n_ops = {meta['n_ops']} is negative; {fix}")
    for i, ln in enumerate(meta["launches"]):
        for key, want in _LAUNCH_KEYS.items():
            lv: Any = ln.get(key) if isinstance(ln, dict) else None
            if not _typed(lv, want) or (key == "grid" and (
                    len(lv) != 2 or not all(_typed(x, _INT) for x in lv))):
                raise SchemaError(f"{where}: corrupt: launches[{i}].{key} is missing or not "
                                  f"{_NAMES[want]}; {fix}")
    for k, v in meta["op_counts"].items():
        if not _typed(v, _INT):
            raise SchemaError(f"{where}: corrupt: op_counts.{k} is not an integer; {fix}")
    for k, v in meta["reference_check"].items():
        if not (isinstance(v, dict) and _typed(v.get("ok"), _BOOL) and _typed(
                v.get("max_abs_err"), _NUM) and _typed(v.get("dtype"), _STR)):
            raise SchemaError(f"{where}: corrupt: reference_check.{k} is not an object with "
                              f"ok, max_abs_err and dtype; {fix}")


def open_trace(path: str | os.PathLike[str],
               hashed: tuple[str, ...] = ("ops.parquet", "memory.parquet")) -> Trace:
    """Open a trace directory, checking format, schema versions, schemas and the content
    hashes of the ``hashed`` files (replay reads only ``ops.parquet``, so it checks only
    that one: ``memory.parquet`` holds every tensor and can be hundreds of MB)."""
    d = Path(path)
    mj = d / "trace.json"
    if not mj.is_file():
        raise SchemaError(f"{d}: no trace.json; not a trace directory (create one with "
                          f"`kbtrace capture WORKLOAD.py -o {d}`)")
    meta = read_json_object(mj, "re-capture the workload")
    if meta.get("format") != TRACE_FORMAT:
        raise SchemaError(f"{mj}: not a kbtrace trace (format {meta.get('format')!r})")
    schema.check_version(meta.get("schema_version"), str(mj))
    check_meta(meta, mj)
    for fname, sch in (("ops.parquet", schema.OPS), ("memory.parquet", schema.MEMORY)):
        fp = d / fname
        if not fp.is_file():
            raise SchemaError(f"{d}: {fname} missing; re-capture the workload")
        want = meta.get("content_hash", {}).get(fname)
        if want is not None and fname in hashed and file_hash(fp) != want:
            raise SchemaError(f"{fp}: content hash differs from trace.json (file changed or a "
                              f"capture was interrupted); re-capture the workload")
        try:
            found = pq.read_schema(fp)
        except pa.ArrowInvalid as exc:
            raise SchemaError(f"{fp}: not a readable Parquet file ({exc}); re-capture") from None
        schema.check_schema(found, sch, str(fp))
    return Trace(d, meta)

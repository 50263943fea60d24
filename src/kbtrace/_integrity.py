"""File digests: what kbtrace wrote is what it reads.

Every directory kbtrace writes records a digest (``_io.file_hash``: sha256, 16 hex) of
each of its data files in its JSON document: a trace in trace.json ``content_hash``
(ops.parquet, memory.parquet), a run in run.json ``files`` (op_timing, hops, nodes,
links), a baseline in summary.json ``files`` (ops.parquet). Every reader calls
``check_digests`` before it reads a file, so a flipped byte that Parquet still decodes,
an emptied or swapped file, is one ``SchemaError`` naming the changed file, not a wrong
answer. Outputs written before digests were recorded (no ``files`` key) are read as
before.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kbtrace._io import file_hash, read_json_object
from kbtrace.errors import SchemaError

__all__ = ["digests", "check_digests", "check_trace_files"]


def digests(directory: Path, names: Iterable[str]) -> dict[str, str]:
    """``{name: file_hash}`` of files in ``directory`` (what a writer records)."""
    return {n: file_hash(directory / n) for n in sorted(names)}


def check_digests(directory: Path, recorded: Any, doc: Path, fix: str,
                  only: Iterable[str] | None = None) -> None:
    """Each file ``recorded`` (``{name: digest}`` from ``doc``; None: nothing recorded) still
    has its digest; ``only``: check just these names (a reader of some of the files)."""
    if recorded is None:
        return
    if not isinstance(recorded, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "/" not in k and "\\" not in k
            and k not in (".", "..") for k, v in recorded.items()):
        raise SchemaError(f"{doc}: corrupt: its file digests are not an object of file name -> "
                          f"digest strings; {fix}")
    names = sorted(recorded) if only is None else [n for n in only if n in recorded]
    for name in names:
        f = directory / name
        if not f.is_file():
            continue            # its reader says it is missing, with the fix for its role
        try:
            got = file_hash(f)
        except OSError as exc:
            raise SchemaError(f"{f}: unreadable ({exc.strerror or exc}); {fix}") from None
        if got != recorded[name]:
            raise SchemaError(f"{f}: changed since kbtrace wrote it (digest {got}, {doc.name} "
                              f"records {recorded[name]}); {fix}")


def check_trace_files(trace_dir: Path, names: Iterable[str]) -> None:
    """The trace's ``names`` match trace.json ``content_hash`` (a trace without trace.json,
    e.g. a run directory holding its own ops.parquet, is not checked)."""
    mj = trace_dir / "trace.json"
    if not mj.is_file():
        return
    fix = "re-capture the workload"
    meta = read_json_object(mj, fix)
    recorded = meta.get("content_hash")
    if isinstance(recorded, dict):   # (a synthetic trace records a plain identity string)
        check_digests(trace_dir, recorded, mj, fix, only=names)

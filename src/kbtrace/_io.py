"""Shared I/O plumbing: atomic files and directories, batched Parquet writers, stable hashes,
fast column reads, checked JSON reads.

Every artefact kbtrace writes goes through here, so a failed or interrupted run
never leaves a half-written file that looks complete: data is written to
``<name>.<pid>.tmp`` and renamed over the final name only on success. A stage that
writes a directory of files (a trace, a run) builds it as a hidden sibling and swaps
it in whole (``atomic_dir``): the files of one output are never mixed with an older
one's, and a failed stage leaves the old directory as it was (or nothing). What may be
replaced at all is decided by ``kbtrace._owned`` (ownership markers, inputs, special
files). An output path that cannot be written is an ``OutputError`` naming it, not an
``OSError``.
Parquet files are written deterministically (no created_by timestamp drift,
fixed compression, fixed row-group size) so identical inputs give
byte-identical files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kbtrace._owned import check_dir_output, check_file_output, owner, write_marker
from kbtrace.errors import OutputError, SchemaError

__all__ = [
    "atomic_path",
    "atomic_dir",
    "claim_dir",
    "clean_stale_stages",
    "check_replaceable",
    "read_json_object",
    "json_type",
    "trace_hash",
    "write_json",
    "write_table",
    "BatchWriter",
    "stable_hash",
    "file_hash",
    "column_pylist",
    "read_parquet_lean",
    "release_memory",
]

ROW_GROUP_SIZE = 65_536
#: bytes a ``BatchWriter``'s Parquet output is gathered into before each ``write`` call
_WRITE_BUFFER = 1 << 20
_PQ_OPTS: dict[str, Any] = {
    "compression": "zstd",
    "write_statistics": True,
    "store_schema": True,
}


def _is_blob(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _leaves(name: str, t: pa.DataType) -> list[tuple[str, pa.DataType]]:
    """Parquet leaf column paths of a field (compliant nested names: ``x.list.element``)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _leaves(f"{name}.list.element", t.value_type)
    if pa.types.is_struct(t):
        return [leaf for f in t for leaf in _leaves(f"{name}.{f.name}", f.type)]
    return [(name, t)]


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth a Parquet dictionary: the strings and dictionary columns only.
    Trying one on doubles and ids costs time and rarely pays (see ``_pq_opts``)."""
    return [f.name for f in schema if pa.types.is_dictionary(f.type)
            or pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


def _pq_opts(schema: pa.Schema, bulk: bool = False) -> dict[str, Any]:
    """Writer options: Parquet dictionary pages only for string / dictionary columns
    (on float and id columns they cost twice the write time and make files larger), and
    statistics for every column but binary ones (``memory.parquet``'s tensor bytes: the
    writer copies a value several times to find its min and max, then drops them as too
    large — +3 GB at the peak for one 426 MiB tensor, against +1.3 GB without).

    ``bulk``: a file of many rows written and read in bulk (``hops.parquet``): float columns
    in the ``BYTE_STREAM_SPLIT`` encoding (each value's bytes grouped by significance, which
    compresses times far better) and LZ4 instead of zstd. On 2.93 M gemm hop rows: written
    in 0.19 instead of 0.31 CPU s, read whole in 0.08 instead of 0.16, 20.9 instead of
    20.2 MB (zstd with the split: 0.27 s, 13.1 MB); pyarrow, DuckDB and polars read both.
    No statistics on its dictionary columns (``stage``: every row group holds most of its
    few values, so they skip nothing; computing them took ~15% of the write: 0.35 -> 0.30
    CPU s on those rows). And the encoders are handed a row group's values at once
    (``write_batch_size``), so their buffers are sized once instead of grown 1,024 values
    at a time (each growth a copy): writing 2.93 M gemm hop rows took 1,816 instead of 2,127
    M instructions (cachegrind), the file byte for byte the same (a row group's 8-byte
    column is 512 KiB, one data page either way)."""
    opts = {**_PQ_OPTS, "use_dictionary": dictionary_columns(schema)}
    leaves = [leaf for f in schema for leaf in _leaves(f.name, f.type)]
    if bulk:
        opts["compression"] = "lz4"
        opts["write_batch_size"] = ROW_GROUP_SIZE
        opts["use_byte_stream_split"] = [f.name for f in schema if pa.types.is_floating(f.type)]
        opts["write_statistics"] = [f.name for f in schema if not pa.types.is_dictionary(f.type)]
    if any(_is_blob(t) for _n, t in leaves):
        opts["write_statistics"] = [n for n, t in leaves if not _is_blob(t)]
    return opts


def _cannot_write(path: Path, exc: OSError) -> OutputError:
    if isinstance(exc, IsADirectoryError):
        return OutputError(f"cannot write {path}: it is a directory; give a file path (-o)")
    why = exc.strerror or str(exc)
    return OutputError(f"cannot write {path}: {why}; choose a writable output path (-o)")


def _mkdir(d: Path, target: Path) -> None:
    """Create ``d`` (and its parents) to write ``target`` in it."""
    try:
        d.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputError(f"cannot write {target}: {d} or a directory above it is a file; "
                          f"choose another output path (-o)") from None
    except OSError as exc:
        raise _cannot_write(target, exc) from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str],
                inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto ``path`` if the block succeeds. An
    ``OSError`` on either path (a missing or read-only directory, ``path`` a directory)
    becomes an ``OutputError`` naming ``path``. ``path`` may not be a symlink, a non-regular
    file or one of ``inputs`` (``_owned.check_file_output``)."""
    final = Path(path)
    check_file_output(final, inputs)
    _mkdir(final.parent, final)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, final)
    except OSError as exc:
        # a failure naming another file is not about this output; one naming no file (a
        # full disk while Arrow writes) is
        if exc.filename not in (str(tmp), str(final), None) and str(tmp) not in str(exc):
            raise
        raise _cannot_write(final, exc) from None
    finally:
        if tmp.exists():
            tmp.unlink()


_STAGE_RE = re.compile(r"\A\.(?P<name>.+)\.(?P<pid>[0-9]+)\.(?:tmp|old)\Z")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:          # exists but not ours (EPERM)
        return True
    return True


def clean_stale_stages(parent: Path) -> list[Path]:
    """Delete staging directories (``.NAME.PID.tmp`` / ``.old``) that a killed kbtrace left
    in ``parent``: only those carrying kbtrace's marker (or empty) whose process is gone."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        m = _STAGE_RE.match(e.name)
        if not m or _pid_alive(int(m.group("pid"))):
            continue
        p = Path(e.path)
        try:
            if not e.is_dir(follow_symlinks=False):
                continue
            if owner(p) is None and any(p.iterdir()):
                continue
        except OSError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def check_replaceable(path: str | os.PathLike[str], kind: str,
                      inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Refuse to write a ``kind`` directory at ``path`` over anything but an earlier one
    (carrying kbtrace's ``kind`` marker) or an empty directory, or over an input of the
    command (``_owned.check_dir_output``); also refuse the current directory."""
    final = Path(path)
    check_dir_output(final, kind, inputs)
    res = final.resolve()
    if res.exists() and Path.cwd().resolve().is_relative_to(res):
        raise OutputError(f"{final}: is the current directory (or contains it), which a new "
                          f"{kind} would replace; give a subdirectory (-o {kind}s/NAME)")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], kind: str,
               inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Iterator[Path]:
    """Yield an empty staging directory beside ``path`` (already carrying kbtrace's ``kind``
    marker); when the block succeeds, it replaces ``path`` whole (two renames: the old
    directory aside, the new one in; then the old one is deleted). On failure the staging
    directory is deleted and ``path`` is untouched. ``path`` may only be an earlier ``kind``
    output, an empty directory or nothing, and neither be, contain nor lie inside one of
    ``inputs`` (``check_replaceable``). Staging directories left by killed processes beside
    ``path`` are cleaned first."""
    final = Path(path)
    check_replaceable(final, kind, inputs)
    res = final.resolve()
    _mkdir(res.parent, res)
    clean_stale_stages(res.parent)
    stage = res.with_name(f".{res.name}.{os.getpid()}.tmp")
    old = res.with_name(f".{res.name}.{os.getpid()}.old")
    for leftover in (stage, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    try:
        stage.mkdir()
        write_marker(stage, kind)
    except OSError as exc:
        raise _cannot_write(res, exc) from None
    try:
        yield stage
        aside = res.exists()
        if aside:
            os.replace(res, old)
        try:
            os.replace(stage, res)
        except OSError:
            if aside:
                os.replace(old, res)
            raise
    finally:
        for leftover in (stage, old):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)


def claim_dir(path: str | os.PathLike[str], kind: str,
              inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
    """Create (or take back) a ``kind`` directory that is filled in place over time (a
    sweep): nothing, an empty directory or an earlier ``kind`` output is taken and marked;
    anything else is refused as ``atomic_dir`` refuses it."""
    final = Path(path)
    check_replaceable(final, kind, inputs)
    _mkdir(final, final)
    if owner(final) != kind:
        try:
            write_marker(final, kind)
        except OSError as exc:
            raise _cannot_write(final, exc) from None
    return final


def json_type(v: object) -> str:
    """The JSON name of a parsed value's type (``array``, ``number``, ...), for messages."""
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array",
            dict: "object", type(None): "null"}.get(type(v), type(v).__name__)


#: largest JSON document read (trace.json / run.json / summary.json are a few KB)
MAX_JSON_BYTES = 64 << 20


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    """``NaN`` / ``Infinity`` in a JSON file: Python's json reads them, the JSON standard and
    kbtrace's writers do not (a hand-edited makespan of NaN would pass every comparison)."""
    raise _NotJson(name)


def read_json_object(path: str | os.PathLike[str], fix: str) -> dict[str, Any]:
    """A JSON file that must hold an object; a corrupt, truncated, unreadable or non-object
    file is a ``SchemaError`` naming ``path`` and ending with ``fix``."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            raise SchemaError(f"{p}: larger than {MAX_JSON_BYTES >> 20} MiB, which no kbtrace "
                              f"JSON file is; {fix}")
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except _NotJson as exc:
        raise SchemaError(f"{p}: corrupt: {exc} is not a JSON number (kbtrace never writes "
                          f"one); {fix}") from None
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{p}: corrupt or truncated JSON ({exc.msg} at line {exc.lineno}, "
                          f"column {exc.colno}); {fix}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{p}: unreadable ({exc}); {fix}") from None
    if not isinstance(doc, dict):
        raise SchemaError(f"{p}: corrupt (a JSON {json_type(doc)}, not an object); {fix}")
    return doc


def write_json(path: str | os.PathLike[str], obj: Any,
               inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Write ``obj`` as sorted, indented JSON atomically (``inputs``: see ``atomic_path``).
    Standard JSON: a NaN or infinite number is a ``ValueError`` (a bug in the writer), never
    a file readers refuse."""
    with atomic_path(path, inputs) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def write_table(path: str | os.PathLike[str], table: pa.Table,
                inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Write a whole Arrow table to Parquet atomically and deterministically (``inputs``:
    see ``atomic_path``)."""
    with atomic_path(path, inputs) as tmp:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP_SIZE, **_pq_opts(table.schema))


class BatchWriter:
    """Columnar recorder: append per-column values, flush a RecordBatch every N rows.

    Usage::

        w = BatchWriter(path, schema.HOPS)
        w.append_row(op_id, hop, ...)          # positional, in schema order
        w.close()                               # flush + atomic rename

    Memory stays bounded by ``batch_rows`` rows. ``abort()`` discards the
    temporary file (call it from ``finally`` when the run failed).
    """

    __slots__ = ("_schema", "_final", "_tmp", "_sink", "_writer", "_cols", "_n", "_batch_rows",
                 "rows")

    def __init__(self, path: str | os.PathLike[str], schema: pa.Schema,
                 batch_rows: int = ROW_GROUP_SIZE, bulk: bool = False) -> None:
        """``bulk``: a file of many rows, encoded for speed (see ``_pq_opts``).

        The writer writes into a ``_WRITE_BUFFER`` buffer, not the file: given a path,
        Parquet writes each page and its header with a ``write`` call of its own and asks
        the file's position (an ``lseek``) at each page; the bytes are the same."""
        self._schema = schema
        self._final = Path(path)
        _mkdir(self._final.parent, self._final)
        self._tmp = self._final.with_name(f".{self._final.name}.{os.getpid()}.tmp")
        self._sink: Any = None
        try:
            self._sink = pa.BufferedOutputStream(pa.OSFile(str(self._tmp), "wb"), _WRITE_BUFFER)
            self._writer = pq.ParquetWriter(self._sink, schema, **_pq_opts(schema, bulk))
        except OSError as exc:
            if self._sink is not None:
                self._sink.close()
                self._tmp.unlink(missing_ok=True)
            raise _cannot_write(self._final, exc) from None
        self._cols: list[list[Any]] = [[] for _ in schema]
        self._n = 0
        self._batch_rows = batch_rows
        self.rows = 0

    @property
    def columns(self) -> list[list[Any]]:
        """Per-column lists in schema order; append to them directly, then call ``commit(n)``."""
        return self._cols

    def append_row(self, *values: Any) -> None:
        for col, v in zip(self._cols, values, strict=True):
            col.append(v)
        self.commit(1)

    def commit(self, n: int) -> None:
        """Declare that ``n`` rows were appended to ``columns``; flush when the batch is full."""
        self._n += n
        self.rows += n
        if self._n >= self._batch_rows:
            self.flush()

    def write_arrays(self, arrays: list[Any], n: int) -> None:
        """Write ``n`` rows given as one array per column (numpy or pyarrow, schema order)
        as one RecordBatch, after any rows pending in ``columns``."""
        self.flush()
        if n:
            try:
                self._write_batch(arrays, n)
            except OSError as exc:
                raise _cannot_write(self._final, exc) from None
            self.rows += n

    def _write_batch(self, arrays: list[Any], n: int) -> None:
        self._writer.write_batch(pa.RecordBatch.from_arrays(
            [a if isinstance(a, pa.Array) else pa.array(a, type=f.type)
             for a, f in zip(arrays, self._schema, strict=True)], schema=self._schema),
            row_group_size=ROW_GROUP_SIZE)

    def flush(self) -> None:
        try:
            self._flush()
        except OSError as exc:       # a full disk: name the output, not a bare errno
            raise _cannot_write(self._final, exc) from None

    def _flush(self) -> None:
        if self._n == 0:
            return
        arrays = [pa.array(col, type=f.type) if not pa.types.is_dictionary(f.type)
                  else pa.array(col, type=pa.string()).dictionary_encode().cast(f.type)
                  for col, f in zip(self._cols, self._schema, strict=True)]
        self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self._schema),
                                 row_group_size=ROW_GROUP_SIZE)
        self._cols = [[] for _ in self._schema]
        self._n = 0

    def close(self) -> None:
        self.flush()
        try:
            self._writer.close()
            self._sink.close()
            os.replace(self._tmp, self._final)
        except OSError as exc:
            raise _cannot_write(self._final, exc) from None

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(Exception):
            self._sink.close()
        if self._tmp.exists():
            self._tmp.unlink()


def trim_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim``; nothing where
    there is no glibc): for a loop whose batches' freed temporaries would otherwise stay
    resident (verify's validation pass over a 1.0 M-op trace: 551 -> 405 MiB)."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        try:
            _LIBC = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC(0)


_LIBC: Any = None


def release_memory() -> None:
    """Give memory freed by a finished stage back to the OS before the next one: a cyclic
    collection, Arrow's pool, and glibc's heap (``malloc_trim``; skipped where there is no
    glibc). After capturing all_gather on default.yaml the process kept 904 MB resident with
    ~120 MB live; this returns it, so ``kbtrace run``'s later stages do not stack on it."""
    import gc
    gc.collect()
    pa.default_memory_pool().release_unused()
    trim_heap()


def read_parquet_lean(path: str | os.PathLike[str], columns: list[str] | None = None) -> pa.Table:
    """Read a Parquet file (``columns``: a subset) into buffers from the system allocator.

    Arrow's default pool (mimalloc) keeps the decoder's freed temporaries resident: reading
    a 32,768-op ``ops.parquet`` (7.7 MB as a table) raised RSS by 37 MB, against 11 MB from
    the system pool, and the difference grows with the file (~0.8 KiB per op). Replay holds
    every op for the whole run, so it reads its trace this way."""
    import pyarrow.dataset as ds
    return ds.dataset(str(path), format="parquet").to_table(
        columns=columns, memory_pool=pa.system_memory_pool())


def column_pylist(col: pa.ChunkedArray) -> list[Any]:
    """``col.to_pylist()``, through numpy for primitive / dictionary columns (much faster;
    nulls become None as in ``to_pylist``)."""
    t = col.type
    if not len(col):
        return []
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        if not col.null_count:
            return col.to_numpy().tolist()
        arr = col.combine_chunks()
        vals = pc.fill_null(arr, False if pa.types.is_boolean(t) else 0).to_numpy(
            zero_copy_only=False).tolist()
        for i in np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False)).tolist():
            vals[i] = None
        return vals
    if pa.types.is_dictionary(t):
        arr = col.combine_chunks()
        lut = [*arr.dictionary.to_pylist(), None]     # index -1 (a null) -> None
        idx = pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False)
        return [lut[i] for i in idx.tolist()]
    return col.to_pylist()


def stable_hash(*parts: Any) -> str:
    """sha256 (hex, 16 chars) over JSON-serialisable parts, key-sorted."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, bytes):
            h.update(p)
        else:
            h.update(json.dumps(p, sort_keys=True, separators=(",", ":"), default=str).encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def trace_hash(meta: dict[str, Any], trace_dir: Path | None) -> str:
    """A trace's identity, recorded by replay in run.json ``trace.hash`` and checked by
    analysis: ``stable_hash`` of trace.json's ``content_hash`` (the hashes of ops.parquet and
    memory.parquet written by capture), else of ops.parquet's bytes (else of nothing)."""
    return stable_hash(meta.get("content_hash") or
                       (file_hash(trace_dir / "ops.parquet") if trace_dir else ""))


def file_hash(path: str | os.PathLike[str]) -> str:
    """sha256 (hex, 16 chars) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]

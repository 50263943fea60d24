"""Capture driver and trace writer.

``capture(workload_path, topology, params, out_dir)`` phases:

1. **build**   import the workload, merge parameters, run ``build(w, p)``: tensors are
               placed and written into the memory image, launches and outputs declared;
2. **run**     each launch on the greenlet scheduler; ops are recorded to the op log,
               which drains (rows + golden executor in capture order filling
               ``out_digest``) into ``ops.parquet`` every batch and at the end;
3. **finalize** write ``memory.parquet`` (initial contents of every tensor shard +
               numpy references) and last ``trace.json`` (workload, parameters, grid,
               topology name + hash, versions, op counts, content hashes of both
               Parquet files, reference check). Every file is written atomically; on
               error the temporary ops file is removed and nothing is renamed.

``open_trace(dir)`` checks versions, schemas and content hashes and returns a ``Trace``
(``kbtrace.tracefile``, re-exported here: what only reads a trace need not import capture).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa

from kbtrace import __version__, schema
from kbtrace._io import (
    BatchWriter,
    atomic_dir,
    file_hash,
    trim_heap,
    write_json,
)
from kbtrace._names import param_overrides, tag, variant
from kbtrace.capture.dtypes import compare, to_storage
from kbtrace.capture.executor import gather_outputs
from kbtrace.capture.hostcopy import apply as apply_host
from kbtrace.capture.scheduler import LaunchRun
from kbtrace.capture.tracer import STRICT, OpSink, Tracer
from kbtrace.capture.workload import LaunchSpec, Workload, load_workload, parse_params, user_frame
from kbtrace.errors import CaptureError
from kbtrace.tracefile import TRACE_FORMAT, Trace, check_meta, open_trace

__all__ = ["capture", "open_trace", "check_meta", "Trace", "TRACE_FORMAT"]


def _resolve_topology(topology: Any) -> Any:
    if isinstance(topology, (str, os.PathLike)):
        from kbtrace.topology import compile_topology
        return compile_topology(topology)
    return topology


MEMORY_BATCH_BYTES = 32 << 20   # tensor bytes per memory.parquet record batch


def _memory_rows(w: Workload, refs: dict[str, np.ndarray]) -> Iterator[tuple[dict[str, Any],
                                                                            np.ndarray]]:
    """(row without ``data``, contiguous storage array) per tensor shard, then per reference."""
    for t in w.tensors.values():
        if getattr(t, "staged", False):     # its values arrive by h2d from its staging tensor
            continue
        for s in t.shards:
            idx = tuple(slice(o, o + n) for o, n in zip(s.offset, s.shape, strict=True))
            dev = t.space != "host"
            yield (dict(tensor=t.name, role=t.role, shard=s.index, sip=s.sip if dev else None,
                        cube=s.cube if dev else None, pe=s.pe if dev else None, space=t.space,
                        addr=s.addr, dtype=t.dtype, shape=list(s.shape),
                        offset=list(s.offset), global_shape=list(t.shape)),
                   np.ascontiguousarray(t.stored[idx]))
    for name, ref in refs.items():      # in blocks along axis 0: one huge value per row
        t = w.tensors[name]                 # made the Parquet writer hold it several times
        stored = to_storage(ref, t.dtype)
        rows = t.shape[0] if t.shape else 1
        row_bytes = max(1, stored.nbytes // max(1, rows))
        step = max(1, MEMORY_BATCH_BYTES // row_bytes)
        for k, lo in enumerate(range(0, rows, step) or [0]):    # (an empty tensor: one row)
            block = stored[lo:lo + step] if t.shape else stored
            yield (dict(tensor=name, role="reference", shard=k, space="hbm", dtype=t.dtype,
                        shape=list(block.shape) if t.shape else [],
                        offset=[lo] + [0] * (len(t.shape) - 1) if t.shape else [],
                        global_shape=list(t.shape)), np.ascontiguousarray(block))


def _memory_batch(rows: list[tuple[dict[str, Any], np.ndarray]]) -> list[pa.Array]:
    """One record batch of ``schema.MEMORY``: the ``data`` column is built from the arrays'
    buffers (one copy), not from per-row ``bytes`` objects."""
    arrays = []
    for f in schema.MEMORY:
        if f.name == "data":
            offsets = np.zeros(len(rows) + 1, np.int64)
            np.cumsum([d.nbytes for _r, d in rows], out=offsets[1:])
            # one row (a tensor of MEMORY_BATCH_BYTES or more alone): its own bytes, not a
            # copy (the writer's page and compressed page are ~2 more; at 1.0 M gemm ops each
            # input is 40.5 MiB)
            blob = (rows[0][1].reshape(-1).view(np.uint8) if len(rows) == 1 else
                    np.concatenate([d.reshape(-1).view(np.uint8) for _r, d in rows]) if rows
                    else np.zeros(0, np.uint8))
            arrays.append(pa.LargeBinaryArray.from_buffers(
                f.type, len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(blob)]))
        elif f.name == "nbytes":
            arrays.append(pa.array([d.nbytes for _r, d in rows], type=f.type))
        elif pa.types.is_dictionary(f.type):
            arrays.append(pa.array([r.get(f.name) for r, _d in rows], type=pa.string())
                          .dictionary_encode().cast(f.type))
        else:
            arrays.append(pa.array([r.get(f.name) for r, _d in rows], type=f.type))
    return arrays


def _write_memory(path: Path, w: Workload, refs: dict[str, np.ndarray]) -> None:
    """``memory.parquet`` (atomically), in record batches of about ``MEMORY_BATCH_BYTES`` of
    tensor data: building the whole table at once held every tensor two more times (1 GB
    more at the peak for all_gather's 128 MiB output on default.yaml)."""
    writer = BatchWriter(path, schema.MEMORY)
    try:
        batch: list[tuple[dict[str, Any], np.ndarray]] = []
        size = 0
        for row in _memory_rows(w, refs):
            batch.append(row)
            size += row[1].nbytes
            if size >= MEMORY_BATCH_BYTES:
                writer.write_arrays(_memory_batch(batch), len(batch))
                batch, size = [], 0
        writer.write_arrays(_memory_batch(batch), len(batch))
        writer.close()
    except BaseException:
        writer.abort()
        raise


def _output_shards(w: Workload) -> pa.Table:
    """The role=output rows of the memory table without their data (what gather_outputs reads)."""
    return pa.Table.from_pylist([
        {"tensor": t.name, "role": t.role, "addr": s.addr, "dtype": t.dtype, "shape": list(s.shape),
         "offset": list(s.offset), "global_shape": list(t.shape)}
        for t in w.tensors.values() if t.role == "output" for s in t.shards])


def _strict(strict: Sequence[str] | str) -> frozenset[str]:
    """``capture(strict=...)`` -> the set of refused conversions (checked: one line if unknown)."""
    items = [strict] if isinstance(strict, str) else list(strict)
    out: set[str] = set()
    for s in items:
        if s == "all":
            out.update(STRICT)
        elif s in STRICT:
            out.add(s)
        else:
            raise CaptureError(f"strict: unknown type sanitizer {s!r}; use "
                               f"{', '.join(STRICT)} or all")
    return frozenset(out)


def trace_name(workload: str, varied: Mapping[str, Any], topo: Any) -> str:
    """The default trace directory name (``kbtrace._names``): ``<workload>[-<params>]``, then
    ``-<topology>[-<overrides>]`` unless it is the default topology as written."""
    from kbtrace._paths import DEFAULT_TOPOLOGY
    default = topo.params.name == Path(DEFAULT_TOPOLOGY).stem and not topo.overrides
    return variant(workload, tag(varied),
                   "" if default else variant(topo.params.name, tag(topo.overrides)))


def capture(workload_path: str | os.PathLike[str] | Any, topology: Any,
            params: Mapping[str, Any] | Sequence[str] | None = None,
            out_dir: str | os.PathLike[str] | None = None, *, golden: bool = True,
            allow_mismatch: bool = False, strict: Sequence[str] | str = ()) -> Trace:
    """Capture a workload into a trace directory and return it (see module docstring).

    ``workload_path``: a workload file, or an object with ``build(w, p)`` (and optional
    ``PARAMS``, ``NAME``) such as an imported module. ``topology``: a ``Topology`` or a YAML
    path. ``params``: overrides as a mapping or ``["KEY=VALUE", ...]``. ``golden=False``
    skips the arithmetic of compute ops during capture (faster; ``out_digest`` stays null
    and outputs are not checked against their references). An output that differs from its
    numpy reference is a ``CaptureError`` (nothing written) unless ``allow_mismatch``, which
    keeps the trace (``trace.json`` ``reference_check`` records the mismatch) for
    ``kbtrace verify`` to find the first diverging op. A workload that exits the process
    (``sys.exit``, ``SystemExit``) is a ``CaptureError`` too, never a silent exit.
    ``strict``: implicit type conversions to refuse with a ``SanitizerError`` instead, any of
    ``"promote"`` (mixed operand dtypes) and ``"store"`` (``tl.store`` casting to the
    destination's dtype), or ``"all"``.
    """
    try:
        return _capture(workload_path, topology, params, out_dir, golden, allow_mismatch,
                        _strict(strict))
    except SystemExit as exc:
        where = getattr(workload_path, "__file__", None) or str(workload_path)
        raise CaptureError(f"workload {where}: called sys.exit({exc.code!r}) (SystemExit) while "
                           f"capturing; a workload may not end the process: raise an exception "
                           f"or return instead") from None


def _capture(workload_path: Any, topology: Any, params: Any, out_dir: Any, golden: bool,
             allow_mismatch: bool, strict_set: frozenset[str] = frozenset()) -> Trace:
    t_start, c_start = time.perf_counter(), time.process_time()
    if hasattr(workload_path, "build"):  # an already imported workload module / namespace
        mod: Any = workload_path
        path = Path(str(getattr(mod, "__file__", None) or f"{getattr(mod, 'NAME', 'workload')}.py"))
    else:
        path = Path(workload_path)
        mod = load_workload(path)
    name = str(getattr(mod, "NAME", path.stem))
    p = parse_params(getattr(mod, "PARAMS", {}), params)
    topo = _resolve_topology(topology)
    varied = param_overrides(getattr(mod, "PARAMS", {}), p)
    out = Path(out_dir) if out_dir is not None else Path("data") / "traces" / trace_name(
        name, varied, topo)
    # built beside OUT and swapped in whole when complete: a failed capture leaves an
    # earlier trace there as it was, and no directory where there was none
    with atomic_dir(out, "trace", inputs=(path, getattr(topo, "source", None))) as stage:
        sink = OpSink(stage / "ops.parquet")
        ok = False
        try:
            tracer = Tracer(topo, sink, golden, strict_set)
            w = Workload(topo, name, SimpleNamespace(**p), tracer)
            try:
                mod.build(w, w.params)
            except CaptureError:
                raise
            except Exception as exc:
                raise CaptureError(f"workload {name!r}: build() raised "
                                   f"{type(exc).__name__}: {exc} (at {user_frame(exc, path)}; "
                                   "kbtrace --traceback ... shows the whole error)") from exc
            launches = []
            t_run0, c_run0 = time.perf_counter(), time.process_time()
            # Automatic GC is paused while kernels run: the recorder allocates a few small objects
            # per op and creates no reference cycles, so generational passes over the growing op
            # log would only cost time (~30% of the kernel phase). A log drain collects the
            # young generation once it is large (``tracer.GC_YOUNG``), which bounds garbage a
            # kernel itself might leave in cycles.
            gc_was_enabled = gc.isenabled()
            gc.disable()
            sink.collect_gc = gc_was_enabled
            try:
                li = host_seq = 0
                for spec in w.actions:
                    if not isinstance(spec, LaunchSpec):     # copies, frees, mappings
                        host_seq = apply_host(tracer, spec, host_seq)
                        continue
                    coords = spec.coords

                    def args_for(prog: Any, spec: Any = spec
                                 ) -> tuple[tuple[Any, ...], dict[str, Any]]:
                        c = (prog.sip, prog.cube, prog.pe)
                        return (tuple(w.resolve_arg(a, c) for a in spec.args),
                                {k: w.resolve_arg(v, c) for k, v in spec.kwargs.items()})

                    run = LaunchRun(tracer, li, spec.kernel, spec.grid, coords, args_for,
                                    spec.neighbors, spec.pids, spec.ipcq)
                    first = tracer.next_op
                    run.run()
                    tracer.regions.remove_space("tcm")
                    launches.append({"kernel": run.kernel_name, "grid": list(spec.grid),
                                     "programs": len(coords), "first_op": first,
                                     "n_ops": tracer.next_op - first})
                    li += 1
                t_run, c_run = time.perf_counter() - t_run0, time.process_time() - c_run0
                drained_in_run, drained_cpu_in_run = sink.seconds, sink.cpu_seconds
                sink.drain(final=True)  # golden execution of the rest of the log (fills tracer.mem)
                got = gather_outputs(_output_shards(w), tracer.mem) if w.outputs and golden else {}
                tracer.release()    # the images are done with: freed before the references'
                #                     and the memory.parquet writer's peaks (not stacked on them)
                trim_heap()         # (and given back: their pages and cached tiles, ~0.1 KiB
                #                     per op, stayed resident under those peaks)
            finally:
                # (GC resumes once the images and their read caches are freed: a collection
                # while they are live walks every cached entry, ~1 CPU us per op at scale)
                sink.collect_gc = False
                if gc_was_enabled:
                    gc.enable()
            # numpy references after the kernel phase (their BLAS threads would compete with it);
            # they see the initial values, which capture never modifies (Tensor.stored)
            inputs = {n: t.value for n, t in w.tensors.items()}
            refs = {}
            for oname, fn in w.outputs.items():
                want = np.asarray(fn(dict(inputs)))
                if want.shape != w.tensors[oname].shape:
                    raise CaptureError(f"workload {name!r}: reference of {oname!r} has shape "
                                       f"{want.shape}, tensor is {w.tensors[oname].shape}")
                refs[oname] = want
            check = {}
            for oname, want in refs.items() if golden else ():
                t = w.tensors[oname]
                stored_want = to_storage(want, t.dtype)
                from kbtrace.capture.dtypes import to_compute
                want_c = to_compute(stored_want, t.dtype)
                err, _rel, n_bad = compare(got[oname], want_c, t.dtype)
                check[oname] = {"ok": n_bad == 0, "max_abs_err": err, "dtype": t.dtype}
            bad = [f"{n} (max abs err {c['max_abs_err']:.3g}, {c['dtype']})"
                   for n, c in check.items() if not c["ok"]]
            if bad and not allow_mismatch:
                raise CaptureError(f"workload {name!r}: output {', '.join(bad)} differs from its "
                                   f"numpy reference; nothing written. Fix the kernel, or keep "
                                   f"the trace with --allow-mismatch and find the first "
                                   f"diverging op with `kbtrace verify`")
            t_close0 = time.perf_counter()
            sink.close()
            t_close = time.perf_counter() - t_close0
            _write_memory(stage / "memory.parquet", w, refs)
            meta = {
                "format": TRACE_FORMAT,
                "kbtrace_version": __version__,
                "schema_version": schema.SCHEMA_VERSION,
                "workload": name,
                "workload_file": path.name,
                "params": p,
                "param_overrides": varied,
                "launches": launches,
                "topology": {"name": topo.params.name, "content_hash": topo.content_hash,
                             "path": topo.source, "overrides": topo.overrides},
                "n_ops": tracer.next_op,
                "golden": golden,
                "op_counts": dict(sorted(sink.counts.items())),
                "outputs": sorted(refs),
                "reference_check": check,
                "content_hash": {"ops.parquet": file_hash(stage / "ops.parquet"),
                                 "memory.parquet": file_hash(stage / "memory.parquet")},
            }
            write_json(stage / "trace.json", meta)
            ok = True
            tr = Trace(out, meta)
            #: run_s: kernel phase (greenlets + recording, without log drains); drain_s: expanding
            #: rows, golden execution and Parquet batches; total_s: the whole call; *_cpu_s: the
            #: same in CPU seconds of this process (what a busy machine does not inflate)
            tr.stats = {"run_s": t_run - drained_in_run, "drain_s": sink.seconds,
                        "close_s": t_close, "total_s": time.perf_counter() - t_start,
                        "run_cpu_s": c_run - drained_cpu_in_run, "drain_cpu_s": sink.cpu_seconds,
                        "total_cpu_s": time.process_time() - c_start}
            return tr
        finally:
            if not ok:
                sink.abort()

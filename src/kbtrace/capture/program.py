"""The recorder backend (layer 3 of 3): one ``Program`` per program instance of a launch.

Every ``tl.*`` call ends here. A call validates addresses against the region
map (the address sanitizer), allocates its destination (TCM for loads and
receives, scratch for compute results; allocators sized from ``pe.tcm.size_kb`` /
``pe.tcm.scratch_kb`` that bump until full, then reuse the buffers of dropped
handles, see ``memory.Allocator``) and appends one compact record to
the tracer's op log (see ``tracer``: rows are expanded, executed by the golden
``Machine`` in capture order and written at drain time). Loads return real
values, read lazily from the capture-time memory image; compute results come
back as *pending* handles.

The hot calls (load, store, fill, dot) take a lean path: argument geometry is
cached per (shape, dtype, strides), the kernel's source line is read from a
fixed frame depth, and the record is a tuple.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from kbtrace.capture import _semantics as sem
from kbtrace.capture._ipcq import IpcqMixin
from kbtrace.capture._semantics import FILL_GEO as _FILL_GEO
from kbtrace.capture._semantics import LOAD_GEO as _LOAD_GEO
from kbtrace.capture._semantics import STORE_GEO as _STORE_GEO
from kbtrace.capture._semantics import geometry as _geometry
from kbtrace.capture.dtypes import check_dtype, itemsize, promote
from kbtrace.capture.executor import EPILOGUE_OPS, UNARY, Op
from kbtrace.capture.handles import (
    _PKG_DIR,
    CompletionHandle,
    RecvFuture,
    TensorHandle,
    caller_line,
)
from kbtrace.capture.memory import Allocator, Owner, Region
from kbtrace.errors import CaptureError, SanitizerError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kbtrace.capture.scheduler import LaunchRun

__all__ = ["Program", "caller_line"]

_getframe = sys._getframe
_Own = Owner
_TH = TensorHandle

_NO_DEPS: tuple[int, ...] = ()
_NO_REGION = Region(0, 0, "none", "none", None)


#: source files of kernel-side code seen calling ``tl`` (not inside kbtrace.capture)
_KERNEL_FILES: set[str] = set()


def _is_kernel_file(path: str) -> bool:
    """Whether a frame's file lies outside kbtrace.capture (then it is the kernel call site)."""
    if path.startswith(_PKG_DIR):
        return False
    if len(_KERNEL_FILES) > 1024:
        _KERNEL_FILES.clear()
    _KERNEL_FILES.add(path)
    return True


class Program(IpcqMixin):
    """State and recorder of one program instance (one PE) within a launch."""

    def __init__(self, run: LaunchRun, index: int, pid0: int, pid1: int,
                 coord: tuple[int, int, int]) -> None:
        t = run.tracer
        self.run, self.tracer = run, t
        self.launch = run.launch
        self.index, self.pid0, self.pid1 = index, pid0, pid1
        self.sip, self.cube, self.pe = coord
        self.kernel = run.kernel_name
        tcm = t.params.pe.tcm
        size, scratch = tcm.size_kb * 1024, tcm.scratch_kb * 1024
        base = t.addr.pe_tcm_addr(self.sip, self.cube, self.pe, 0)
        node = f"sip{self.sip}.cube{self.cube}.pe{self.pe}"
        self.tcm = Allocator(base, size - scratch, f"TCM of {node}", tracer=t)
        self.scratch = Allocator(base + size - scratch, scratch, f"scratch of {node}", tracer=t)
        self.seq = 0
        self.n_async = 0
        self.outstanding: list[CompletionHandle] = []
        self.blocked: tuple[str, str, str | None, int | None] | None = None
        #: (channel, slots needed, nbytes) while blocked in tl.send waiting for slots
        self.blocked_send: tuple[tuple[int, int, str], int, int] | None = None
        self.queued = False
        self.done = False
        self.glet: Any = None
        self._log = t.log
        self._find = t.regions.find
        #: the two regions this program touched last (regions do not change during a launch)
        self._rc0 = self._rc1 = _NO_REGION

    # ------------------------------------------------------------------ helpers
    def describe(self) -> str:
        return (f"kernel {self.kernel!r} program {self.index} (pid {self.pid0},{self.pid1} on "
                f"sip{self.sip}.cube{self.cube}.pe{self.pe})")

    def fail(self, cls: type[CaptureError], msg: str) -> CaptureError:
        file, line = caller_line()
        return cls(f"{self.describe()}, line {file}:{line}: {msg}")

    def _new_id(self) -> int:
        t = self.tracer
        op_id = t.next_op
        t.next_op = op_id + 1
        return op_id

    def _append(self, rec: Any) -> None:
        log = self._log
        log.append(rec)
        if len(log) >= self.tracer.sink.batch:
            self.tracer.sink.drain()

    def _emit(self, kind: str, *rest: Any) -> tuple[int, int | None]:
        """Log a hot-path op as the compact record ``(op_id, kind, program, seq, file, line,
        *rest)`` (expanded to a row when the log drains); return ``(op_id, line)``.

        Called directly by ``load`` / ``store`` / ``fill`` / ``dot``, which ``tl.*`` calls
        from the kernel: the kernel's frame is three up. Frames from other files (helpers
        the kernel called) are resolved by ``caller_line``.
        """
        t = self.tracer
        op_id = t.next_op
        t.next_op = op_id + 1
        seq = self.seq
        self.seq = seq + 1
        f = _getframe(3)
        code_file = f.f_code.co_filename
        if code_file not in _KERNEL_FILES and not _is_kernel_file(code_file):
            file, line = caller_line()
        else:
            file, line = code_file, f.f_lineno
        log = self._log
        log.append((op_id, kind, self, seq, file, line, *rest))
        if len(log) >= t.sink.batch:
            t.sink.drain()
        return op_id, line

    def _record(self, kind: str, name: str, *, seq: int | None = None,
                where: tuple[str | None, int | None] | None = None, **fields: Any) -> Op:
        """Record a (less frequent) op as a full ``Op`` row in the log."""
        if seq is None:
            seq = self.seq
            self.seq += 1
        file, line = where if where is not None else caller_line()
        op = Op(op_id=self._new_id(), launch=self.launch, program=self.index, pid0=self.pid0,
                pid1=self.pid1, sip=self.sip, cube=self.cube, pe=self.pe, seq=seq, kind=kind,
                name=name, src_file=file, src_line=line, **fields)
        if op.is_async is None:
            op.is_async = False
        if op.nbytes is None:
            op.nbytes = 0
        if kind == "send":
            self.tracer.sink.unmatched(op)
        self._append(op)
        return op

    def _region(self, ptr: Any, span: int, what: str, dtype: str) -> Region:
        if isinstance(ptr, TensorHandle):
            raise self.fail(CaptureError, f"{what}: pass an address (int), not a TensorHandle")
        ptr = int(ptr)
        reg = self.tracer.regions.find(ptr, span)
        if reg is None:
            near = self.tracer.regions.nearest(ptr)
            hint = ""
            if near is not None and near.start <= ptr < near.end:
                hint = (f"; it runs {ptr + span - near.end} B past the end of {near.label} "
                        f"({near.end - near.start} B)")
            raise self.fail(SanitizerError, f"{what} of {span} B at {ptr:#x} touches unallocated "
                                            f"memory{hint}; check the pointer arithmetic and shape")
        if reg.dtype is not None and reg.dtype != dtype:
            raise self.fail(SanitizerError, f"{what} accesses {reg.label} (dtype {reg.dtype}) as "
                                            f"{dtype}; use dtype={reg.dtype!r}")
        return reg

    def _tensor(self, h: Any, what: str, *, tcm: bool = True) -> TensorHandle:
        if not isinstance(h, TensorHandle):
            raise self.fail(CaptureError, f"{what}: expected a TensorHandle, got {type(h).__name__}")
        if tcm and h.space not in ("tcm",):
            raise self.fail(SanitizerError, f"{what}: operand lives in {h.space} (tl.ref); "
                                            f"tl.load it into TCM first")
        return h

    def _out(self, shape: tuple[int, ...], dtype: str, what: str) -> tuple[int, int]:
        nbytes = math.prod(shape) * itemsize(dtype)
        return self._alloc(self.scratch, nbytes, f"{what} result {shape} {dtype}"), nbytes

    def _place(self, a: Allocator, nbytes: int) -> int | None:
        """Address of ``nbytes`` in ``a``: bump while it fits, else reclaim the buffers of
        dead handles (draining the op log first if its records still hold them); None if
        live buffers fill it. The caller notes the new buffer's owner in ``a.owned``."""
        start = -(-a.cursor // a.align) * a.align
        if start + nbytes <= a.capacity:
            a.cursor = start + nbytes
            return a.base + start
        off = a.reclaim(nbytes)
        if off is None:
            self.tracer.sink.drain()
            off = a.reclaim(nbytes)
        return None if off is None else a.base + off

    def _alloc(self, a: Allocator, nbytes: int, what: str, shape: Any = None,
               dtype: str | None = None) -> int:
        """``_place``, or a ``SanitizerError`` at the kernel's line naming what holds ``a``
        (``what``, then ``shape`` and ``dtype`` when given: formatted only for the error)."""
        addr = self._place(a, nbytes)
        if addr is None:
            if dtype is not None:
                what = f"{what} {shape} {dtype}"
            raise self.fail(SanitizerError, a.full(nbytes, what))
        return addr

    def _pin(self, h: TensorHandle) -> None:
        """``h``'s buffer is used by an op that may outlast the next ones: never reclaim it."""
        if h.space == "tcm":
            nb = h.nbytes
            self.tcm.pin(h.addr, nb)
            self.scratch.pin(h.addr, nb)

    # ------------------------------------------------------------------ memory
    def ref(self, ptr: int, shape: Any, dtype: str) -> TensorHandle:
        shape = sem.norm_shape(shape, "tl.ref")
        check_dtype(dtype, "tl.ref")
        nbytes = math.prod(shape) * itemsize(dtype)
        reg = self._region(ptr, nbytes, "tl.ref", dtype)
        deps, pending = reg.readers_view(int(ptr), int(ptr) + nbytes)
        return TensorHandle(shape, dtype, reg.space, int(ptr), None, "ref", caller_line()[1],
                            pending, None, tuple(deps))

    def _lookup(self, ptr: int, span: int) -> Region | None:
        """The region holding [ptr, ptr + span) (remembered: callers check the last two first)."""
        reg = self._find(ptr, span)
        if reg is not None:
            self._rc1, self._rc0 = self._rc0, reg
        return reg

    def _target(self, ptr: Any, span: int, dtype: str, what: str) -> tuple[Region, int]:
        """The region ``[ptr, ptr + span)`` lies in (the last two are checked first) and
        ``ptr`` as an int; validated by ``_region`` when it is new or has another dtype."""
        reg: Region | None
        if ptr.__class__ is int:
            reg = self._rc0
            if not (reg.start <= ptr and ptr + (span or 1) <= reg.end):
                reg = self._rc1
                if not (reg.start <= ptr and ptr + (span or 1) <= reg.end):
                    reg = self._lookup(ptr, span)
        else:
            reg = None
        if reg is None or (reg.dtype is not None and reg.dtype != dtype):
            reg = self._region(ptr, span, what, dtype)
            ptr = int(ptr)
        return reg, ptr

    def load(self, ptr: int, shape: Any, dtype: str, strides: Any = None) -> TensorHandle:
        try:
            geo = _LOAD_GEO[(shape, dtype, strides)]
        except (KeyError, TypeError):
            geo = _geometry(_LOAD_GEO, shape, dtype, strides, "tl.load")
        span = geo[2]
        reg, ptr = self._target(ptr, span, dtype, "tl.load")
        deps: Sequence[int]
        if reg.writers:
            deps, pending = reg.readers_view(ptr, ptr + span)
        else:
            deps, pending = _NO_DEPS, False
        nbytes = geo[3]
        a = self.tcm
        start = -(-a.cursor // a.align) * a.align
        if start + nbytes > a.capacity:
            start = self._alloc(a, nbytes, "tl.load of", geo[0], dtype) - a.base
        else:
            a.cursor = start + nbytes
        dst = a.base + start
        op_id, line = self._emit("load", reg.space, ptr, dst, nbytes, geo, dtype, deps)
        h = _TH(geo[0], dtype, "tcm", dst, op_id, "load", line, pending)
        r = _Own(h, a.died)
        r.addr, r.nbytes = dst, nbytes
        a.owned.append(r)
        if not pending:
            t = self.tracer
            h._lazy = (0, t.kmem, ptr, geo[6])
            t.lazy.append(r)
        return h

    def store(self, ptr: int, h: Any, strides: Any = None) -> None:
        if h.__class__ is not _TH:
            h = self._tensor(h, "tl.store", tcm=False)
        dtype = h.dtype
        try:
            geo = _STORE_GEO[(h.shape, dtype, strides)]
        except (KeyError, TypeError):
            geo = _geometry(_STORE_GEO, h.shape, dtype, strides, "tl.store")
        span = geo[2]
        try:
            reg, ptr = self._target(ptr, span, dtype, "tl.store")
        except SanitizerError:
            cast = self._store_cast(ptr, h)
            if cast is None:
                raise
            h, dtype = cast, cast.dtype
            geo = _geometry(_STORE_GEO, h.shape, dtype, strides, "tl.store")
            span = geo[2]
            reg, ptr = self._target(ptr, span, dtype, "tl.store")
        op_id, _ = self._emit("store", h, reg.space, ptr, geo)
        t = self.tracer
        pending = h.pending
        if not pending:  # a real value: the capture-time image must see it
            if h.space == "tcm":
                t.kwrite(ptr, h.stored(), geo[6])
            else:  # from a tl.ref: copy what the source holds now
                pending = reg_pending = self._ref_pending(h)
                if not reg_pending:
                    t.kwrite(ptr, t.kmem.read(h.addr, h.shape, dtype), geo[6])
        if geo[6] is None:
            reg.note_write(ptr, ptr + span, op_id, pending)
        else:  # a strided tile does not overwrite the gaps of its span: keep older writers
            reg.writers.append((ptr, ptr + span, op_id, pending))

    def _store_cast(self, ptr: Any, h: TensorHandle) -> TensorHandle | None:
        """``h`` cast to the dtype of the tensor at ``ptr`` when that differs (Triton casts on
        store; recorded as a ``cast`` math op before the store), or None: no such tensor, the
        same dtype, a ``tl.ref`` operand. With the strict ``store`` sanitizer: an error."""
        if isinstance(ptr, TensorHandle) or not isinstance(ptr, (int, np.integer)):
            return None
        reg = self._find(int(ptr), 1)
        if reg is None or reg.dtype is None or reg.dtype == h.dtype or h.space != "tcm":
            return None
        if "store" in self.tracer.strict:
            raise self.fail(SanitizerError, f"tl.store of a {h.dtype} value into {reg.label} "
                                            f"(dtype {reg.dtype}) and the strict 'store' "
                                            f"sanitizer is on; convert with "
                                            f"h.to({reg.dtype!r}) first")
        return self.math("cast", [h], out_dtype=reg.dtype)

    def _ref_pending(self, h: TensorHandle) -> bool:
        """Whether the memory a tl.ref handle points at holds a pending value now."""
        if h.pending:
            return True
        reg = self.tracer.regions.find(h.addr, h.nbytes)
        return reg is None or reg.readers_view(h.addr, h.addr + h.nbytes)[1]

    # ------------------------------------------------------------------ compute
    def fill(self, name: str, shape: Any, dtype: str, scalars: list[float]) -> TensorHandle:
        try:
            geo = _FILL_GEO[(shape, dtype, None)]
        except (KeyError, TypeError):
            geo = _geometry(_FILL_GEO, shape, dtype, None, f"tl.{name}")
        shp, nbytes = geo[0], geo[3]
        a = self.scratch
        start = -(-a.cursor // a.align) * a.align
        if start + nbytes > a.capacity:
            start = self._alloc(a, nbytes, f"tl.{name} result", shp, dtype) - a.base
        else:
            a.cursor = start + nbytes
        dst = a.base + start
        op_id, line = self._emit("fill", name, dst, geo, dtype, scalars)
        h = _TH(shp, dtype, "tcm", dst, op_id, name, line, False)
        h._lazy = (1, name, scalars)
        r = _Own(h, a.died)
        r.addr, r.nbytes = dst, nbytes
        a.owned.append(r)
        return h

    def math(self, name: str, args: list[Any], *, axis: int | None = None,
             out_dtype: str | None = None) -> TensorHandle:
        what = f"tl.{name}"
        handles: list[TensorHandle] = []
        scalars: list[float] = []
        raw: list[Any] = []
        pattern = ""
        for a in args:
            if isinstance(a, TensorHandle):
                handles.append(self._tensor(a, what))
                pattern += "h"
            elif isinstance(a, (int, float, np.integer, np.floating, bool)):
                scalars.append(float(a))
                raw.append(a)
                pattern += "s"
            else:
                raise self.fail(CaptureError, f"{what}: operand of type {type(a).__name__}; "
                                              f"use TensorHandles or Python numbers")
        if not handles:
            raise self.fail(CaptureError, f"{what}: needs at least one tensor operand")
        try:
            typed = handles[1:] if name == "where" and pattern[0] == "h" else handles
            tdts = [h.dtype for h in typed]
            dtype = sem.result_dtype(name, tdts or [handles[0].dtype], what, raw,
                                     "promote" in self.tracer.strict)
            shape = sem.broadcast([h.shape for h in handles], what)
            ax = sem.norm_axis(axis, len(shape), what)
        except CaptureError as e:
            raise self.fail(type(e), str(e)) from None
        if name in ("sum", "max", "min"):
            shape = tuple(1 if (ax is None or i == ax) else d for i, d in enumerate(shape))
        elif name == "trans":
            if len(shape) < 2:
                raise self.fail(CaptureError, "tl.trans needs a tensor with >= 2 dimensions")
            shape = shape[:-2] + (shape[-1], shape[-2])
        out_dt = out_dtype or dtype
        if name == "where" and pattern[0] == "h" and len(typed) == 0:
            out_dt = out_dtype or "f32"
        check_dtype(out_dt, what)
        dst, nbytes = self._out(shape, out_dt, what)
        deps = sorted({d for h in handles for d in h.deps})
        ex: dict[str, str] = {}
        if pattern != "h" * len(handles) + "s" * len(scalars):
            ex["args"] = pattern
        if any(d != dtype for d in tdts):   # implicit promotion: the executor casts first
            ex["promote"] = dtype
        extra = json.dumps(ex, sort_keys=True) if ex else None
        op = self._record("math", name, dst_space="tcm", dst_addr=dst, nbytes=nbytes,
                             in_addrs=[h.addr for h in handles], in_spaces=[h.space for h in handles],
                             in_shapes=[list(h.shape) for h in handles],
                             in_dtypes=[h.dtype for h in handles], scalars=scalars,
                             out_shape=list(shape), out_dtype=out_dt, axis=ax, deps=deps,
                             extra_json=extra)
        h = TensorHandle(shape, out_dt, "tcm", dst, op.op_id, name, op.src_line, True)
        r = _Own(h, self.scratch.died)
        r.addr, r.nbytes = dst, nbytes
        self.scratch.owned.append(r)
        return h

    def dot(self, a: Any, b: Any, acc: Any, acc_dtype: str | None,
            out_dtype: str | None = None) -> TensorHandle:
        if a.__class__ is not _TH or a.space != "tcm" or b.__class__ is not _TH or b.space != "tcm":
            a, b = self._tensor(a, "tl.dot"), self._tensor(b, "tl.dot")
        ash, bsh = a.shape, b.shape
        if len(ash) != 2 or len(bsh) != 2 or ash[1] != bsh[0]:
            raise self.fail(SanitizerError, f"tl.dot: shapes {a.shape} x {b.shape} do not form "
                                            f"(M,K) x (K,N)")
        in_dt = a.dtype
        if in_dt != b.dtype:    # mixed operands multiply in their common dtype
            if "promote" in self.tracer.strict:
                raise self.fail(SanitizerError, f"tl.dot: operand dtypes differ ({a.dtype}, "
                                                f"{b.dtype}) and the strict 'promote' sanitizer "
                                                f"is on; convert with h.to(dtype) first")
            in_dt = promote((a.dtype, b.dtype))
        if out_dtype is not None and acc_dtype is not None and out_dtype != acc_dtype:
            raise self.fail(CaptureError, f"tl.dot: out_dtype={out_dtype!r} and "
                                          f"acc_dtype={acc_dtype!r} disagree; give one")
        acc_dt = out_dtype or acc_dtype or (acc.dtype if isinstance(acc, TensorHandle) else None) \
            or sem.ACC_DEFAULT.get(in_dt, in_dt)
        check_dtype(acc_dt, "tl.dot")
        m, n = ash[0], bsh[1]
        if acc is not None:
            if acc.__class__ is not _TH or acc.space != "tcm":
                acc = self._tensor(acc, "tl.dot acc")
            if acc.shape != (m, n) or acc.dtype != acc_dt:
                raise self.fail(SanitizerError, f"tl.dot: acc is {acc.shape} {acc.dtype}, expected "
                                                f"{(m, n)} {acc_dt}")
        nbytes = m * n * itemsize(acc_dt)
        sc = self.scratch
        start = -(-sc.cursor // sc.align) * sc.align
        if start + nbytes > sc.capacity:
            start = self._alloc(sc, nbytes, "tl.dot result", (m, n), acc_dt) - sc.base
        else:
            sc.cursor = start + nbytes
        dst = sc.base + start
        op_id, line = self._emit("dot", a, b, acc, dst, nbytes, acc_dt)
        h = _TH((m, n), acc_dt, "tcm", dst, op_id, "dot", line, True)
        r = _Own(h, sc.died)
        r.addr, r.nbytes = dst, nbytes
        sc.owned.append(r)
        return h

    def composite(self, op: str, a: Any, b: Any, out_ptr: Any, math_op: str | None,
                  epilogue: Any, acc_dtype: str | None, tile_shape: Any,
                  out_dtype: str | None) -> CompletionHandle:
        what = f"tl.composite(op={op!r})"
        a = self._tensor(a, what, tcm=False)
        ins: list[TensorHandle] = [a]
        if op == "gemm":
            b = self._tensor(b, what, tcm=False)
            if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
                raise self.fail(SanitizerError, f"{what}: shapes {a.shape} x {b.shape} do not "
                                                f"form (M,K) x (K,N)")
            if a.dtype != b.dtype:
                raise self.fail(SanitizerError, f"{what}: operand dtypes differ")
            ins.append(b)
            m, k, n = a.shape[0], a.shape[1], b.shape[1]
            shape: tuple[int, ...] = (m, n)
            acc_dt = acc_dtype or sem.ACC_DEFAULT.get(a.dtype, a.dtype)
        elif op == "math":
            if math_op not in UNARY:
                raise self.fail(CaptureError, f"{what}: math_op must be one of {sorted(UNARY)}")
            m = k = n = None
            shape, acc_dt = a.shape, None
        else:
            raise self.fail(CaptureError, f"tl.composite: op must be 'gemm' or 'math', got {op!r}")
        out_dt = out_dtype or a.dtype
        check_dtype(out_dt, what)
        tile = self.tracer.params.pe.tile
        ts = [int(x) for x in (tile_shape or (tile.m, tile.k, tile.n))]
        epi = self._epilogue(epilogue or [], ins, shape, what)
        if out_ptr is None:
            raise self.fail(CaptureError, f"{what}: out_ptr (HBM address of the result) is required")
        nbytes = math.prod(shape) * itemsize(out_dt)
        reg = self._region(out_ptr, nbytes, what, out_dt)
        extra = {"epilogue": epi, "tile_shape": ts, "a_pinned": a.space == "tcm",
                 "b_pinned": op == "gemm" and ins[1].space == "tcm"}
        if math_op:
            extra["math_op"] = math_op
        for h in ins:           # read while later ops run: never reclaimed
            self._pin(h)
        hid = self.n_async
        self.n_async += 1
        rec = self._record("composite", op, is_async=True, dst_space=reg.space,
                              dst_addr=int(out_ptr), nbytes=nbytes,
                              in_addrs=[h.addr for h in ins], in_spaces=[h.space for h in ins],
                              in_shapes=[list(h.shape) for h in ins],
                              in_dtypes=[h.dtype for h in ins], out_shape=list(shape),
                              out_dtype=out_dt, acc_dtype=acc_dt, m=m, n=n, k=k,
                              deps=sorted({d for h in ins for d in h.deps}), handle_id=hid,
                              extra_json=json.dumps(extra, sort_keys=True))
        reg.note_write(int(out_ptr), int(out_ptr) + nbytes, rec.op_id, True)
        done = CompletionHandle(rec.op_id, hid)
        self.outstanding.append(done)
        return done

    def _epilogue(self, epilogue: Any, ins: list[TensorHandle], shape: tuple[int, ...],
                  what: str) -> list[dict[str, Any]]:
        out = []
        for i, e in enumerate(epilogue):
            if not isinstance(e, dict) or e.get("op") not in EPILOGUE_OPS:
                raise self.fail(CaptureError, f"{what}: epilogue[{i}] must be a dict with 'op' in "
                                              f"{sorted(EPILOGUE_OPS)}, got {e!r}")
            spec: dict[str, Any] = {"op": e["op"], "scope": e.get("scope", "output_tile")}
            if spec["scope"] not in ("k_tile", "output_tile"):
                raise self.fail(CaptureError, f"{what}: epilogue[{i}] scope must be 'k_tile' or "
                                              f"'output_tile', got {spec['scope']!r}")
            for key in EPILOGUE_OPS[e["op"]]:
                if key not in e:
                    raise self.fail(CaptureError, f"{what}: epilogue[{i}] op {e['op']!r} needs "
                                                  f"field {key!r}")
                v = e[key]
                if isinstance(v, TensorHandle):
                    if spec["scope"] == "output_tile":
                        sem.broadcast([shape, v.shape], f"{what} epilogue[{i}].{key}")
                    spec[key] = {"operand": len(ins)}
                    ins.append(v)
                else:
                    spec[key] = float(v)
            out.append(spec)
        return out

    # ------------------------------------------------------------------ control
    def wait(self, h: Any) -> Any:
        if h is None:
            todo = [c for c in self.outstanding if not c.waited]
            for c in todo:
                c.waited = True
            self.outstanding = []
            self._record("wait", "wait", deps=[c.op_id for c in todo])
            return None
        if isinstance(h, CompletionHandle):
            h.waited = True
            self._record("wait", "wait", deps=[h.op_id], handle_id=h.handle_id)
            return None
        if isinstance(h, RecvFuture):
            file, line = caller_line()
            while h.result is None:
                self.block("tl.wait(recv_async)", h.direction, file, line)
            self._record("wait", "wait", deps=[h.op_id], handle_id=h.handle_id)
            return h.result
        raise self.fail(CaptureError, f"tl.wait: expected a composite handle, a recv_async future "
                                      f"or None, got {type(h).__name__}")

    def cycles(self, n: int) -> None:
        if int(n) < 0:
            raise self.fail(CaptureError, f"tl.cycles: negative cycle count {n}")
        self._record("cycles", "cycles", cycles=int(n))

    def block(self, call: str, direction: str, file: str | None, line: int | None) -> None:
        """Park this program until the scheduler resumes it (a matching send arrived)."""
        self.blocked = (call, direction, file, line)
        self.run.sched.switch()
        self.blocked = None

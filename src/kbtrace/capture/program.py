"""The recorder backend (layer 3 of 3): one ``Program`` per program instance of a launch.

Every ``tl.*`` call ends here. A call validates addresses against the region
map (the address sanitizer), allocates its destination (TCM for loads and
receives, scratch for compute results; bump allocators sized from
``pe.tcm.size_kb`` / ``pe.tcm.scratch_kb``), builds an ``Op`` row with full
addresses, spaces, shapes, dtypes and explicit ``deps``, executes it on the
trace's lock-step ``Machine`` (so loads return real values) and hands it to the
op sink. Compute results come back as *pending* handles.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from kbtrace.capture import _semantics as sem
from kbtrace.capture.dtypes import check_dtype, itemsize, to_compute
from kbtrace.capture.executor import EPILOGUE_OPS, UNARY, Op
from kbtrace.capture.handles import CompletionHandle, RecvFuture, TensorHandle
from kbtrace.capture.memory import Allocator, Region, span_elems
from kbtrace.errors import CaptureError, SanitizerError

if TYPE_CHECKING:
    from kbtrace.capture.scheduler import LaunchRun

__all__ = ["Program", "caller_line"]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_COMPUTE = frozenset(("dot", "math", "composite"))


def caller_line() -> tuple[str | None, int | None]:
    """(basename, line) of the innermost frame outside kbtrace.capture: the kernel's call site."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    if f is None:
        return None, None
    return os.path.basename(f.f_code.co_filename), f.f_lineno


class Program:
    """State and recorder of one program instance (one PE) within a launch."""

    def __init__(self, run: LaunchRun, index: int, pid0: int, pid1: int,
                 coord: tuple[int, int, int]) -> None:
        t = run.tracer
        self.run, self.tracer = run, t
        self.index, self.pid0, self.pid1 = index, pid0, pid1
        self.sip, self.cube, self.pe = coord
        self.kernel = run.kernel_name
        tcm = t.params.pe.tcm
        size, scratch = tcm.size_kb * 1024, tcm.scratch_kb * 1024
        base = t.addr.pe_tcm_addr(self.sip, self.cube, self.pe, 0)
        node = f"sip{self.sip}.cube{self.cube}.pe{self.pe}"
        self.tcm = Allocator(base, size - scratch, f"TCM of {node}")
        self.scratch = Allocator(base + size - scratch, scratch, f"scratch of {node}")
        self.seq = 0
        self.n_async = 0
        self.outstanding: list[CompletionHandle] = []
        self.blocked: tuple[str, str, str | None, int | None] | None = None
        self.queued = False
        self.done = False
        self.glet: Any = None

    # ------------------------------------------------------------------ helpers
    def describe(self) -> str:
        return (f"kernel {self.kernel!r} program {self.index} (pid {self.pid0},{self.pid1} on "
                f"sip{self.sip}.cube{self.cube}.pe{self.pe})")

    def fail(self, cls: type[CaptureError], msg: str) -> CaptureError:
        file, line = caller_line()
        return cls(f"{self.describe()}, line {file}:{line}: {msg}")

    def _record(self, kind: str, name: str, *, seq: int | None = None,
                where: tuple[str | None, int | None] | None = None, **fields: Any) -> tuple[Op, Any]:
        t = self.tracer
        if seq is None:
            seq = self.seq
            self.seq += 1
        file, line = where if where is not None else caller_line()
        op = Op(op_id=t.next_op, launch=self.run.launch, program=self.index, pid0=self.pid0,
                pid1=self.pid1, sip=self.sip, cube=self.cube, pe=self.pe, seq=seq, kind=kind,
                name=name, src_file=file, src_line=line, **fields)
        if op.is_async is None:
            op.is_async = False
        if op.nbytes is None:
            op.nbytes = 0
        t.next_op += 1
        if t.golden or kind not in _COMPUTE:
            stored, op.out_digest = t.machine.step(op)
        else:  # pending results are never observed during capture: skip the arithmetic
            stored = None
        t.sink.emit(op)
        return op, stored

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
        try:
            return self.scratch.alloc(nbytes, f"{what} result {shape} {dtype}"), nbytes
        except SanitizerError as e:
            raise self.fail(SanitizerError, str(e)) from None

    # ------------------------------------------------------------------ memory
    def ref(self, ptr: int, shape: Any, dtype: str) -> TensorHandle:
        shape = sem.norm_shape(shape, "tl.ref")
        check_dtype(dtype, "tl.ref")
        nbytes = math.prod(shape) * itemsize(dtype)
        reg = self._region(ptr, nbytes, "tl.ref", dtype)
        deps, pending = reg.readers_view(int(ptr), int(ptr) + nbytes)
        return TensorHandle(shape, dtype, reg.space, int(ptr), None, "ref", caller_line()[1],
                            pending, None, tuple(deps))

    def load(self, ptr: int, shape: Any, dtype: str, strides: Any = None) -> TensorHandle:
        shape = sem.norm_shape(shape, "tl.load")
        check_dtype(dtype, "tl.load")
        st = sem.norm_strides(strides, shape, "tl.load")
        isz = itemsize(dtype)
        span = span_elems(shape, st) * isz
        nbytes = math.prod(shape) * isz
        ptr = int(ptr)
        reg = self._region(ptr, span, "tl.load", dtype)
        deps, pending = reg.readers_view(ptr, ptr + span)
        try:
            dst = self.tcm.alloc(nbytes, f"tl.load of {shape} {dtype}")
        except SanitizerError as e:
            raise self.fail(SanitizerError, str(e)) from None
        op, stored = self._record("load", "load", src_space=reg.space, src_addr=ptr,
                                  dst_space="tcm", dst_addr=dst, nbytes=nbytes,
                                  out_shape=list(shape), out_dtype=dtype,
                                  mem_strides=list(st or ()), deps=deps)
        return TensorHandle(shape, dtype, "tcm", dst, op.op_id, "load", op.src_line, pending,
                            None if pending else to_compute(stored, dtype))

    def store(self, ptr: int, h: Any, strides: Any = None) -> None:
        h = self._tensor(h, "tl.store", tcm=False)
        st = sem.norm_strides(strides, h.shape, "tl.store")
        span = span_elems(h.shape, st) * itemsize(h.dtype)
        ptr = int(ptr)
        reg = self._region(ptr, span, "tl.store", h.dtype)
        op, _ = self._record("store", "store", src_space=h.space, src_addr=h.addr,
                             dst_space=reg.space, dst_addr=ptr, nbytes=h.nbytes,
                             out_shape=list(h.shape), out_dtype=h.dtype,
                             mem_strides=list(st or ()), deps=list(h.deps))
        if st is None:
            reg.note_write(ptr, ptr + span, op.op_id, h.pending)
        else:  # a strided tile does not overwrite the gaps of its span: keep older writers
            reg.writers.append((ptr, ptr + span, op.op_id, h.pending))

    # ------------------------------------------------------------------ compute
    def fill(self, name: str, shape: Any, dtype: str, scalars: list[float]) -> TensorHandle:
        shape = sem.norm_shape(shape, f"tl.{name}")
        check_dtype(dtype, f"tl.{name}")
        dst, nbytes = self._out(shape, dtype, f"tl.{name}")
        op, stored = self._record("fill", name, dst_space="tcm", dst_addr=dst, nbytes=nbytes,
                                  out_shape=list(shape), out_dtype=dtype, scalars=scalars)
        return TensorHandle(shape, dtype, "tcm", dst, op.op_id, name, op.src_line, False,
                            to_compute(stored, dtype))

    def math(self, name: str, args: list[Any], *, axis: int | None = None,
             out_dtype: str | None = None) -> TensorHandle:
        what = f"tl.{name}"
        handles: list[TensorHandle] = []
        scalars: list[float] = []
        pattern = ""
        for a in args:
            if isinstance(a, TensorHandle):
                handles.append(self._tensor(a, what))
                pattern += "h"
            elif isinstance(a, (int, float, np.integer, np.floating, bool)):
                scalars.append(float(a))
                pattern += "s"
            else:
                raise self.fail(CaptureError, f"{what}: operand of type {type(a).__name__}; "
                                              f"use TensorHandles or Python numbers")
        if not handles:
            raise self.fail(CaptureError, f"{what}: needs at least one tensor operand")
        try:
            typed = handles[1:] if name == "where" and pattern[0] == "h" else handles
            dtype = sem.result_dtype(name, [h.dtype for h in typed] or [handles[0].dtype], what)
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
        extra = None if pattern == "h" * len(handles) + "s" * len(scalars) else json.dumps(
            {"args": pattern}, sort_keys=True)
        op, _ = self._record("math", name, dst_space="tcm", dst_addr=dst, nbytes=nbytes,
                             in_addrs=[h.addr for h in handles], in_spaces=[h.space for h in handles],
                             in_shapes=[list(h.shape) for h in handles],
                             in_dtypes=[h.dtype for h in handles], scalars=scalars,
                             out_shape=list(shape), out_dtype=out_dt, axis=ax, deps=deps,
                             extra_json=extra)
        return TensorHandle(shape, out_dt, "tcm", dst, op.op_id, name, op.src_line, True)

    def dot(self, a: Any, b: Any, acc: Any, acc_dtype: str | None) -> TensorHandle:
        a, b = self._tensor(a, "tl.dot"), self._tensor(b, "tl.dot")
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise self.fail(SanitizerError, f"tl.dot: shapes {a.shape} x {b.shape} do not form "
                                            f"(M,K) x (K,N)")
        if a.dtype != b.dtype:
            raise self.fail(SanitizerError, f"tl.dot: operand dtypes differ ({a.dtype}, {b.dtype})")
        acc_dt = acc_dtype or (acc.dtype if isinstance(acc, TensorHandle) else None) \
            or sem.ACC_DEFAULT.get(a.dtype, a.dtype)
        check_dtype(acc_dt, "tl.dot")
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        ins = [a, b]
        if acc is not None:
            acc = self._tensor(acc, "tl.dot acc")
            if acc.shape != (m, n) or acc.dtype != acc_dt:
                raise self.fail(SanitizerError, f"tl.dot: acc is {acc.shape} {acc.dtype}, expected "
                                                f"{(m, n)} {acc_dt}")
            ins.append(acc)
        dst, nbytes = self._out((m, n), acc_dt, "tl.dot")
        op, _ = self._record("dot", "dot", dst_space="tcm", dst_addr=dst, nbytes=nbytes,
                             in_addrs=[h.addr for h in ins], in_spaces=[h.space for h in ins],
                             in_shapes=[list(h.shape) for h in ins], in_dtypes=[h.dtype for h in ins],
                             out_shape=[m, n], out_dtype=acc_dt, acc_dtype=acc_dt, m=m, n=n, k=k,
                             deps=sorted({d for h in ins for d in h.deps}))
        return TensorHandle((m, n), acc_dt, "tcm", dst, op.op_id, "dot", op.src_line, True)

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
        hid = self.n_async
        self.n_async += 1
        rec, _ = self._record("composite", op, is_async=True, dst_space=reg.space,
                              dst_addr=int(out_ptr), nbytes=nbytes,
                              in_addrs=[h.addr for h in ins], in_spaces=[h.space for h in ins],
                              in_shapes=[list(h.shape) for h in ins],
                              in_dtypes=[h.dtype for h in ins], out_shape=list(shape),
                              out_dtype=out_dt, acc_dtype=acc_dt, m=m, n=n, k=k,
                              deps=sorted({d for h in ins for d in h.deps}), handle_id=hid,
                              extra_json=json.dumps(extra, sort_keys=True))
        reg.note_write(int(out_ptr), int(out_ptr) + nbytes, rec.op_id, True)
        h = CompletionHandle(rec.op_id, hid)
        self.outstanding.append(h)
        return h

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

    # ------------------------------------------------------------------ IPCQ
    def send(self, direction: str, src: Any) -> None:
        peer = self.run.peer(self, direction)
        h = self._tensor(src, f"tl.send({direction!r})")
        rx_dir = self.run.reverse_direction(self.index, peer, direction)
        chan = (self.index, peer, direction)
        iseq = self.run.chan_seq.get(chan, 0)
        self.run.chan_seq[chan] = iseq + 1
        pp = self.run.programs[peer]
        op, _ = self._record("send", "send", src_space=h.space, src_addr=h.addr,
                             dst_space="ipcq", nbytes=h.nbytes, out_shape=list(h.shape),
                             out_dtype=h.dtype, direction=direction, peer_program=peer,
                             peer_sip=pp.sip, peer_cube=pp.cube, peer_pe=pp.pe, ipcq_seq=iseq,
                             deps=list(h.deps))
        msg = (op, h.shape, h.dtype, h.pending)
        key = (peer, rx_dir)
        parked = self.run.parked.get(key)
        if parked:
            fut, receiver = parked.popleft()
            receiver.complete_recv(rx_dir, msg, fut)
            self.run.wake(receiver)
            return
        self.run.channels.setdefault(key, deque()).append(msg)
        self.run.wake(pp)

    def recv(self, direction: str, shape: Any, dtype: str | None) -> TensorHandle:
        self.run.peer(self, direction)
        file, line = caller_line()
        key = (self.index, direction)
        while True:
            q = self.run.channels.get(key)
            if q and not self.run.parked.get(key):
                h = self.complete_recv(direction, q.popleft(), None, shape, dtype)
                return h
            self.block("tl.recv", direction, file, line)

    def recv_async(self, direction: str, shape: Any, dtype: str | None) -> RecvFuture:
        self.run.peer(self, direction)
        file, line = caller_line()
        seq = self.seq
        self.seq += 1
        fut = RecvFuture(direction, None if shape is None else sem.norm_shape(shape, "tl.recv"),
                         dtype, seq, line, self.n_async)
        fut_where = (file, line)
        self.n_async += 1
        key = (self.index, direction)
        q = self.run.channels.get(key)
        if q and not self.run.parked.get(key):
            self.complete_recv(direction, q.popleft(), fut, where=fut_where)
        else:
            self.run.parked.setdefault(key, deque()).append((fut, self))
            self.run.where[id(fut)] = fut_where
        return fut

    def complete_recv(self, direction: str, msg: tuple[Op, tuple[int, ...], str, bool],
                      fut: RecvFuture | None, shape: Any = None, dtype: str | None = None,
                      where: tuple[str | None, int | None] | None = None) -> TensorHandle:
        send, mshape, mdtype, pending = msg
        if fut is not None:
            shape, dtype = fut.shape, fut.dtype
            where = where or self.run.where.pop(id(fut), (None, fut.line))
        if shape is not None and sem.norm_shape(shape, "tl.recv") != mshape or (
                dtype is not None and dtype != mdtype):
            raise SanitizerError(
                f"{self.describe()}: tl.recv({direction!r}) expects {shape} {dtype} but program "
                f"{send.program} sent {mshape} {mdtype} (send op {send.op_id}, line "
                f"{send.src_file}:{send.src_line}); make both sides agree")
        nbytes = send.nbytes
        try:
            dst = self.tcm.alloc(nbytes, f"tl.recv of {mshape} {mdtype}")
        except SanitizerError as e:
            raise SanitizerError(f"{self.describe()}: {e}") from None
        op, stored = self._record(
            "recv", "recv_async" if fut is not None else "recv", seq=None if fut is None else fut.seq,
            where=where, is_async=fut is not None, src_space="ipcq", src_addr=send.src_addr,
            dst_space="tcm", dst_addr=dst, nbytes=nbytes, out_shape=list(mshape),
            out_dtype=mdtype, direction=direction, peer_program=send.program, peer_sip=send.sip,
            peer_cube=send.cube, peer_pe=send.pe, ipcq_seq=send.ipcq_seq, match_op_id=send.op_id,
            deps=[send.op_id], handle_id=None if fut is None else fut.handle_id)
        send.match_op_id = op.op_id
        self.tracer.sink.matched(send)
        h = TensorHandle(mshape, mdtype, "tcm", dst, op.op_id, op.name, op.src_line, pending,
                         None if pending else to_compute(stored, mdtype))
        if fut is not None:
            fut.result, fut.op_id = h, op.op_id
        return h

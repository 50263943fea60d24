"""IPCQ calls of a program (``tl.send`` / ``recv`` / ``recv_async`` / ``recv_no_consume``).

Mixed into ``program.Program``. Messages travel on channels keyed by (sender, receiver,
sender's direction); each channel is one rx buffer of ``n_slots`` slots of ``slot_bytes``
(ADR-0025: a buffer per direction, so a 2-PE ring's E and W sends to the same peer never
share slots). A message takes ``ceil(nbytes / slot_bytes)`` slots, at most ``n_slots``
(a larger one streams through the whole buffer), from its send until its receive consumes
it -- the credits replay models. A send that finds too few free slots blocks the sending
program, exactly as PE_CPU blocks in replay, so a kernel whose sends can only complete
after their receives deadlocks here (and capture refuses it, naming the sends) instead of
in replay.

Forms (ADR-0046 D3)::

    tl.send("E", h)                                          # a TCM handle
    tl.send("E", src_addr=ptr, shape=(n,), dtype="f16", space="hbm")   # raw address
    x = tl.recv("W", (n,), "f16")                            # into a fresh TCM buffer
    x = tl.recv("W", (n,), "f16", dst_addr=ptr, space="hbm") # copied to ptr (copy_to_dst)
    x = tl.recv_no_consume("W", (n,), "f16")   # diagnostic: no slot-read cost in replay
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kbtrace.capture import _semantics as sem
from kbtrace.capture.dtypes import check_dtype, itemsize
from kbtrace.capture.handles import RecvFuture, TensorHandle, caller_line
from kbtrace.errors import CaptureError, SanitizerError

if TYPE_CHECKING:
    from kbtrace.capture.executor import Op
    from kbtrace.capture.memory import Allocator, Region

__all__ = ["IpcqMixin", "check_ipcq", "ipcq_json"]

_SPACES = ("tcm", "hbm", "sram")


class IpcqMixin:
    """IPCQ calls of ``Program`` (see the module docstring)."""

    run: Any
    tracer: Any
    seq: int
    n_async: int
    tcm: Any
    scratch: Any
    index: int
    blocked_send: tuple[tuple[int, int, str], int, int] | None

    if TYPE_CHECKING:       # Program's, which mixes this in
        def describe(self) -> str: ...
        def fail(self, cls: type[CaptureError], msg: str) -> CaptureError: ...
        def _record(self, kind: str, name: str, *, seq: int | None = None,
                    where: tuple[str | None, int | None] | None = None, **fields: Any) -> Op: ...
        def _region(self, ptr: Any, span: int, what: str, dtype: str) -> Region: ...
        def _tensor(self, h: Any, what: str, *, tcm: bool = True) -> TensorHandle: ...
        def _place(self, a: Allocator, nbytes: int) -> int | None: ...
        def _pin(self, h: TensorHandle) -> None: ...
        def block(self, call: str, direction: str, file: str | None,
                  line: int | None) -> None: ...

    # ------------------------------------------------------------------ send
    def send(self, direction: str, src: Any = None, src_addr: Any = None, nbytes: Any = None,
             shape: Any = None, dtype: str = "f16", space: str = "tcm") -> None:
        run = self.run
        peer = run.peer(self, direction)
        file, line = _where = self._caller()
        if src is None:
            h = self._raw_source(src_addr, nbytes, shape, dtype, space)
        else:
            if src_addr is not None:
                raise self.fail(CaptureError, "tl.send: pass a handle or src_addr=..., not both")
            h = self._tensor(src, f"tl.send({direction!r})")
        self._pin(h)            # the DMA reads it after the CPU has moved on
        rx_dir = run.reverse_direction(self.index, peer, direction)
        chan = (self.index, peer, direction)
        k = run.slots_for(h.nbytes)
        while run.free_slots(chan) < k:       # the receiver still holds the slots: wait
            run.send_waiters[chan] = self
            self.blocked_send = (chan, k, h.nbytes)
            self.block("tl.send", direction, file, line)
        self.blocked_send = None
        run.take_slots(chan, k)
        iseq = run.chan_seq.get(chan, 0)
        run.chan_seq[chan] = iseq + 1
        pp = run.programs[peer]
        op = self._record("send", "send", where=_where, src_space=h.space, src_addr=h.addr,
                          dst_space="ipcq", nbytes=h.nbytes, out_shape=list(h.shape),
                          out_dtype=h.dtype, direction=direction, peer_program=peer,
                          peer_sip=pp.sip, peer_cube=pp.cube, peer_pe=pp.pe, ipcq_seq=iseq,
                          deps=list(h.deps), extra_json=run.ipcq_json)
        run.held.setdefault(chan, deque()).append((op, k))
        msg = (op, h.shape, h.dtype, h.pending, h, chan, k)
        key = (peer, rx_dir)
        parked = run.parked.get(key)
        if parked:
            fut, receiver = parked.popleft()
            receiver.complete_recv(rx_dir, msg, fut)
            run.wake(receiver)
            return
        run.channels.setdefault(key, deque()).append(msg)
        run.wake(pp)

    def _caller(self) -> tuple[str | None, int | None]:
        return caller_line()

    def _raw_source(self, src_addr: Any, nbytes: Any, shape: Any, dtype: str,
                    space: str) -> TensorHandle:
        """The payload of ``tl.send(d, src_addr=..., shape|nbytes=..., dtype=, space=)``."""
        what = "tl.send(src_addr=...)"
        if src_addr is None:
            raise self.fail(CaptureError, "tl.send: pass a TensorHandle or src_addr=...")
        if space not in _SPACES:
            raise self.fail(CaptureError, f"{what}: space must be one of {', '.join(_SPACES)}, "
                                          f"got {space!r}")
        check_dtype(dtype, what)
        if shape is None:
            if nbytes is None or int(nbytes) <= 0 or int(nbytes) % itemsize(dtype):
                raise self.fail(CaptureError, f"{what}: pass shape=... or nbytes=... (a positive "
                                              f"multiple of {itemsize(dtype)} B for {dtype})")
            shape = (int(nbytes) // itemsize(dtype),)
        shape = sem.norm_shape(shape, what)
        size = math.prod(shape) * itemsize(dtype)
        if nbytes is not None and int(nbytes) != size:
            raise self.fail(CaptureError, f"{what}: nbytes={nbytes} but shape {shape} {dtype} is "
                                          f"{size} B; pass one of them")
        ptr = int(src_addr)
        if space == "tcm":
            h = self._handle_at(ptr, size)
            if h is None or h.dtype != dtype:
                raise self.fail(SanitizerError, f"{what}: no live {dtype} TCM tensor of {size} B "
                                                f"at {ptr:#x} on this PE; pass the handle itself")
            return h
        reg = self._region(ptr, size, what, dtype)
        if reg.space != space:
            raise self.fail(SanitizerError, f"{what}: {ptr:#x} is in {reg.label} ({reg.space}), "
                                            f"not {space}; pass space={reg.space!r}")
        deps, pending = reg.readers_view(ptr, ptr + size)
        h = TensorHandle(shape, dtype, space, ptr, None, "ref", None, pending, None, tuple(deps))
        if not pending:
            h._stored = self.tracer.kmem.read(ptr, shape, dtype)
        return h

    def _handle_at(self, addr: int, nbytes: int) -> TensorHandle | None:
        """The live TCM handle whose buffer starts at ``addr`` and holds ``nbytes``."""
        for a in (self.tcm, self.scratch):
            refs = list(a.owned) + [s[2] for s in a._spans if s[2] is not None]
            for r in refs:
                h = r()
                if h is not None and h.addr == addr and h.nbytes == nbytes:
                    return h
        return None

    # ------------------------------------------------------------------ receive
    def recv(self, direction: str, shape: Any, dtype: str | None, dst_addr: Any = None,
             space: str | None = None, consume: bool = True) -> TensorHandle:
        run = self.run
        run.peer(self, direction)
        file, line = self._caller()
        dst = None
        if dst_addr is not None or space is not None:
            if dst_addr is None:
                raise self.fail(CaptureError, "tl.recv: space=... needs dst_addr=... (the "
                                              "copy_to_dst form); omit both for a TCM buffer")
            dst = (space, int(dst_addr))
        key = (self.index, direction)
        while True:
            q = run.channels.get(key)
            if q and not run.parked.get(key):
                return self.complete_recv(direction, q.popleft(), None, shape, dtype,
                                          dst=dst, consume=consume)
            self.block("tl.recv", direction, file, line)

    def recv_async(self, direction: str, shape: Any, dtype: str | None) -> RecvFuture:
        run = self.run
        run.peer(self, direction)
        file, line = self._caller()
        seq = self.seq
        self.seq += 1
        fut = RecvFuture(direction, None if shape is None else sem.norm_shape(shape, "tl.recv"),
                         dtype, seq, line, self.n_async)
        fut_where = (file, line)
        self.n_async += 1
        key = (self.index, direction)
        q = run.channels.get(key)
        if q and not run.parked.get(key):
            self.complete_recv(direction, q.popleft(), fut, where=fut_where)
        else:
            run.parked.setdefault(key, deque()).append((fut, self))
            run.where[id(fut)] = fut_where
        return fut

    def _recv_dst(self, dst: tuple[str | None, int], nbytes: int, dtype: str
                  ) -> tuple[str, int, Any]:
        """(space, address, region or None) of a copy_to_dst receive, validated."""
        space, ptr = dst
        t = self.tcm
        if space in (None, "tcm") and t.base <= ptr and ptr + nbytes <= t.base + t.capacity:
            return "tcm", ptr, None
        if space == "tcm":
            raise self.fail(SanitizerError, f"tl.recv(dst_addr={ptr:#x}, space='tcm'): "
                                            f"{nbytes} B there are not in this PE's TCM")
        if space is not None and space not in _SPACES:
            raise self.fail(CaptureError, f"tl.recv: space must be one of {', '.join(_SPACES)}, "
                                          f"got {space!r}")
        reg = self._region(ptr, nbytes, "tl.recv(dst_addr=...)", dtype)
        if space is not None and reg.space != space:
            raise self.fail(SanitizerError, f"tl.recv(dst_addr={ptr:#x}): the address is in "
                                            f"{reg.label} ({reg.space}), not {space}; pass "
                                            f"space={reg.space!r}")
        return reg.space, ptr, reg

    def complete_recv(self, direction: str, msg: tuple[Any, ...], fut: RecvFuture | None,
                      shape: Any = None, dtype: str | None = None,
                      where: tuple[str | None, int | None] | None = None,
                      dst: tuple[str | None, int] | None = None,
                      consume: bool = True) -> TensorHandle:
        send, mshape, mdtype, pending, payload, chan, k = msg
        run = self.run
        if fut is not None:
            shape, dtype = fut.shape, fut.dtype
            where = where or run.where.pop(id(fut), (None, fut.line))
        if shape is not None and sem.norm_shape(shape, "tl.recv") != mshape or (
                dtype is not None and dtype != mdtype):
            raise SanitizerError(
                f"{self.describe()}: tl.recv({direction!r}) expects {shape} {dtype} but program "
                f"{send.program} sent {mshape} {mdtype} (send op {send.op_id}, line "
                f"{send.src_file}:{send.src_line}); make both sides agree")
        nbytes = send.nbytes
        reg = None
        if dst is None:
            dspace, a = "tcm", self.tcm
            daddr = self._place(a, nbytes)
            if daddr is None:   # (may run in the sender's context: name the receiver, not a line)
                raise SanitizerError(
                    f"{self.describe()}: {a.full(nbytes, f'tl.recv of {mshape} {mdtype}')}")
            a.pin(daddr, nbytes)            # written by the vc_comm DMA whenever it lands
        else:
            dspace, daddr, reg = self._recv_dst(dst, nbytes, mdtype)
            if dspace == "tcm":
                self.tcm.pin(daddr, nbytes)
        name = "recv_async" if fut is not None else ("recv" if consume else "recv_no_consume")
        op = self._record(
            "recv", name, seq=None if fut is None else fut.seq,
            where=where, is_async=fut is not None, src_space="ipcq", src_addr=send.src_addr,
            dst_space=dspace, dst_addr=daddr, nbytes=nbytes, out_shape=list(mshape),
            out_dtype=mdtype, direction=direction, peer_program=send.program, peer_sip=send.sip,
            peer_cube=send.cube, peer_pe=send.pe, ipcq_seq=send.ipcq_seq, match_op_id=send.op_id,
            deps=[send.op_id], handle_id=None if fut is None else fut.handle_id,
            extra_json=send.extra_json)
        send.match_op_id = op.op_id
        self.tracer.sink.matched(send)
        run.release_slots(chan, k)
        h = TensorHandle(mshape, mdtype, dspace, daddr, op.op_id, op.name, op.src_line, pending)
        if not pending:
            h._lazy = (2, payload)
        if reg is not None:
            if not pending:
                self.tracer.kwrite(daddr, payload.stored(), None)
            reg.note_write(daddr, daddr + nbytes, op.op_id, pending)
        if fut is not None:
            fut.result, fut.op_id = h, op.op_id
        return h


def ipcq_json(settings: dict[str, Any] | None) -> str | None:
    """The ``extra_json`` of a launch's IPCQ ops when it sets its own IPCQ parameters."""
    return None if not settings else json.dumps({"ipcq": settings}, sort_keys=True)


_IPCQ_KEYS = {"n_slots": int, "slot_bytes": int, "buffer_kind": str}
_BUFFER_KINDS = ("tcm", "sram", "hbm")


def check_ipcq(ipcq: Mapping[str, Any] | None, where: str) -> dict[str, Any] | None:
    """Validated per-launch IPCQ settings (None: the topology's)."""
    if not ipcq:
        return None
    out: dict[str, Any] = {}
    for k, v in ipcq.items():
        if k not in _IPCQ_KEYS:
            raise CaptureError(f"workload {where!r}: unknown IPCQ setting {k!r}; use "
                               f"{', '.join(_IPCQ_KEYS)}")
        if k == "buffer_kind":
            if v not in _BUFFER_KINDS:
                raise CaptureError(f"workload {where!r}: buffer_kind={v!r}; use one of "
                                   f"{', '.join(_BUFFER_KINDS)}")
            out[k] = str(v)
        else:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 1:
                raise CaptureError(f"workload {where!r}: {k}={v!r} must be an int >= 1")
            out[k] = int(v)
    return out

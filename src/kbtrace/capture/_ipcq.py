"""IPCQ calls of the recorder (``tl.send`` / ``recv`` / ``recv_async``), mixed into
``program.Program``: matching by (sender, receiver, direction, sequence), parking a receiver
until its message arrives, and the recv op row (recorded when the message is matched)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from kbtrace.capture import _semantics as sem
from kbtrace.capture.handles import RecvFuture, TensorHandle, caller_line
from kbtrace.errors import SanitizerError

if TYPE_CHECKING:
    from kbtrace.capture.executor import Op

__all__ = ["IpcqMixin"]


class IpcqMixin:
    """``send`` / ``recv`` / ``recv_async`` / ``complete_recv`` of ``program.Program``."""

    run: Any
    tracer: Any
    seq: int
    n_async: int
    tcm: Any
    index: int

    # ------------------------------------------------------------------ IPCQ
    def send(self, direction: str, src: Any) -> None:
        peer = self.run.peer(self, direction)
        h = self._tensor(src, f"tl.send({direction!r})")
        self._pin(h)            # the DMA reads it after the CPU has moved on
        rx_dir = self.run.reverse_direction(self.index, peer, direction)
        chan = (self.index, peer, direction)
        iseq = self.run.chan_seq.get(chan, 0)
        self.run.chan_seq[chan] = iseq + 1
        pp = self.run.programs[peer]
        op = self._record("send", "send", src_space=h.space, src_addr=h.addr,
                             dst_space="ipcq", nbytes=h.nbytes, out_shape=list(h.shape),
                             out_dtype=h.dtype, direction=direction, peer_program=peer,
                             peer_sip=pp.sip, peer_cube=pp.cube, peer_pe=pp.pe, ipcq_seq=iseq,
                             deps=list(h.deps))
        msg = (op, h.shape, h.dtype, h.pending, h)
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

    def complete_recv(self, direction: str, msg: tuple[Op, tuple[int, ...], str, bool, Any],
                      fut: RecvFuture | None, shape: Any = None, dtype: str | None = None,
                      where: tuple[str | None, int | None] | None = None) -> TensorHandle:
        send, mshape, mdtype, pending, payload = msg
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
        a = self.tcm
        dst = self._place(a, nbytes)
        if dst is None:     # (may run in the sender's context: name the receiver, not a line)
            raise SanitizerError(
                f"{self.describe()}: {a.full(nbytes, f'tl.recv of {mshape} {mdtype}')}")
        a.pin(dst, nbytes)              # written by the vc_comm DMA whenever it lands
        op = self._record(
            "recv", "recv_async" if fut is not None else "recv", seq=None if fut is None else fut.seq,
            where=where, is_async=fut is not None, src_space="ipcq", src_addr=send.src_addr,
            dst_space="tcm", dst_addr=dst, nbytes=nbytes, out_shape=list(mshape),
            out_dtype=mdtype, direction=direction, peer_program=send.program, peer_sip=send.sip,
            peer_cube=send.cube, peer_pe=send.pe, ipcq_seq=send.ipcq_seq, match_op_id=send.op_id,
            deps=[send.op_id], handle_id=None if fut is None else fut.handle_id)
        send.match_op_id = op.op_id
        self.tracer.sink.matched(send)
        h = TensorHandle(mshape, mdtype, "tcm", dst, op.op_id, op.name, op.src_line, pending)
        if not pending:
            h._lazy = (2, payload)
        if fut is not None:
            fut.result, fut.op_id = h, op.op_id
        return h

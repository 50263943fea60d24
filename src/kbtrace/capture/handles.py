"""Kernel-side values: ``TensorHandle`` (a tensor in TCM/scratch/HBM), completion and recv futures.

A handle is *real* when its values are known during capture (``tl.load`` of
memory not written by a pending op, ``tl.zeros``/``full``/``arange``, a recv of
a real payload) and *pending* otherwise (results of dot / math / composite and
anything derived from them). Real handles behave like numpy arrays for control
flow (``h.item()``, ``h[0, 1]``, ``float(h)``, ``h.data``); pending ones raise
``CaptureError`` naming the kernel, program, source line and producing op.

Real values are materialised lazily: a handle keeps a recipe (``_lazy``: read
of the capture-time memory image, a fill, or a copy of another handle) and
computes its storage bytes on first use. The tracer materialises every
outstanding memory-read recipe before it changes the memory image, so a value
is always the one the op saw at its position in capture order.

Operators ``+ - * /``, unary ``-`` and comparisons ``< <= > >=`` record math ops
through the active program context (a ``ContextVar``, never a global patch).
"""

from __future__ import annotations

import math
import os
import sys
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import numpy as np

from kbtrace.capture.dtypes import ITEMSIZE
from kbtrace.errors import CaptureError

if TYPE_CHECKING:
    from types import FrameType

    from kbtrace.capture.program import Program

__all__ = ["TensorHandle", "CompletionHandle", "RecvFuture", "ACTIVE", "active", "caller_line"]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))

#: The program whose kernel is running in the current greenlet (each greenlet has its own context).
ACTIVE: ContextVar[Program | None] = ContextVar("kbtrace_active_program", default=None)


def active() -> Program:
    prog = ACTIVE.get()
    if prog is None:
        raise CaptureError("tl.* called outside a kernel; call kernels through "
                           "Workload.launch(...) and kbtrace.capture.capture(...)")
    return prog


def caller_line() -> tuple[str | None, int | None]:
    """(basename, line) of the innermost frame outside kbtrace.capture: the kernel's call site."""
    f: FrameType | None = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    if f is None:
        return None, None
    return os.path.basename(f.f_code.co_filename), f.f_lineno


class TensorHandle:
    """A tensor value inside a kernel: shape, dtype, where it lives, who produced it."""

    __slots__ = ("shape", "dtype", "space", "addr", "op_id", "op_name", "op_line", "pending",
                 "_data", "_deps", "_stored", "_lazy", "__weakref__")
    __array_ufunc__ = None  # make numpy defer to our reflected operators

    def __init__(self, shape: tuple[int, ...], dtype: str, space: str, addr: int,
                 op_id: int | None, op_name: str, op_line: int | None, pending: bool,
                 data: np.ndarray | None = None, deps: tuple[int, ...] = ()) -> None:
        self.shape, self.dtype, self.space, self.addr = shape, dtype, space, addr
        self.op_id, self.op_name, self.op_line, self.pending = op_id, op_name, op_line, pending
        self._data = data
        self._deps = deps
        #: storage-dtype bytes of a real value, and the recipe that computes them on first use
        self._stored: np.ndarray | None = None
        self._lazy: tuple[Any, ...] | None = None

    @property
    def deps(self) -> tuple[int, ...]:
        """op_ids a consumer of this handle depends on (producer, or last writers for refs)."""
        return self._deps if self.op_id is None else (self.op_id,)

    # ----------------------------------------------------------------- values
    def stored(self) -> np.ndarray:
        """Storage-dtype values of a real handle (materialised from its recipe on first use)."""
        s = self._stored
        if s is None:
            lz = self._lazy
            if lz is None:
                raise CaptureError(f"internal: {self!r} has no value to materialise")
            kind = lz[0]
            if kind == 0:    # (0, memory image, address, element strides): a tl.load
                s = lz[1].read(lz[2], self.shape, self.dtype, lz[3])
            elif kind == 1:  # (1, name, scalars): tl.zeros / full / arange
                from kbtrace.capture.executor import fill_stored
                s = fill_stored(lz[1], self.shape, self.dtype, lz[2])
            else:            # (2, handle): a received payload
                s = lz[1].stored()
            self._stored = s
            self._lazy = None
        return s

    def _value(self) -> np.ndarray | None:
        d = self._data
        if d is None and not self.pending and (self._lazy is not None or self._stored is not None):
            from kbtrace.capture.dtypes import to_compute
            s = self.stored()
            d = to_compute(s, self.dtype)
            if d is s:  # keep the recorded bytes immutable; kernels may modify .data
                d = s.copy()
            self._data = d
        return d

    def _require(self, use: str) -> np.ndarray:
        v = None if self.pending else self._value()
        if v is None:
            prog = ACTIVE.get()
            f = sys._getframe(2)
            where = f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}"
            who = prog.describe() if prog is not None else "host code"
            what = ("a pending result" if self.pending else "a tensor that was not loaded "
                    "(tl.ref)")
            raise CaptureError(
                f"{who}, line {where}: {use} needs the value of {what} of op "
                f"{self.op_name!r} (op {self.op_id}, line {self.op_line}); compute results are "
                f"only known after capture, so branch on tl.load()ed data instead")
        return v

    @property
    def data(self) -> np.ndarray:
        """The real values (compute dtype). Raises CaptureError for pending handles."""
        return self._require("reading .data")

    def item(self) -> Any:
        return self._require("item()").item()

    def tolist(self) -> Any:
        return self._require("tolist()").tolist()

    def __bool__(self) -> bool:
        data = self._require("truth value (if/while/and/or)")
        if data.size != 1:
            raise CaptureError(f"truth value of a {self.shape} tensor is ambiguous; "
                               f"use h.data.any() or h.data.all()")
        return bool(data.reshape(()))

    def __float__(self) -> float:
        return float(self._require("float()").reshape(-1)[0])

    def __int__(self) -> int:
        return int(self._require("int()").reshape(-1)[0])

    def __index__(self) -> int:
        return int(self._require("use as an index").reshape(-1)[0])

    def __getitem__(self, idx: Any) -> Any:
        return self._require("indexing")[idx]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = self._require("numpy conversion")
        return data if dtype is None else data.astype(dtype)

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]

    def __repr__(self) -> str:
        real = self._data is not None or self._lazy is not None or self._stored is not None
        state = "pending" if self.pending else ("real" if real else "ref")
        return (f"TensorHandle(shape={self.shape}, dtype={self.dtype}, space={self.space}, "
                f"addr={self.addr:#x}, op={self.op_name}#{self.op_id}, {state})")

    # ----------------------------------------------------------------- ops
    def to(self, dtype: str) -> TensorHandle:
        return active().math("cast", [self], out_dtype=dtype)

    @property
    def T(self) -> TensorHandle:  # noqa: N802 - numpy spelling
        return active().math("trans", [self])

    def __add__(self, o: Any) -> TensorHandle:
        return active().math("add", [self, o])

    def __radd__(self, o: Any) -> TensorHandle:
        return active().math("add", [o, self])

    def __sub__(self, o: Any) -> TensorHandle:
        return active().math("sub", [self, o])

    def __rsub__(self, o: Any) -> TensorHandle:
        return active().math("sub", [o, self])

    def __mul__(self, o: Any) -> TensorHandle:
        return active().math("mul", [self, o])

    def __rmul__(self, o: Any) -> TensorHandle:
        return active().math("mul", [o, self])

    def __truediv__(self, o: Any) -> TensorHandle:
        return active().math("div", [self, o])

    def __rtruediv__(self, o: Any) -> TensorHandle:
        return active().math("div", [o, self])

    def __neg__(self) -> TensorHandle:
        return active().math("neg", [self])

    def __lt__(self, o: Any) -> TensorHandle:
        return active().math("lt", [self, o], out_dtype="bool")

    def __le__(self, o: Any) -> TensorHandle:
        return active().math("le", [self, o], out_dtype="bool")

    def __gt__(self, o: Any) -> TensorHandle:
        return active().math("gt", [self, o], out_dtype="bool")

    def __ge__(self, o: Any) -> TensorHandle:
        return active().math("ge", [self, o], out_dtype="bool")

    __hash__ = object.__hash__


class CompletionHandle:
    """Returned by ``tl.composite``; ``tl.wait(h)`` joins it."""

    __slots__ = ("op_id", "handle_id", "waited")

    def __init__(self, op_id: int, handle_id: int) -> None:
        self.op_id, self.handle_id, self.waited = op_id, handle_id, False

    def __repr__(self) -> str:
        return f"CompletionHandle(op={self.op_id}, handle={self.handle_id})"


class RecvFuture:
    """Returned by ``tl.recv_async``; ``tl.wait(f)`` returns the received TensorHandle."""

    __slots__ = ("direction", "shape", "dtype", "seq", "line", "handle_id", "result", "op_id")

    def __init__(self, direction: str, shape: tuple[int, ...] | None, dtype: str | None,
                 seq: int, line: int | None, handle_id: int) -> None:
        self.direction, self.shape, self.dtype = direction, shape, dtype
        self.seq, self.line, self.handle_id = seq, line, handle_id
        self.result: TensorHandle | None = None
        self.op_id: int | None = None

    def __repr__(self) -> str:
        return f"RecvFuture({self.direction}, done={self.result is not None})"

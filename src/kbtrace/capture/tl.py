"""The kernel API (layer 1 of 3): thin public ``tl.*`` functions, Triton-style.

A kernel is a plain function ``def kernel(tl, *args)`` (or ``tl`` last / keyword-only, the
predecessor's convention); ``tl`` is this module. Mixed dtypes promote, stores cast.
Each function normalises its arguments and forwards to the active program's
recorder (``program.Program``), found through a ``ContextVar`` that each
program greenlet sets for itself. Shapes are tuples of ints; dtypes are
``"f32" | "f16" | "bf16" | "i32" | "i8" | "bool"``; addresses are ints (51-bit
physical addresses of tensors, as passed by the host program).

Where am I (hardware ids and topology counts, no arguments needed)::

    tl.sip_id(), tl.cube_id(), tl.pe_id()          # this program's SIP (= rank), cube, PE
    tl.num_sips(), tl.num_cubes(), tl.num_pes()    # SIPs, cubes per SIP, PEs per cube

Memory (blocking, real values)::

    h = tl.load(ptr, (32, 64), "f32", strides=(K, 1))   # HBM/SRAM -> TCM, returns real data
    r = tl.ref(ptr, (K, N), "f32")                       # reference without a copy (composite)
    tl.store(ptr, h, strides=(N, 1))                     # TCM -> HBM (h may be pending)

Compute (deferred: returns pending handles)::

    c = tl.dot(a, b, acc)                  # (M,K) x (K,N) [+ acc], accumulates in acc dtype
    y = tl.exp(x); tl.maximum(a, b); tl.fma(a, b, c); tl.clamp(x, 0.0, 1.0)
    tl.where(cond, a, b); tl.softmax(x, axis=-1); tl.sum(x, axis=1)   # keeps axis as 1
    a + b, a - 1.0, 2.0 * a, a / b, -a, a < b, h.to("f16"), tl.trans(x)
    h = tl.composite(op="gemm", a=ra, b=rb, out_ptr=c_ptr,
                     epilogue=[{"op": "bias", "bias": rbias}, {"op": "relu"}])
    tl.wait(h)

IPCQ (by direction, matched by sender, receiver, direction and sequence; one rx
buffer of ``n_slots`` slots per direction, a send blocks while its buffer is full)::

    tl.send("intra_E", h); x = tl.recv("intra_W", (64,), "f32")
    tl.send("E", src_addr=ptr, shape=(64,), dtype="f16", space="hbm")
    tl.recv("W", (64,), "f16", dst_addr=ptr, space="hbm"); tl.recv_no_consume("W", (64,), "f16")
    f = tl.recv_async("intra_W"); x = tl.wait(f)
"""

from __future__ import annotations

from typing import Any

from kbtrace.capture.dtypes import itemsize
from kbtrace.capture.handles import ACTIVE, CompletionHandle, RecvFuture, TensorHandle, active
from kbtrace.errors import CaptureError

__all__ = [
    "program_id", "num_programs", "sip_id", "cube_id", "pe_id", "num_sips", "num_cubes",
    "num_pes", "load", "store", "ref", "dot", "composite",
    "exp", "log", "sqrt", "abs", "sigmoid", "cos", "sin", "maximum", "minimum", "fma", "clamp",
    "where", "softmax", "sum", "max", "min", "arange", "zeros", "full", "trans", "cdiv",
    "add", "sub", "mul", "div", "send", "recv", "recv_no_consume", "recv_async", "wait", "cycles", "sizeof",
    "TensorHandle", "CompletionHandle", "RecvFuture",
]

_builtin_abs, _builtin_max, _builtin_min, _builtin_sum = abs, max, min, sum
#: the active program, looked up inline (``_get() or active()``: active() raises outside a kernel)
_get = ACTIVE.get


# ---------------------------------------------------------------------- index
def program_id(axis: int = 0) -> int:
    """axis 0: PE index within the cube; axis 1: cube index (ADR-0022). On a sparse launch:
    axis 1 numbers the launch's (SIP, cube) pairs in order, axis 0 its PEs within each."""
    p = _get() or active()
    if axis not in (0, 1):
        raise p.fail(CaptureError, f"tl.program_id: axis must be 0 (PE) or 1 (cube), got {axis}")
    return p.pid0 if axis == 0 else p.pid1


def num_programs(axis: int = 0) -> int:
    """axis 0: programs per cube in this launch's grid; axis 1: cubes in the grid."""
    p = _get() or active()
    if axis not in (0, 1):
        raise p.fail(CaptureError, f"tl.num_programs: axis must be 0 or 1, got {axis}")
    return p.run.grid[axis]


def sip_id() -> int:
    """The SIP (= rank) this program runs on."""
    return (_get() or active()).sip


def cube_id() -> int:
    """The cube (within its SIP) this program runs on."""
    return (_get() or active()).cube


def pe_id() -> int:
    """The PE (within its cube) this program runs on."""
    return (_get() or active()).pe


def num_sips() -> int:
    """SIPs (= ranks, the world size) of the topology."""
    return (_get() or active()).tracer.topo.n_sips


def num_cubes() -> int:
    """Cubes per SIP of the topology."""
    return (_get() or active()).tracer.topo.cubes_per_sip


def num_pes() -> int:
    """PEs per cube of the topology."""
    return (_get() or active()).tracer.topo.pes_per_cube


def cdiv(a: int, b: int) -> int:
    """Ceiling division ``-(-a // b)``."""
    return -(-int(a) // int(b))


def sizeof(dtype: str) -> int:
    """Bytes per element of ``dtype`` (for pointer arithmetic)."""
    return itemsize(dtype)


# ---------------------------------------------------------------------- memory
def ref(ptr: int, shape: Any, dtype: str = "f16") -> TensorHandle:
    """Refer to memory without copying (operand of ``composite``); no op is recorded."""
    return (_get() or active()).ref(ptr, shape, dtype)


def load(ptr: int, shape: Any, dtype: str = "f16", strides: Any = None) -> TensorHandle:
    """DMA ``shape`` elements at ``ptr`` (element ``strides`` for a tile) into TCM; real values."""
    return (_get() or active()).load(ptr, shape, dtype, strides)


def store(ptr: int, value: TensorHandle, strides: Any = None) -> None:
    """DMA a TCM tensor to ``ptr`` (element ``strides`` for a tile of a larger tensor)."""
    (_get() or active()).store(ptr, value, strides)


# ---------------------------------------------------------------------- compute
def dot(a: TensorHandle, b: TensorHandle, acc: TensorHandle | None = None,
        acc_dtype: str | None = None, out_dtype: str | None = None) -> TensorHandle:
    """``a @ b (+ acc)`` on TCM operands, accumulated in and returned as ``out_dtype``
    (Triton's name; ``acc_dtype`` is the same; default ``acc``'s dtype, else f32 for
    f16/bf16, i32 for ints). Operands of different dtypes multiply in their common dtype."""
    if out_dtype is None:
        return (_get() or active()).dot(a, b, acc, acc_dtype)
    return (_get() or active()).dot(a, b, acc, acc_dtype, out_dtype)


def composite(op: str = "gemm", a: TensorHandle | None = None, b: TensorHandle | None = None,
              out_ptr: int | None = None, math_op: str | None = None,
              epilogue: list[dict[str, Any]] | None = None, acc_dtype: str | None = None,
              tile_shape: tuple[int, int, int] | None = None,
              out_dtype: str | None = None) -> CompletionHandle:
    """Tiled GEMM / math pipeline writing ``out_ptr``; async, join with ``tl.wait``.

    ``a``/``b`` from ``tl.load`` are pinned (already in TCM), from ``tl.ref`` streamed per tile.
    ``epilogue`` items: ``{"op": "bias"|"relu"|"scale"|"dequant"|"sigmoid"|"gelu"|"clamp",
    ...fields, "scope": "output_tile" (default) | "k_tile"}``.
    """
    return (_get() or active()).composite(op, a, b, out_ptr, math_op, epilogue, acc_dtype, tile_shape,
                              out_dtype)


def _unary(name: str, x: TensorHandle) -> TensorHandle:
    return (_get() or active()).math(name, [x])


def exp(x: TensorHandle) -> TensorHandle:
    return _unary("exp", x)


def log(x: TensorHandle) -> TensorHandle:
    return _unary("log", x)


def sqrt(x: TensorHandle) -> TensorHandle:
    return _unary("sqrt", x)


def abs(x: TensorHandle) -> TensorHandle:  # noqa: A001 - tl.abs mirrors triton.language
    return _unary("abs", x)


def sigmoid(x: TensorHandle) -> TensorHandle:
    return _unary("sigmoid", x)


def cos(x: TensorHandle) -> TensorHandle:
    return _unary("cos", x)


def sin(x: TensorHandle) -> TensorHandle:
    return _unary("sin", x)


def add(a: Any, b: Any) -> TensorHandle:
    return (_get() or active()).math("add", [a, b])


def sub(a: Any, b: Any) -> TensorHandle:
    return (_get() or active()).math("sub", [a, b])


def mul(a: Any, b: Any) -> TensorHandle:
    return (_get() or active()).math("mul", [a, b])


def div(a: Any, b: Any) -> TensorHandle:
    return (_get() or active()).math("div", [a, b])


def maximum(a: Any, b: Any) -> TensorHandle:
    return (_get() or active()).math("maximum", [a, b])


def minimum(a: Any, b: Any) -> TensorHandle:
    return (_get() or active()).math("minimum", [a, b])


def fma(a: Any, b: Any, c: Any) -> TensorHandle:
    """``a * b + c``."""
    return (_get() or active()).math("fma", [a, b, c])


def clamp(x: TensorHandle, lo: Any, hi: Any) -> TensorHandle:
    return (_get() or active()).math("clamp", [x, lo, hi])


def where(cond: TensorHandle, a: Any, b: Any) -> TensorHandle:
    """Elementwise ``a if cond else b`` (cond: a bool handle, e.g. ``x > 0``)."""
    return (_get() or active()).math("where", [cond, a, b])


def softmax(x: TensorHandle, axis: int = -1) -> TensorHandle:
    """``exp(x - max) / sum`` along ``axis`` (one op)."""
    return (_get() or active()).math("softmax", [x], axis=axis)


def sum(x: TensorHandle, axis: int | None = None) -> TensorHandle:  # noqa: A001
    """Sum along ``axis`` (kept with size 1; None = all axes)."""
    return (_get() or active()).math("sum", [x], axis=axis)


def max(x: TensorHandle, axis: int | None = None) -> TensorHandle:  # noqa: A001
    return (_get() or active()).math("max", [x], axis=axis)


def min(x: TensorHandle, axis: int | None = None) -> TensorHandle:  # noqa: A001
    return (_get() or active()).math("min", [x], axis=axis)


def trans(x: TensorHandle) -> TensorHandle:
    """Swap the last two dimensions (recorded as a math op: an explicit TCM copy)."""
    return (_get() or active()).math("trans", [x])


def arange(start: int, end: int, dtype: str = "i32") -> TensorHandle:
    return (_get() or active()).fill("arange", (int(end) - int(start),), dtype, [float(start), float(end)])


def zeros(shape: Any, dtype: str = "f16") -> TensorHandle:
    return (_get() or active()).fill("zeros", shape, dtype, [])


def full(shape: Any, value: float, dtype: str = "f16") -> TensorHandle:
    return (_get() or active()).fill("full", shape, dtype, [float(value)])


# ---------------------------------------------------------------------- IPCQ / control
def send(direction: str, src: TensorHandle | None = None, *, src_addr: int | None = None,
         nbytes: int | None = None, shape: Any = None, dtype: str = "f16",
         space: str = "tcm") -> None:
    """Send to the neighbour in ``direction``: a TCM handle ``src`` (may be pending), or the
    raw-address form ``src_addr=ptr, shape=(...) | nbytes=N, dtype=, space="hbm"|"sram"|"tcm"``
    (the DMA reads memory directly). Blocks while the direction's rx buffer lacks free slots."""
    (_get() or active()).send(direction, src, src_addr, nbytes, shape, dtype, space)


def recv(direction: str, shape: Any = None, dtype: str | None = None, *,
         dst_addr: int | None = None, space: str | None = None) -> TensorHandle:
    """Block until the neighbour in ``direction`` sent; returns the payload in a fresh TCM
    buffer, or with ``dst_addr=`` (and ``space=`` "tcm"|"hbm"|"sram") copies it there."""
    return (_get() or active()).recv(direction, shape, dtype, dst_addr, space)


def recv_no_consume(direction: str, shape: Any = None, dtype: str | None = None) -> TensorHandle:
    """DIAGNOSTIC ONLY (ADR-0046 D3): ``tl.recv`` whose slot read costs nothing in replay
    (to compare IPCQ with a one-sided DMA store); not for production kernels."""
    return (_get() or active()).recv(direction, shape, dtype, None, None, consume=False)


def recv_async(direction: str, shape: Any = None, dtype: str | None = None) -> RecvFuture:
    """Non-blocking receive; ``tl.wait(future)`` returns the TensorHandle."""
    return (_get() or active()).recv_async(direction, shape, dtype)


def wait(handle: CompletionHandle | RecvFuture | None = None) -> Any:
    """Join a composite / recv_async (None: every outstanding composite of this program)."""
    return (_get() or active()).wait(handle)


def cycles(n: int) -> None:
    """Declare ``n`` PE_CPU cycles of scalar work."""
    (_get() or active()).cycles(n)

"""The numpy data executor: the single definition of what every captured op computes.

``execute(ops, memory, order)`` rebuilds the memory image from ``memory.parquet``
(every row except role ``reference``), runs the ops of ``ops.parquet`` in the
given op_id order (default: op_id order = capture order) and returns the
declared outputs gathered from their shards plus a 64-bit digest of each op's
result bytes. Capture runs the same ``Machine`` over its recorded ops in
capture order as the op log drains (``tl.load`` values during capture come
from a capture-time image holding the same bytes) and stores each digest in
``ops.out_digest``; ``kbtrace verify`` replays in timed order and
names the first op whose digest differs.

Semantics (all computed in the dtype's compute type, rounded on write, see
``dtypes``): load/store copy bytes (``mem_strides`` = element strides of the
memory-side view); fill writes zeros/full/arange; math ops are numpy ufuncs
with broadcasting; reductions keep the reduced axis (size 1); softmax is
``exp(x - max) / sum``; dot accumulates in ``acc_dtype``; composite gemm sums
K tiles of ``tile_shape[1]`` in ``acc_dtype`` applying ``k_tile`` epilogues to
each partial product and ``output_tile`` epilogues to the result; send
snapshots its payload, the matching recv (``match_op_id``) writes it.
"""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from kbtrace import schema
from kbtrace._io import column_pylist
from kbtrace.capture.dtypes import COMPUTE, STORAGE, digest, from_bytes, to_compute, to_storage
from kbtrace.capture.image import MemoryImage
from kbtrace.errors import VerifyError

__all__ = ["Op", "ExecOp", "EXEC_FIELDS", "exec_ops_from_table", "Machine", "ExecResult",
           "execute", "ops_from_table", "op_columns", "load_memory", "fill_stored",
           "gather_outputs", "reference_outputs",
           "matmul", "EPILOGUE_OPS", "UNARY", "BINARY"]

OP_FIELDS: tuple[str, ...] = tuple(schema.OPS.names)
_LIST_FIELDS = {f.name for f in schema.OPS if pa.types.is_list(f.type)}


class Op:
    """One ops.parquet row as an object (attribute per schema column).

    Unset columns read as the class-level defaults (None, or an empty tuple for list
    columns); ``Op(**fields)`` stores only what is given, which keeps recording cheap.
    """

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def values(self) -> list[Any]:
        return [getattr(self, n) for n in OP_FIELDS]

    if TYPE_CHECKING:       # for the type checker: one attribute per schema column
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...


for _name in OP_FIELDS:
    setattr(Op, _name, () if _name in _LIST_FIELDS else None)

#: the columns ``Machine`` reads from an op (``out_digest``: what verify compares with)
EXEC_FIELDS: frozenset[str] = frozenset((
    "op_id", "kind", "name", "src_addr", "dst_addr", "in_addrs", "in_shapes", "in_dtypes",
    "scalars", "out_shape", "out_dtype", "acc_dtype", "m", "n", "k", "axis", "match_op_id",
    "extra_json", "mem_strides", "out_digest"))


#: ``ExecOp``: a row of ``EXEC_FIELDS`` as a named tuple (verify builds its ops so: half
#: the columns to convert, and no per-op ``__dict__``). Reading any other column raises
#: AttributeError, so an executor that starts reading a column missing from
#: ``EXEC_FIELDS`` fails loudly instead of seeing a default.
_EXEC_ORDER = tuple(n for n in OP_FIELDS if n in EXEC_FIELDS)
ExecOp = namedtuple("ExecOp", _EXEC_ORDER,  # type: ignore[misc]
                    defaults=[() if n in _LIST_FIELDS else None  # type: ignore[misc]
                              for n in _EXEC_ORDER])
#: ``ExecOp._make`` without its Python frame (``zip(..., strict=True)`` checks the length)
_new_exec_op = partial(tuple.__new__, ExecOp)


def exec_ops_from_table(ops: pa.Table, columns: Sequence[str]) -> list[Any]:
    """One ``ExecOp`` per row; ``columns``: those to read (the others are left to the
    defaults, as ``ops_from_table`` leaves them: ``op_columns`` of the whole table)."""
    cols: list[Any] = []
    for name in _EXEC_ORDER:
        if name in columns:
            cols.append(column_pylist(ops.column(name)))
        else:
            cols.append(repeat(() if name in _LIST_FIELDS else None, ops.num_rows))
    return list(map(_new_exec_op, zip(*cols, strict=True)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x: np.ndarray) -> np.ndarray:
    c = np.asarray(0.7978845608028654, dtype=x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.asarray(0.044715, dtype=x.dtype) * x * x * x)))


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs, "sigmoid": _sigmoid,
    "cos": np.cos, "sin": np.sin, "neg": np.negative, "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu,
}
BINARY: dict[str, Callable[[Any, Any], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}
_REDUCE: dict[str, Callable[..., Any]] = {"sum": np.sum, "max": np.max, "min": np.min}

#: epilogue op -> required fields (tensor-valued fields are operand indices after capture)
EPILOGUE_OPS: dict[str, tuple[str, ...]] = {
    "bias": ("bias",), "relu": (), "scale": ("factor",), "dequant": ("scale",),
    "sigmoid": (), "gelu": (), "clamp": ("min", "max"),
}


def _math(name: str, args: list[Any], axis: int | None, out_dtype: str) -> np.ndarray:
    if name in UNARY:
        return UNARY[name](args[0])
    if name == "div" and out_dtype in ("i32", "i8"):
        return np.trunc(np.true_divide(args[0], args[1]))
    if name in BINARY:
        return BINARY[name](args[0], args[1])
    if name in _REDUCE:
        return _REDUCE[name](args[0], axis=axis, keepdims=True)
    if name == "softmax":
        x = args[0]
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)
    if name == "fma":
        return args[0] * args[1] + args[2]
    if name == "clamp":
        return np.minimum(np.maximum(args[0], args[1]), args[2])
    if name == "where":
        return np.where(np.asarray(args[0]).astype(bool), args[1], args[2])
    if name == "trans":
        return np.swapaxes(args[0], -1, -2)
    if name == "cast":
        return args[0]
    raise VerifyError(f"executor: unknown math op {name!r}; re-capture with this kbtrace")


def _apply_epilogue(x: np.ndarray, spec: dict[str, Any], operands: list[np.ndarray],
                    k_tile: int) -> np.ndarray:
    def val(key: str) -> Any:
        v = spec[key]
        if isinstance(v, dict):
            arr = operands[v["operand"]].astype(x.dtype, copy=False)
            if spec.get("scope") == "k_tile" and arr.ndim == 1 and arr.shape[0] != x.shape[-1]:
                return arr[k_tile]
            return arr
        return np.asarray(v, dtype=x.dtype)
    op = spec["op"]
    if op == "bias":
        return x + val("bias")
    if op in ("scale",):
        return x * val("factor")
    if op == "dequant":
        return x * val("scale")
    if op == "clamp":
        return np.minimum(np.maximum(x, val("min")), val("max"))
    return UNARY[op](x)


@dataclass
class ExecResult:
    """What ``execute`` produced: declared outputs (compute dtype) and per-op result digests."""
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    digests: dict[int, int] = field(default_factory=dict)


_EXACT_F32 = 1 << 24
_EXACT_F64 = 1 << 53
_I32 = 1 << 31
_INT32 = np.dtype(np.int32)
_dot = np.dot


def absmax(x: np.ndarray) -> int:
    """``max|x|`` of an integer array as a Python int (``np.abs`` of the most negative int
    wraps); 0 when empty."""
    return max(-int(x.min()), int(x.max())) if x.size else 0


def _entry_absmax(e: list[Any]) -> int:
    """``absmax`` of a cache entry's compute value (slot 2, filled), kept as a fourth slot:
    a tile read by many dots (a gemm's A and B tiles) is scanned once."""
    if len(e) > 3:
        return int(e[3])
    m = absmax(e[2])
    e.append(m)
    return m


def matmul(a: np.ndarray, b: np.ndarray, am: int | None = None,
           bm: int | None = None) -> np.ndarray:
    """``a @ b`` in ``a``'s dtype. Integer operands go through BLAS in float64 when no sum
    can leave float64's exact integers (``k * max|a| * max|b| < 2**53``: every partial sum is
    then exact, in any order), in float32 below 2**24 (exact there too: a (32, 64) @ (64, 32)
    tile ~1.3 us faster, ~0.4 CPU s of verify at 1.0 M gemm ops), and come back through
    int64 (straight to int32 when every sum fits in it), so an int32 result wraps as
    numpy's int32 matmul does; numpy's own integer
    matmul has no BLAS and was most of a gemm capture's golden execution. Otherwise, and
    for floats, plain ``a @ b``. ``am`` / ``bm``: ``absmax`` of ``a`` / ``b`` when known."""
    if a.dtype.kind in "iu" and a.size and b.size:
        if am is None:
            am = absmax(a)
        if bm is None:
            bm = absmax(b)
        bound = am * bm * a.shape[-1]
        if bound < _EXACT_F64:
            f = np.float32 if bound < _EXACT_F32 else np.float64
            # (``np.dot`` of 2-d operands: the same BLAS call without the matmul ufunc's
            # set-up; exact integers in any summation order, so the same values)
            p = (_dot(a.astype(f), b.astype(f)) if a.ndim == 2 == b.ndim
                 else a.astype(f) @ b.astype(f))
            if bound < _I32 and a.dtype == _INT32:   # (every sum an int32: no wrap)
                return p.astype(_INT32)
            return p.astype(np.int64).astype(a.dtype)
    return a @ b


class Machine:
    """Executes ops one at a time against a memory image; ``step`` returns (result, digest).

    Results travel as ``[stored, digest, compute]`` entries of the memory image's read
    cache (``MemoryImage.cached_read`` / ``remember``): a tile that is still resident is
    neither re-read nor re-converted, and bytes that were already hashed (a load of a tile
    loaded before, a store of a dot's result) reuse their digest. Stored arrays are
    read-only; nothing here modifies an operand in place.
    """

    __slots__ = ("mem", "_inflight", "_dispatch", "_fills")

    def __init__(self, mem: MemoryImage | None = None) -> None:
        self.mem = mem if mem is not None else MemoryImage()
        self._inflight: dict[int, list[Any]] = {}
        self._fills: dict[tuple[Any, ...], list[Any]] = {}
        self._dispatch: dict[str, Callable[[Op], list[Any] | None]] = {
            "load": self._load, "store": self._store, "fill": self._fill, "math": self._math_op,
            "dot": self._dot, "composite": self._composite, "send": self._send, "recv": self._recv,
            "wait": _none, "cycles": _none, "h2d": self._load, "d2h": self._store,
        }

    def clear(self) -> None:
        """Drop the messages in flight and the shared fill results (the image is the
        caller's: ``MemoryImage.clear``)."""
        self._inflight.clear()
        self._fills.clear()

    def step(self, op: Op) -> tuple[np.ndarray | None, int | None]:
        with np.errstate(all="ignore"):
            entry = self._dispatch[op.kind](op)
        if entry is None:
            return None, None
        dig = entry[1]
        if dig is None:
            dig = entry[1] = digest(entry[0])
        return entry[0], dig

    def digest_of(self, op: Op) -> int | None:
        """``step(op)[1]`` without ``step``'s own ``np.errstate``, for a caller that holds
        ``np.errstate(all="ignore")`` around many ops (verify; it cost ~0.7 us per op)."""
        entry = self._dispatch[op.kind](op)
        if entry is None:
            return None
        dig = entry[1]
        if dig is None:
            dig = entry[1] = digest(entry[0])
        return dig

    def run(self, ops: Sequence[Op], skip: frozenset[str] = frozenset()) -> list[int | None]:
        """``step`` each op in order (kinds in ``skip`` are not executed: digest None)."""
        dispatch = self._dispatch
        out: list[int | None] = []
        append = out.append
        with np.errstate(all="ignore"):
            for op in ops:
                kind = op.kind
                entry = None if kind in skip else dispatch[kind](op)
                if entry is None:
                    append(None)
                    continue
                dig = entry[1]
                if dig is None:
                    dig = entry[1] = digest(entry[0])
                append(dig)
        return out

    def _operand(self, op: Op, i: int) -> np.ndarray:
        c: np.ndarray = self._operand_entry(op, i)[2]
        return c

    def _operand_entry(self, op: Op, i: int) -> list[Any]:
        """The cache entry of operand ``i``, its compute value (slot 2) filled."""
        dt = op.in_dtypes[i]
        e = self.mem.cached_read(op.in_addrs[i], op.in_shapes[i], dt)
        if e[2] is None:
            self._fill_compute(e, dt)
        return e

    @staticmethod
    def _fill_compute(e: list[Any], dt: str) -> None:
        """A cache entry's compute value (slot 2), read-only, from its stored array."""
        c = e[2] = to_compute(e[0], dt)
        c.flags.writeable = False

    def _write_result(self, op: Op, values: np.ndarray) -> list[Any]:
        shape, dt = tuple(op.out_shape), op.out_dtype
        if (values.__class__ is np.ndarray and values.shape == shape
                and values.dtype == STORAGE[dt] and dt != "bf16" and values.flags.c_contiguous):
            stored = values  # already the storage bytes (what to_storage would return)
        else:
            stored = to_storage(np.broadcast_to(values, shape), dt)
        e = [stored, None, None]
        self.mem.write_entry(op.dst_addr, op.out_dtype, e)
        return e

    def _load(self, op: Op) -> list[Any]:
        mem = self.mem
        e = mem.cached_read(op.src_addr, op.out_shape, op.out_dtype, op.mem_strides or None)
        mem.write_entry(op.dst_addr, op.out_dtype, e)
        return e

    def _store(self, op: Op) -> list[Any]:
        mem = self.mem
        e = mem.cached_read(op.src_addr, op.out_shape, op.out_dtype)
        mem.write(op.dst_addr, e[0], op.mem_strides or None)
        if not op.mem_strides:
            mem.remember(op.dst_addr, op.out_dtype, e)
        return e

    def _fill(self, op: Op) -> list[Any]:
        e = self.fill_entry(op.name, op.out_shape, op.out_dtype, op.scalars)
        self.mem.write_entry(op.dst_addr, op.out_dtype, e)
        return e

    def fill_entry(self, name: str, shape: Sequence[int], dtype: str,
                   scalars: Sequence[float]) -> list[Any]:
        """The ``[stored, digest, compute]`` entry of a fill op (shared by identical fills)."""
        key = (name, tuple(shape), dtype, tuple(scalars))
        e = self._fills.get(key)
        if e is None:
            if len(self._fills) >= 1024:
                self._fills.clear()
            e = self._fills[key] = [fill_stored(name, shape, dtype, scalars), None, None]
        return e

    def _args(self, op: Op) -> list[Any]:
        handles = [self._operand(op, i) for i in range(len(op.in_addrs))]
        extra = json.loads(op.extra_json) if op.extra_json else {}
        promoted = extra.get("promote")
        if promoted is not None:    # mixed operand dtypes: every operand in the common type
            cdt = COMPUTE[promoted]
            handles = [h.astype(cdt, copy=False) for h in handles]
        else:
            cdt = to_compute(np.zeros(0, STORAGE[op.out_dtype]), op.out_dtype).dtype
        scalars = [np.asarray(s, dtype=cdt if cdt.kind != "b" else np.float32) for s in op.scalars]
        pattern = extra.get("args")
        if not pattern:
            return handles + scalars
        hi, si = iter(handles), iter(scalars)
        return [next(hi) if c == "h" else next(si) for c in pattern]

    def _math_op(self, op: Op) -> list[Any]:
        return self._write_result(op, _math(op.name, self._args(op), op.axis, op.out_dtype))

    def _dot(self, op: Op) -> list[Any]:
        acc_np = COMPUTE[op.acc_dtype]
        # (``_operand_entry`` of each operand, inline: ~1/3 of the ops of a gemm are dots)
        addrs, shapes, dts = op.in_addrs, op.in_shapes, op.in_dtypes
        read = self.mem.cached_read
        ea = read(addrs[0], shapes[0], dts[0])
        if ea[2] is None:
            self._fill_compute(ea, dts[0])
        eb = read(addrs[1], shapes[1], dts[1])
        if eb[2] is None:
            self._fill_compute(eb, dts[1])
        a, b = ea[2], eb[2]
        if a.dtype == acc_np and b.dtype == acc_np:
            if acc_np.kind in "iu":         # (values as cached: their max|x| kept there)
                out = matmul(a, b, _entry_absmax(ea), _entry_absmax(eb))
            else:
                out = matmul(a, b)
        else:
            out = matmul(a.astype(acc_np), b.astype(acc_np))
        if len(addrs) > 2:
            ec = read(addrs[2], shapes[2], dts[2])
            if ec[2] is None:
                self._fill_compute(ec, dts[2])
            c = ec[2]
            if c.dtype != acc_np:
                c = c.astype(acc_np)
            if out.shape == c.shape and out.dtype == acc_np:
                out += c            # (``matmul``'s result is a new array: added in place)
            else:
                out = out + c
        return self._write_result(op, out)

    def _composite(self, op: Op) -> list[Any]:
        extra = json.loads(op.extra_json or "{}")
        operands = [self._operand(op, i) for i in range(len(op.in_addrs))]
        epi = extra.get("epilogue", [])
        if op.name == "gemm":
            acc_np = to_compute(np.zeros(0, STORAGE[op.acc_dtype]), op.acc_dtype).dtype
            a, b = operands[0].astype(acc_np), operands[1].astype(acc_np)
            tk = int(extra["tile_shape"][1])
            acc = np.zeros((op.m, op.n), dtype=acc_np)
            for kt, k0 in enumerate(range(0, max(op.k, 1), tk)):
                part = matmul(a[:, k0:k0 + tk], b[k0:k0 + tk, :])
                for spec in epi:
                    if spec["scope"] == "k_tile":
                        part = _apply_epilogue(part, spec, operands, kt)
                acc += part
            out = acc
        else:
            out = UNARY[extra["math_op"]](operands[0])
        for spec in epi:
            if spec["scope"] == "output_tile":
                out = _apply_epilogue(out, spec, operands, 0)
        return self._write_result(op, out)

    def _send(self, op: Op) -> list[Any]:
        e = self.mem.cached_read(op.src_addr, op.out_shape, op.out_dtype)
        self._inflight[op.op_id] = e
        return e

    def _recv(self, op: Op) -> list[Any]:
        e = self._inflight.pop(op.match_op_id, None)
        if e is None:
            raise VerifyError(f"executor: recv op {op.op_id} ran before its send op "
                              f"{op.match_op_id}; the execution order must respect ops.deps")
        self.mem.write_entry(op.dst_addr, op.out_dtype, e)
        return e


def fill_stored(name: str, shape: Sequence[int], dtype: str, scalars: Sequence[float]) -> np.ndarray:
    """Storage bytes of a fill op (``zeros`` / ``full`` / ``arange``); capture's real values too."""
    vals: np.ndarray
    if name == "arange":
        vals = np.arange(int(scalars[0]), int(scalars[1]))
    elif name == "zeros":
        vals = np.zeros(shape)
    else:
        vals = np.full(shape, scalars[0])
    return to_storage(np.broadcast_to(vals, tuple(shape)), dtype)


def _none(op: Op) -> None:
    return None


def op_columns(ops: pa.Table) -> list[str]:
    """The columns ``ops_from_table`` sets on its ops: those holding some value other than
    the class default (not all null; for a list column, not all null or empty), decided
    over the whole table with Arrow compute (no per-row Python)."""
    import pyarrow.compute as pc

    names = []
    for name in OP_FIELDS:
        if name not in ops.column_names:
            continue
        col = ops.column(name)
        if col.null_count == len(col):
            continue
        if name in _LIST_FIELDS and not pc.max(pc.list_value_length(col)).as_py():
            continue
        names.append(name)
    return names


def ops_from_table(ops: pa.Table, columns: list[str] | None = None) -> list[Op]:
    """One ``Op`` per row. Columns that hold only defaults (all null; lists all empty) are
    left to the class defaults, as when capture records an op: ~20 of the 44 on a GEMM
    trace, so each op's ``__dict__`` is about half the size. ``columns``: the columns to
    set (``op_columns`` of the whole table, when ``ops`` is one slice of it: verify builds
    its ops a batch at a time)."""
    names = op_columns(ops) if columns is None else columns
    cols = [column_pylist(ops.column(n)) for n in names]
    new = Op.__new__
    out = []
    for vals in zip(*cols, strict=True):
        op = new(Op)
        op.__dict__.update(zip(names, vals, strict=True))
        out.append(op)
    return out


def _rows(memory: pa.Table) -> Iterator[tuple[dict[str, Any], Any]]:
    """(row without ``data``, a zero-copy buffer of its data, None if null) per memory-table
    row: a slice of the column's data buffer, by its offsets (``to_pylist`` of the whole
    table copied every tensor, 256 MiB for all_gather's output and reference on
    default.yaml; a row's scalar, ``data[i].as_buffer()``, copied its tensor too: 40.5 MiB
    per input of a 1.0 M-op gemm)."""
    rows = iter(_meta(memory).to_pylist())
    for chunk in memory.column("data").chunks:
        _, offsets, buf = chunk.buffers()
        wide = pa.types.is_large_binary(chunk.type)
        at = np.frombuffer(offsets, np.int64 if wide else np.int32)[chunk.offset:]
        for i, valid in enumerate(chunk.is_valid().to_pylist()):
            yield next(rows), (buf.slice(int(at[i]), int(at[i + 1] - at[i])) if valid else None)


def _meta(memory: pa.Table) -> pa.Table:
    """The memory table without its ``data`` column (if it has one): nothing copied."""
    return memory.select([c for c in memory.column_names if c != "data"])


def load_memory(memory: pa.Table, mem: MemoryImage) -> None:
    """Write every non-reference row of a memory table into ``mem``."""
    for row, buf in _rows(memory):
        if row["role"] == "reference" or row["addr"] is None:
            continue
        arr = np.frombuffer(buf, dtype=STORAGE[row["dtype"]]).reshape(row["shape"])
        mem.write(row["addr"], arr)


def gather_outputs(memory: pa.Table, mem: MemoryImage) -> dict[str, np.ndarray]:
    """Assemble every role=output tensor from its shards (compute dtype values)."""
    outs: dict[str, np.ndarray] = {}
    for row in _meta(memory).to_pylist():
        if row["role"] != "output":
            continue
        dt = row["dtype"]
        full = outs.get(row["tensor"])
        if full is None:
            full = outs[row["tensor"]] = np.zeros(row["global_shape"], dtype=to_compute(
                np.zeros(0, STORAGE[dt]), dt).dtype)
        vals = to_compute(mem.read(row["addr"], row["shape"], dt), dt)
        idx = tuple(slice(o, o + s) for o, s in zip(row["offset"], row["shape"], strict=True))
        full[idx] = vals
    return outs


def execute(ops: pa.Table, memory: pa.Table, order: Sequence[int] | None = None) -> ExecResult:
    """Recompute a trace from its tables; ``order`` = op_ids in execution order (default op_id)."""
    rows = ops_from_table(ops)
    by_id = {op.op_id: op for op in rows}
    machine = Machine()
    load_memory(memory, machine.mem)
    result = ExecResult()
    seq = sorted(by_id) if order is None else order
    for op_id in seq:
        _, dig = machine.step(by_id[op_id])
        if dig is not None:
            result.digests[op_id] = dig
    result.outputs = gather_outputs(memory, machine.mem)
    return result


def reference_outputs(memory: pa.Table) -> dict[str, np.ndarray]:
    """The numpy references stored in a memory table (role=reference, one row or blocks along
    axis 0), compute dtype."""
    outs: dict[str, np.ndarray] = {}
    for row, buf in _rows(memory):
        if row["role"] != "reference":
            continue
        shape, full_shape = tuple(row["shape"]), tuple(row["global_shape"])
        vals = from_bytes(buf, row["dtype"], shape)
        if shape == full_shape:        # the whole reference in one row
            outs[row["tensor"]] = vals
            continue
        full = outs.get(row["tensor"])
        if full is None:
            full = outs[row["tensor"]] = np.zeros(full_shape, vals.dtype)
        full[tuple(slice(o, o + n) for o, n in zip(row["offset"], shape, strict=True))] = vals
    return outs

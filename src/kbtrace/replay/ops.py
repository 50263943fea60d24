"""Trace ops as replay records, and the command each op becomes on its PE.

``load_ops(table)`` turns the ``ops`` Arrow table into ``Op`` records (one
object with ``__slots__`` per op). ``plan_for(op, params)`` maps a record to
a tile plan from the pure generator (``plans``). A simple command expands to
exactly one engine sub-command (ADR-0014 D3.1): load / store one DMA stage,
math one MATH stage, dot one GEMM stage over the whole ``m x n x k`` (operands
outside TCM are read by DMA first). Composite gemm is the M -> N -> K GEMM
tile pipeline, composite math the M -> N math pipeline, both with FETCH and
STORE (D3.2). Operands already in TCM are pinned (no DMA_READ); results left
in TCM have no DMA_WRITE. Metadata-only calls (``is_metadata``: fills from
``tl.zeros`` / ``full`` / ``arange``, and ``tl.trans``) are no command at all
(ADR-0046 D3, D6): they complete when issued, with no dispatch cost.
"""

from __future__ import annotations

import json
from functools import lru_cache
from math import prod
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from kbtrace._io import column_pylist
from kbtrace.replay import plans as P
from kbtrace.topology.params import TopologyParams

__all__ = ["Op", "load_ops", "plan_for", "is_metadata", "DTYPE_BYTES", "TRANSCENDENTAL",
           "HOST_KINDS", "METADATA_KINDS"]

DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i8": 1, "bool": 1}
TRANSCENDENTAL = frozenset({"exp", "log", "sqrt", "rsqrt", "sin", "cos", "sigmoid", "tanh",
                            "softmax", "gelu", "silu", "erf", "pow", "div"})
HOST_KINDS = frozenset({"h2d", "d2h"})
METADATA_KINDS = frozenset({"fill", "math"})    # the kinds ``is_metadata`` can be true of

_FIELDS = ("op_id", "launch", "program", "sip", "cube", "pe", "seq", "kind", "name", "is_async",
           "src_space", "src_addr", "dst_space", "dst_addr", "nbytes", "in_addrs", "in_spaces",
           "in_shapes", "in_dtypes", "out_shape", "out_dtype", "m", "n", "k", "direction",
           "peer_program", "peer_sip", "peer_cube", "peer_pe", "ipcq_seq", "match_op_id", "deps",
           "cycles", "extra_json")


class Op:
    """One op of the trace: its ``_FIELDS``, and ``tpl``: the id of the template its
    ``TEMPLATE`` fields came from (``build_ops``; ops with equal ids have equal ``TEMPLATE``
    fields, so a memo keyed by it need not hash them: ``OpCore.plan``), -1 if none."""
    __slots__ = (*_FIELDS, "tpl")

    def __init__(self, values: tuple[Any, ...]) -> None:
        _assign(self, values)
        self.tpl = -1

    if TYPE_CHECKING:       # for the type checker: one attribute per field of _FIELDS
        def __getattr__(self, name: str) -> Any: ...


def _make_assign():
    # one unpacking assignment instead of a setattr loop (load_ops builds one Op per row)
    src = f"def _assign(self, v):\n    {', '.join('self.' + f for f in _FIELDS)}, = v\n"
    ns: dict[str, Any] = {}
    exec(src, ns)  # noqa: S102 - generated from the fixed field list above
    return ns["_assign"]


_assign = _make_assign()

#: the fields that repeat from op to op (a kernel's few kinds of call), and the rest: replay's
#: spill holds a template id per op and its varying fields (``spillcode``), and ``build_ops``
#: makes the records from the two
TEMPLATE = ("kind", "name", "is_async", "src_space", "dst_space", "in_spaces", "in_shapes",
            "in_dtypes", "out_shape", "out_dtype", "m", "n", "k", "direction", "extra_json")
VARYING = tuple(f for f in _FIELDS if f not in TEMPLATE)


def _make_build():
    # one loop for a batch: no Op() call, a template's values set by one unpacking
    vs = ", ".join("v_" + f for f in VARYING)
    src = (f"def build_ops(templates, ids, {', '.join(VARYING)}):\n"
           "    out = []\n    add = out.append\n    new = object.__new__\n"
           f"    for t, {vs} in zip(ids, {', '.join(VARYING)}, strict=True):\n"
           "        o = new(Op)\n"
           f"        {', '.join('o.' + f for f in TEMPLATE)}, = templates[t]\n"
           "        o.tpl = t\n"
           + "".join(f"        o.{f} = v_{f}\n" for f in VARYING) +
           "        add(o)\n    return out\n")
    ns: dict[str, Any] = {"Op": Op}
    exec(src, ns)  # noqa: S102 - generated from the fixed field lists above
    return ns["build_ops"]


#: ``build_ops(templates, ids, *varying_columns)``: one ``Op`` per row, its ``TEMPLATE``
#: fields ``templates[ids[i]]``, its ``VARYING`` fields the columns' values (in that order)
build_ops = _make_build()


# list columns become tuples; these repeat from op to op (a kernel's shapes, dtypes and
# memory spaces), so equal values share one tuple
_SHARED = frozenset({"in_spaces", "in_shapes", "in_dtypes", "out_shape"})
_LISTS = _SHARED | {"in_addrs", "deps"}
COLUMNS = _FIELDS   # the ops.parquet columns replay reads


def _tuples(values: list[Any], memo: dict[tuple[Any, ...], tuple[Any, ...]] | None,
            nested: bool) -> list[Any]:
    """List values as tuples (``nested``: lists of lists, inner ones too; empty or null ->
    ``()``), equal ones one shared tuple if given a ``memo`` (kept across batches). A replay
    holds every op for the whole run: on gemm this takes the op records from ~1.0 to ~0.5 KiB
    each."""
    if nested:
        out = [tuple([tuple(x) if type(x) is list else x for x in v]) if v else ()
               for v in values]
    else:
        out = [tuple(v) if v else () for v in values]
    if memo is not None:
        out = [memo.setdefault(t, t) for t in out]
    return out


#: rows converted to ``Op`` records at a time: the per-column Python lists of one batch are
#: the only transient objects (converting whole columns of a million-op trace at once made
#: ~35 M short-lived values, and the memory they fragmented stayed with the process)
LOAD_BATCH = 1 << 16


def load_ops(table: pa.Table) -> list[Op]:
    """One ``Op`` per row, indexed by ``op_id`` (which the trace keeps dense from 0).
    List fields are tuples (see ``_tuples``); rows are converted ``LOAD_BATCH`` at a time."""
    memos: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]] = {f: {} for f in _SHARED}
    ops: list[Op] = []
    for at in range(0, table.num_rows, LOAD_BATCH):
        part = table.slice(at, LOAD_BATCH)
        cols = []
        for f in _FIELDS:
            vals = column_pylist(part.column(f))
            cols.append(_tuples(vals, memos.get(f), f == "in_shapes") if f in _LISTS else vals)
        ops.extend([Op(v) for v in zip(*cols, strict=True)])
        del cols
    ops.sort(key=lambda o: o.op_id)
    return ops


def _cycles_per_elem(name: str, p: TopologyParams) -> int:
    return p.pe.math.transcendental_cycles if name in TRANSCENDENTAL else 1


def _bytes(dt: str | None) -> int:
    return DTYPE_BYTES.get(dt or "f32", 4)


def _external(space: str | None, addr: int | None) -> int | None:
    """The address of an operand the plan must DMA, None if it is already in TCM."""
    return None if space in (None, "tcm") or addr is None else int(addr)


@lru_cache(maxsize=4096)
def _extra(text: str | None) -> dict[str, Any]:
    """``extra_json`` parsed once per distinct string (ops of one kernel repeat it)."""
    return json.loads(text) if text else {}


def is_metadata(op: Op) -> bool:
    """True for a call the predecessor issues no command for (ADR-0046 D3): ``fill``
    (``tl.zeros`` / ``full`` / ``arange``) and ``tl.trans``. Capture still records them, so
    verify can execute them; replay completes them when issued, at no cost."""
    kind = op.kind
    return kind == "fill" or (kind == "math" and op.name == "trans")


def plan_for(op: Op, p: TopologyParams) -> P.Plan:
    kind = op.kind
    tile = p.pe.tile
    if kind == "load":
        return P.single_stage_plan(P.Stage(P.DMA_READ, int(op.src_addr or 0), int(op.nbytes)))
    if kind == "store":
        return P.single_stage_plan(P.Stage(P.DMA_WRITE, int(op.dst_addr or 0), int(op.nbytes)))
    if is_metadata(op):
        return ()
    if kind == "math":
        elems = prod(op.out_shape or [1])
        stages = [P.Stage(P.DMA_READ, a, prod(s or [1]) * _bytes(d))
                  for a, sp, s, d in zip(op.in_addrs or [], op.in_spaces or [], op.in_shapes or [],
                                         op.in_dtypes or [], strict=False)
                  if _external(sp, a) is not None]
        stages.append(P.Stage(P.MATH, elems, _cycles_per_elem(op.name, p)))
        return P.single_stage_plan(*stages)
    if kind in ("dot", "composite"):
        in_dt = (op.in_dtypes or ["f32"])[0]
        addrs = list(op.in_addrs or [])
        spaces = list(op.in_spaces or [])
        ext = [_external(spaces[i] if i < len(spaces) else None, addrs[i]) for i in range(len(addrs))]
        m, n, k = int(op.m or 0), int(op.n or 0), int(op.k or 0)
        if kind == "dot":
            stages = [P.Stage(P.DMA_READ, a, nb) for a, nb in
                      zip(ext[:2], (m * k * _bytes(in_dt), k * n * _bytes(in_dt)), strict=False)
                      if a is not None]
            stages.append(P.Stage(P.GEMM, m, n, k))
            return P.single_stage_plan(*stages)
        extra = _extra(op.extra_json)
        ts = extra.get("tile_shape") or [tile.m, tile.k, tile.n]
        out_addr = _external(op.dst_space, op.dst_addr)
        epi = tuple(P.Epilogue(_cycles_per_elem(e.get("op", ""), p), e.get("scope", "output_tile"))
                    for e in extra.get("epilogue", []))
        if op.name == "gemm":
            return P.gemm_plan(m, n, k, tile_m=int(ts[0]), tile_k=int(ts[1]), tile_n=int(ts[2]),
                               in_bytes=_bytes(in_dt), out_bytes=_bytes(op.out_dtype),
                               a_addr=ext[0] if ext else None,
                               b_addr=ext[1] if len(ext) > 1 else None,
                               c_addr=out_addr, epilogue=epi)
        shape = list(op.out_shape or [1])
        m = prod(shape[:-1]) if len(shape) > 1 else 1
        n = shape[-1] if shape else 1
        name = extra.get("math_op", op.name)
        return P.math_plan(m, n, tile_m=int(ts[0]), tile_n=int(ts[2]), n_inputs=1,
                           in_bytes=_bytes(in_dt), out_bytes=_bytes(op.out_dtype),
                           cycles_per_elem=_cycles_per_elem(name, p),
                           in_addrs=tuple(ext[:1]), out_addr=out_addr)
    raise ValueError(f"op kind {kind!r} has no tile plan")

"""Semantic checks of tl.* calls: shapes, dtypes, broadcasting, axes (layer 2 of 3).

Pure functions: they normalise arguments and raise ``CaptureError`` /
``SanitizerError`` with what is wrong and how to fix it; the recorder backend
(``program.Program``) adds the kernel/program/line prefix. Mixed dtypes promote
implicitly (``result_dtype``; the lattice is in ``dtypes``). ``geometry``: the validated
layout of a tl.load / store / fill (memoised per call kind, as kernels repeat their tiles).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kbtrace.capture.dtypes import STORAGE, check_dtype, itemsize, promote, promote_scalar
from kbtrace.capture.image import span_elems
from kbtrace.errors import CaptureError, SanitizerError

__all__ = ["norm_shape", "norm_strides", "broadcast", "norm_axis", "result_dtype", "ACC_DEFAULT",
           "geometry", "LOAD_GEO", "STORE_GEO", "FILL_GEO"]

#: default accumulation dtype of dot / composite gemm per input dtype
ACC_DEFAULT = {"f32": "f32", "f16": "f32", "bf16": "f32", "i32": "i32", "i8": "i32"}


def norm_shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        out = tuple(int(s) for s in shape)
    except TypeError:
        raise CaptureError(f"{what}: shape must be a tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in out):
        raise CaptureError(f"{what}: negative dimension in shape {out}")
    return out


def norm_strides(strides: Any, shape: tuple[int, ...], what: str) -> tuple[int, ...] | None:
    """Element strides or None for contiguous (also when equal to C-order strides)."""
    if strides is None:
        return None
    st = tuple(int(s) for s in strides)
    if len(st) != len(shape):
        raise CaptureError(f"{what}: strides {st} must have one entry per dimension of {shape}")
    contig = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return None if st == contig else st


def broadcast(shapes: Sequence[tuple[int, ...]], what: str) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes)) if shapes else ()
    except ValueError:
        raise SanitizerError(f"{what}: operand shapes {', '.join(map(str, shapes))} do not "
                             f"broadcast; make trailing dimensions equal or 1") from None


def norm_axis(axis: int | None, ndim: int, what: str) -> int | None:
    if axis is None:
        return None
    if not -ndim <= axis < ndim:
        raise CaptureError(f"{what}: axis {axis} out of range for a {ndim}-d tensor")
    return axis % ndim


def result_dtype(name: str, dtypes: Sequence[str], what: str, scalars: Sequence[Any] = (),
                 strict: bool = False) -> str:
    """Common dtype of a math op's tensor operands (``where``'s condition excluded) and its
    Python scalars, by implicit promotion (``dtypes.promote``: Triton's lattice). With
    ``strict`` (the ``promote`` sanitizer) mixed tensor dtypes are an error instead."""
    if not dtypes:
        raise CaptureError(f"{what}: needs at least one tensor operand")
    for d in dtypes:
        if d not in STORAGE:
            raise CaptureError(f"{what}: unknown dtype {d!r}")
    if len(set(dtypes)) > 1:
        if strict:
            raise SanitizerError(f"{what}: operand dtypes differ ({', '.join(dtypes)}) and the "
                                 f"strict 'promote' sanitizer is on; convert with h.to(dtype) "
                                 f"first")
        dt = promote(dtypes)
    else:
        dt = dtypes[0]
    for s in scalars:
        if not (s.__class__ is bool and dt == "bool"):
            dt = promote_scalar(dt, isinstance(s, (float, np.floating)))
    return dt


#: (shape, dtype, strides) -> geometry tuple, per call kind (see ``geometry``)
LOAD_GEO: dict[Any, tuple[Any, ...]] = {}
STORE_GEO: dict[Any, tuple[Any, ...]] = {}
FILL_GEO: dict[Any, tuple[Any, ...]] = {}
_GEO_CAP = 4096


def geometry(cache: dict[Any, tuple[Any, ...]], shape: Any, dtype: Any, strides: Any,
              what: str) -> tuple[Any, ...]:
    """(shape, itemsize, span bytes, nbytes, shape list, strides list, strides|None) of a
    tl.load / store / fill, validated; memoised in ``cache`` (one per call kind)."""
    key = (shape, dtype, strides)
    try:
        return cache[key]
    except (KeyError, TypeError):
        pass
    shp = norm_shape(shape, what)
    if what != "tl.store":
        check_dtype(dtype, what)
    st = norm_strides(strides, shp, what)
    isz = itemsize(dtype)
    geo = (shp, isz, span_elems(shp, st) * isz, math.prod(shp) * isz, list(shp), list(st or ()),
           st)
    try:
        if len(cache) >= _GEO_CAP:
            cache.clear()
        cache[key] = geo
    except TypeError:  # unhashable (a list shape): not cached
        pass
    return geo

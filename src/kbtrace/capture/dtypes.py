"""Element dtypes of kernels and traces: storage layout, compute promotion, tolerances.

Every tensor is stored as raw little-endian C-order bytes of its *storage* dtype;
arithmetic happens in a *compute* dtype and is rounded back on store:

====== ============== ============= =====================
dtype  storage        compute       verify tolerance
====== ============== ============= =====================
f32    float32        float32       rtol = atol = 1e-5
f16    float16        float32       rtol = atol = 1e-3
bf16   uint16 (bits)  float32       rtol = atol = 1e-2
i32    int32          int32         exact
i8     int8           int32         exact
bool   bool           bool          exact
====== ============== ============= =====================

bf16 values are the upper 16 bits of an IEEE float32; converting f32 -> bf16
rounds to nearest, ties to even (NaN stays a quiet NaN).

Implicit promotion (Triton's rules; ``promote`` / ``promote_scalar``): mixed tensor
operands meet in the lattice ``bool < i8 < i32 < f16, bf16 < f32`` with
``f16 | bf16 = f32`` (any float beats any integer); a Python scalar is *weak*: an int
takes the tensor's dtype (``i32`` for a bool tensor), a float takes a float tensor's
dtype and makes an integer or bool tensor ``f32``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from kbtrace.errors import CaptureError

__all__ = ["STORAGE", "COMPUTE", "TOLERANCE", "itemsize", "check_dtype", "to_storage",
           "to_compute", "from_bytes", "digest", "compare", "allclose", "promote", "promote_scalar",
           "FLOATS", "ITEMSIZE"]

STORAGE: dict[str, np.dtype] = {
    "f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "bf16": np.dtype("<u2"),
    "i32": np.dtype("<i4"), "i8": np.dtype("i1"), "bool": np.dtype("?"),
}
COMPUTE: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32), "f16": np.dtype(np.float32), "bf16": np.dtype(np.float32),
    "i32": np.dtype(np.int32), "i8": np.dtype(np.int32), "bool": np.dtype(np.bool_),
}
#: (rtol, atol); ints and bool compare exactly.
TOLERANCE: dict[str, tuple[float, float]] = {
    "f32": (1e-5, 1e-5), "f16": (1e-3, 1e-3), "bf16": (1e-2, 1e-2),
    "i32": (0.0, 0.0), "i8": (0.0, 0.0), "bool": (0.0, 0.0),
}
#: bytes per element of each dtype (``itemsize`` without a call, for hot paths)
ITEMSIZE = {k: v.itemsize for k, v in STORAGE.items()}
FLOATS = frozenset(("f32", "f16", "bf16"))
#: rank in the promotion lattice (f16 and bf16 share a rank: they meet at f32)
_RANK = {"bool": 0, "i8": 1, "i32": 2, "f16": 3, "bf16": 3, "f32": 4}


def promote(dtypes: Iterable[str]) -> str:
    """The common dtype of mixed tensor operands (the lattice in the module docstring)."""
    it = iter(dtypes)
    out = next(it)
    for d in it:
        if d == out:
            continue
        rd, ro = _RANK[d], _RANK[out]
        out = "f32" if rd == ro else (d if rd > ro else out)
    return out


def promote_scalar(dtype: str, is_float: bool) -> str:
    """``dtype`` combined with a weak Python scalar (an int if not ``is_float``)."""
    if is_float:
        return dtype if dtype in FLOATS else "f32"
    return "i32" if dtype == "bool" else dtype


def itemsize(dtype: str) -> int:
    return ITEMSIZE[dtype]


def check_dtype(dtype: object, where: str) -> str:
    if dtype not in STORAGE:
        raise CaptureError(f"{where}: unknown dtype {dtype!r}; use one of {', '.join(STORAGE)}")
    return dtype


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + np.uint32(0x7FFF))) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def to_storage(values: np.ndarray | float | int, dtype: str) -> np.ndarray:
    """Round compute-dtype values to the storage representation of ``dtype``."""
    arr = np.asarray(values)
    if dtype == "bf16":
        return _f32_to_bf16(arr.astype(np.float32, copy=False))
    if dtype in ("i32", "i8") and arr.dtype.kind == "f":
        arr = np.trunc(arr)
    return np.ascontiguousarray(arr.astype(STORAGE[dtype], copy=False))


def to_compute(stored: np.ndarray, dtype: str) -> np.ndarray:
    """Storage representation -> compute-dtype values (a new or shared array)."""
    if dtype == "bf16":
        return (stored.astype(np.uint32) << 16).view(np.float32)
    return stored.astype(COMPUTE[dtype], copy=False)


def from_bytes(buf: bytes | memoryview | np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Raw storage bytes -> compute-dtype array of ``shape``."""
    arr = np.frombuffer(buf, dtype=STORAGE[dtype]).reshape(shape)
    return to_compute(arr, dtype)


_blake2b = hashlib.blake2b
_from_bytes = int.from_bytes


def digest(data: bytes | np.ndarray) -> int:
    """64-bit digest of result bytes (blake2b-64), as an unsigned int. An array's buffer is
    hashed (no bytes copy): a C-contiguous one's as it is (a 0-d array's is its one
    element), any other through a contiguous copy (numpy refuses it a simple buffer)."""
    buf: Any = data       # (numpy's stubs do not declare the buffer protocol)
    try:
        return _from_bytes(_blake2b(buf, digest_size=8).digest(), "little")
    except (ValueError, BufferError):
        if not isinstance(data, np.ndarray):
            raise
    buf = np.ascontiguousarray(data)
    return _from_bytes(_blake2b(buf, digest_size=8).digest(), "little")


COMPARE_CHUNK = 1 << 20   # elements compared at a time (float64 temporaries stay ~10 MB)


def compare(got: np.ndarray, want: np.ndarray, dtype: str) -> tuple[float, float, int]:
    """``(max abs error, max relative error, elements out of tolerance)`` of two equal-shape
    arrays under the dtype's verify tolerance (``np.isclose`` with ``equal_nan``: equal values,
    infinities included, and NaN against NaN are exact; NaN against a number, or an infinity
    against anything else, is out; ints / bool compare exactly).

    Works in chunks of ``COMPARE_CHUNK`` elements: a whole-array pass made ~10 float64
    temporaries of the array (1.45 GB for a 128 MiB f32 output)."""
    rtol, atol = TOLERANCE.get(dtype, (0.0, 0.0))
    g_all, w_all = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    if g_all.shape == w_all.shape and np.array_equal(g_all, w_all):
        return 0.0, 0.0, 0      # what the chunks below find for equal arrays, at one pass
    max_abs = max_rel = 0.0
    n_bad = 0
    for lo in range(0, g_all.size, COMPARE_CHUNK):
        g_raw, w_raw = g_all[lo:lo + COMPARE_CHUNK], w_all[lo:lo + COMPARE_CHUNK]
        g, w = g_raw.astype(np.float64), w_raw.astype(np.float64)
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        with np.errstate(invalid="ignore"):     # inf - inf
            diff = np.abs(g - w)
        diff[same] = 0.0
        diff[np.isnan(diff)] = np.inf
        aw = np.abs(w)
        max_abs = max(max_abs, float(diff.max()))
        nz = aw > 0
        if nz.any():
            with np.errstate(invalid="ignore"):  # inf / inf
                rel = diff[nz] / aw[nz]
            rel[np.isnan(rel)] = np.inf
            max_rel = max(max_rel, float(rel.max()))
        if rtol == 0.0 and atol == 0.0:
            n_bad += int(np.count_nonzero(g_raw != w_raw))
        else:
            bad = diff > atol + rtol * aw
            bad |= ~same & ~(np.isfinite(g) & np.isfinite(w))   # inf or NaN, unmatched
            n_bad += int(np.count_nonzero(bad))
    return max_abs, max_rel, n_bad


def allclose(got: np.ndarray, want: np.ndarray, dtype: str) -> bool:
    """Equal shapes and every element within the dtype's verify tolerance (``compare``)."""
    return got.shape == want.shape and compare(got, want, dtype)[2] == 0

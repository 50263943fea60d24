"""``colsort.lexsort2`` is ``np.lexsort`` of two keys: the same permutation (ties by
position), over the key ranges the recorder meets (radix path) and wider ones."""

from __future__ import annotations

import numpy as np
import pytest

from kbtrace.replay.colsort import lexsort2


@pytest.mark.parametrize("span", [1, 3, 2_300, (1 << 16) - 1, 1 << 16, 1 << 40])
def test_lexsort2_is_lexsort(span):
    rng = np.random.default_rng(span)
    n = 5_000
    major = rng.integers(0, span, n) + 10**12          # an offset: ranks are not small
    minor = rng.integers(0, 50, n).astype(np.float64) * 0.5      # many ties
    minor[::97] = np.nan
    got = lexsort2(minor, major)
    assert np.array_equal(got, np.lexsort((minor, major)))
    assert got.dtype == np.intp


def test_lexsort2_orders_by_major_then_minor_then_position():
    minor = np.array([2.0, 1.0, 1.0, 0.5, 2.0])
    major = np.array([7, 7, 3, 7, 3])
    assert lexsort2(minor, major).tolist() == [2, 4, 3, 1, 0]
    assert lexsort2(np.empty(0), np.empty(0, dtype=np.int64)).tolist() == []

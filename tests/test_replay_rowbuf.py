"""The recorder's row buffers (``rowbuf``; compiled twin ``_rowbuf_c`` when built): rows come
back in order, as the float64 values ``np.fromiter`` made of the same numbers, across growth
and clears."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from kbtrace.replay import rowbuf
from kbtrace.replay.fabric import core


def _impls() -> list:
    mods = [rowbuf]
    if core.status()[1] == "compiled":
        mods.append(importlib.import_module("kbtrace.replay.fabric._rowbuf_c"))
    return mods


@pytest.mark.parametrize("mod", _impls(), ids=lambda m: m.__name__.rpartition(".")[2])
def test_rows_come_back_in_order_across_growth_and_clear(mod):
    rows = [(i, i % 3 - 1, 7, 2**53 + 2 * i, -1, 0.1 * i, 1e300, float("inf"), -0.0, 2**40)
            for i in range(37)]
    h = mod.HopRows(4)
    h.extend(rows[:30])
    for r in rows[30:]:
        h.add(*r)
    assert (h.n, h.cap) == (37, 64)
    want = np.fromiter((x for r in rows for x in r), np.float64).reshape(37, 10)
    got = h.take()
    assert got.tobytes() == want.tobytes()
    h.clear()
    assert h.n == 0 and h.take().shape == (0, 10)
    h.add(*rows[5])
    assert h.take().tolist() == [list(map(float, rows[5]))]
    c = mod.CompactRows(1)
    for i in range(5):
        c.add(i, 10 + i, -1, 3, 0.5, 1.5, 0.0, 29)
    assert c.take()[:, 1].tolist() == [10.0, 11.0, 12.0, 13.0, 14.0]
    assert c.take().shape == (5, 8)


@pytest.mark.parametrize("mod", _impls(), ids=lambda m: m.__name__.rpartition(".")[2])
def test_a_transfer_is_placed_after_the_explicit_rows_so_far(mod):
    h = mod.HopRows(2)
    c = mod.CompactRows(1, x=h)
    c.transfer(4, -1, 0, 0.5, 1.5, 0.0, 29)
    h.add(1, 0, 2, 5, -1, 0.0, 1.0, 0.5, 0.0, 64)
    h.add(2, 0, 2, 5, -1, 0.0, 1.0, 0.5, 0.0, 64)
    c.transfer(5, 3, 1, 2.5, 3.5, 9.0, 7)
    assert c.take()[:, :2].tolist() == [[0.0, 4.0], [2.0, 5.0]]
    assert (c.n, c.rows) == (2, 36.0)
    c.clear()
    assert (c.n, c.rows) == (0, 0.0)


@pytest.mark.parametrize("mod", _impls(), ids=lambda m: m.__name__.rpartition(".")[2])
def test_the_issue_log_keeps_its_rows_after_the_first_are_dropped(mod):
    iss = mod.IssueRows(2)
    for i in range(7):
        iss.add(0.5 * i, 100 + i)
    iss.drop(4)
    assert iss.n == 3 and iss.take().tolist() == [[2.0, 104.0], [2.5, 105.0], [3.0, 106.0]]
    iss.add(9.0, 7)
    iss.drop(0)
    assert iss.take()[:, 1].tolist() == [104.0, 105.0, 106.0, 7.0]
    iss.drop(4)
    assert iss.n == 0 and iss.take().shape == (0, 2)

"""The booking state's cached last value (``booking._Sorted.tl``) is ``t[n - 1]`` after every
change, in the interpreted module and in its compiled twin (where built): the walk's test of a
resource free from ``s`` on reads it instead of the array's tail (``routes._Plan.take``)."""

from __future__ import annotations

import contextlib
import importlib
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtrace.replay.fabric import booking


def _twins() -> list:
    mods = [booking]
    with contextlib.suppress(ImportError):     # (the pure-Python core: interpreted only)
        mods.append(importlib.import_module("kbtrace.replay.fabric._booking_c"))
    return mods


def _values(x) -> list[float]:
    return x.tolist() if hasattr(x, "tolist") else x.times()


def _check(x) -> None:
    vals = _values(x)
    assert len(vals) == x.n
    if vals:
        assert x.tl == vals[-1]
    if hasattr(x, "last"):
        assert x.last() == (vals[-1] if vals else float("-inf"))


# an operation: (kind, where in [0, 1), value)
_OPS = st.lists(st.tuples(st.sampled_from(["push", "insert", "cut", "prune"]),
                          st.floats(0, 0.999), st.floats(0, 100)), max_size=60)


@pytest.mark.parametrize("mod", _twins(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
@settings(max_examples=150, deadline=None)
@given(ops=_OPS)
def test_spans_and_steps_keep_their_last_value(mod, ops):
    sp, ln = mod.Spans(), mod.Steps()
    for kind, where, v in ops:
        for x in (sp, ln):
            n = x.n
            if kind == "push":
                last = x.tl if n else 0.0
                if x is sp:
                    x.push(last + v, last + v + 1.0)
                else:
                    x.push(last + v, 0.5, last + v + 1.0)
            elif kind == "insert":       # anywhere, the tail included (i == n)
                i = int(where * (n + 1))
                before = _values(x)
                if x is sp:
                    x.insert2(i, v, v + 1.0)
                    assert _values(x) == before[:i] + [v, v + 1.0] + before[i:]
                else:
                    x.insert(i, v, 0.25)
                    assert _values(x) == before[:i] + [v] + before[i:]
            elif kind == "cut":          # from anywhere to anywhere, the tail included
                i = int(where * (n + 1))
                j = i + int(v) % (n - i + 2)
                before = _values(x)
                x.cut(i, j)
                assert _values(x) == before[:i] + before[j:]
            elif x is sp:
                x.prune(v)
            _check(x)


def test_a_cut_of_everything_then_a_push():
    for mod in _twins():
        ln = mod.Steps()
        ln.push(1.0, 0.5, 4.0)
        ln.cut(0, 2)
        assert ln.n == 0
        ln.push(5.0, 1.0, 7.0)
        assert (ln.n, ln.tl) == (2, 7.0)


def test_compiled_states_fill_whole_cache_lines_of_pymalloc_blocks():
    """The padding in ``booking.pxd`` (``_Sorted``) and ``ledger.pxd`` (``Recs``) makes each
    object, with the GC's 16-byte header, a multiple of 64 bytes that pymalloc serves (at most
    512): its pool's 48-byte header then puts every such object on a cache line. A field added
    to either class breaks that here, not silently (adjust the padding)."""
    try:
        b = importlib.import_module("kbtrace.replay.fabric._booking_c")
        led = importlib.import_module("kbtrace.replay.fabric._ledger_c")
    except ImportError:
        pytest.skip("compiled core not built")
    for cls in (b.Spans, b.Steps, led.Recs):
        block = cls.__basicsize__ + 16
        assert block % 64 == 0 and block <= 512, (cls.__name__, cls.__basicsize__)
    if os.environ.get("PYTHONMALLOC", "pymalloc") != "pymalloc":
        return      # (another allocator: no pools, no alignment to check)
    tab = led.Slots()
    objs = [b.Steps() for _ in range(8)] + [b.Spans() for _ in range(8)] + \
        [led.Recs(tab) for _ in range(8)]
    assert [id(o) % 64 for o in objs] == [0] * len(objs)

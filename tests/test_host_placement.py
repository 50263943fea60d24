"""DPPolicy / ShardSpec (ADR-0026): the reference's test list, the block layouts, and a
property test that every policy combination covers a tensor exactly once per replica."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbtrace.errors import CaptureError
from kbtrace.host import POLICIES, DPPolicy, ShardSpec, resolve_dp_policy, tile_grid
from kbtrace.host.placement import picture

DOCS = Path(__file__).resolve().parents[1] / "docs" / "capture.md"


def shards(policy, shape=(8, 16), itemsize=4, num_cubes=4, num_pes=8, sip=0):
    return policy.resolve(shape=shape, itemsize=itemsize, num_cubes=num_cubes, num_pes=num_pes,
                          target_sip=sip)


# ----------------------------------------------------------------- ported from ADR-0026's tests
def test_dppolicy_has_no_sip_fields():
    with pytest.raises(TypeError):
        DPPolicy(sip=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        DPPolicy(num_sips=2)  # type: ignore[call-arg]


def test_shardspec_has_structural_coordinates_and_no_pe_index():
    s = ShardSpec(sip=1, cube=2, pe=3, offset_bytes=0, nbytes=64)
    assert (s.sip, s.cube, s.pe) == (1, 2, 3)
    with pytest.raises(AttributeError):
        s.pe_index  # noqa: B018
    with pytest.raises(TypeError):
        ShardSpec(pe_index=5, offset_bytes=0, nbytes=1)  # type: ignore[call-arg]


def test_target_sip_is_stamped_on_every_shard_and_changes_nothing_else():
    p = DPPolicy(cube="column_wise", pe="column_wise", num_cubes=2, num_pes=4)
    a = resolve_dp_policy(p, shape=(4, 64), itemsize=2, num_pes=4, num_cubes=2, target_sip=0)
    b = resolve_dp_policy(p, shape=(4, 64), itemsize=2, num_pes=4, num_cubes=2, target_sip=1)
    assert {s.sip for s in a} == {0} and {s.sip for s in b} == {1}
    strip = [(s.cube, s.pe, s.offset_bytes, s.nbytes) for s in a]
    assert strip == [(s.cube, s.pe, s.offset_bytes, s.nbytes) for s in b]


def test_pe_is_cube_local_and_cube_is_sip_local():
    out = shards(DPPolicy(cube="row_wise", pe="row_wise"), shape=(32, 4), num_cubes=4, num_pes=8,
                 sip=1)
    assert [(s.cube, s.pe) for s in out] == [(c, p) for c in range(4) for p in range(8)]


def test_replicate_replicate_puts_a_whole_copy_on_every_pe():
    out = shards(DPPolicy(num_cubes=2, num_pes=2), shape=(4, 4))
    assert [(s.cube, s.pe, s.offset_bytes, s.nbytes, s.replica) for s in out] == [
        (0, 0, 0, 64, 0), (0, 1, 0, 64, 1), (1, 0, 0, 64, 2), (1, 1, 0, 64, 3)]


def test_column_wise_both_levels_splits_columns_cube_first():
    """The ADR-0027 weight layout: cube c, PE p owns columns [(c*P + p) * w, ...)."""
    out = shards(DPPolicy(cube="column_wise", pe="column_wise"), shape=(2, 64), num_cubes=2,
                 num_pes=4)
    assert [(s.cube, s.pe, s.offset, s.shape, s.offset_bytes) for s in out] == [
        (c, p, (0, (c * 4 + p) * 8), (2, 8), (c * 4 + p) * 8 * 4)
        for c in range(2) for p in range(4)]


def test_row_wise_shards_are_contiguous_byte_ranges():
    out = shards(DPPolicy(cube="row_wise", pe="replicate", num_pes=1), shape=(16, 8))
    assert [(s.cube, s.offset_bytes, s.nbytes) for s in out] == [
        (c, c * 4 * 8 * 4, 4 * 8 * 4) for c in range(4)]


def test_one_dimensional_tensors_are_a_row():
    out = shards(DPPolicy(cube="column_wise", pe="column_wise", num_cubes=2, num_pes=2),
                 shape=(16,), itemsize=2)
    assert [(s.offset, s.shape, s.offset_bytes) for s in out] == [
        ((0,), (4,), 0), ((4,), (4,), 8), ((8,), (4,), 16), ((12,), (4,), 24)]


def test_tiled_layouts():
    assert tile_grid(8) == (2, 4) and tile_grid(4) == (2, 2) and tile_grid(7) == (1, 7)
    rm = shards(DPPolicy(cube="replicate", pe="tiled_row_major", num_cubes=1), shape=(4, 8))
    cm = shards(DPPolicy(cube="replicate", pe="tiled_column_major", num_cubes=1), shape=(4, 8))
    # 8 PEs -> 2 x 4 blocks of 2 x 2; row-major numbers blocks along rows, column-major down
    assert [s.offset for s in rm] == [(i, j) for i in (0, 2) for j in (0, 2, 4, 6)]
    assert [s.offset for s in cm] == [(i, j) for j in (0, 2, 4, 6) for i in (0, 2)]
    assert {s.shape for s in rm} == {(2, 2)}


@pytest.mark.parametrize("policy,shape,match", [
    (DPPolicy(cube="row_wise"), (6, 8), "rows 6 over 4 cubes"),
    (DPPolicy(cube="replicate", pe="column_wise"), (4, 12), "columns 12 over 8 pes"),
    (DPPolicy(cube="tiled_row_major", num_cubes=4), (3, 8), "rows 3 over 2 cubes"),
])
def test_a_policy_that_does_not_divide_is_one_clear_error(policy, shape, match):
    with pytest.raises(CaptureError, match=match) as ei:
        shards(policy, shape=shape)
    assert "does not divide; use a" in str(ei.value) and "\n" not in str(ei.value)


def test_bad_policies_are_refused():
    with pytest.raises(CaptureError, match="use one of replicate"):
        DPPolicy(cube="diagonal")
    with pytest.raises(CaptureError, match="num_pes"):
        DPPolicy(num_pes=0)
    with pytest.raises(CaptureError, match="a cube has 8 PEs"):
        shards(DPPolicy(num_pes=9))
    with pytest.raises(CaptureError, match="1-D and 2-D"):
        shards(DPPolicy(), shape=(2, 2, 2))


# ----------------------------------------------------------------- property test
@settings(max_examples=300, deadline=None)
@given(cube=st.sampled_from(POLICIES), pe=st.sampled_from(POLICIES),
       nc=st.integers(1, 4), npe=st.integers(1, 8), rows=st.integers(1, 4),
       cols=st.integers(1, 4), one_d=st.booleans(), sip=st.integers(0, 3),
       itemsize=st.sampled_from([1, 2, 4]))
def test_every_policy_covers_the_tensor_exactly_once_per_replica(cube, pe, nc, npe, rows, cols,
                                                                 one_d, sip, itemsize):
    # scale the shape so every split divides: rows and columns multiples of both counts
    R, C = rows * nc * npe, cols * nc * npe
    shape = (C,) if one_d else (R, C)
    if one_d:   # a 1-D tensor is a single row: only a level that splits no rows can place it
        def row_parts(policy, n):
            return n if policy == "row_wise" else tile_grid(n)[0] if "tiled" in policy else 1
        if row_parts(cube, nc) > 1 or row_parts(pe, npe) > 1:
            with pytest.raises(CaptureError, match="splits rows 1 over"):
                shards(DPPolicy(cube=cube, pe=pe, num_cubes=nc, num_pes=npe), shape=shape,
                       num_cubes=4, num_pes=8)
            return
    out = shards(DPPolicy(cube=cube, pe=pe, num_cubes=nc, num_pes=npe), shape=shape,
                 itemsize=itemsize, num_cubes=4, num_pes=8, sip=sip)
    full = (1, C) if one_d else (R, C)
    n_rep = (nc if cube == "replicate" else 1) * (npe if pe == "replicate" else 1)
    assert len(out) == nc * npe
    assert sorted({s.replica for s in out}) == list(range(n_rep))
    for rep in range(n_rep):
        hits = np.zeros(full, dtype=int)
        for s in (s for s in out if s.replica == rep):
            off = (0, *s.offset) if one_d else s.offset
            shp = (1, *s.shape) if one_d else s.shape
            hits[off[0]:off[0] + shp[0], off[1]:off[1] + shp[1]] += 1
            # the reference's five fields agree with the element view
            assert s.offset_bytes == (off[0] * full[1] + off[1]) * itemsize
            assert s.nbytes == shp[0] * shp[1] * itemsize
        assert (hits == 1).all()
    # structural coordinates: the targets the policy names, each PE at most once
    assert {(s.sip, s.cube, s.pe) for s in out} == set(itertools.product([sip], range(nc),
                                                                         range(npe)))
    # where the reference puts it: a split level gives target i the i-th part in order
    if cube in ("row_wise", "column_wise") and pe == "replicate":
        ax = 0 if cube == "row_wise" and not one_d else 1
        for s in out:
            size = (full[ax] // nc)
            assert (s.offset[ax] if not one_d else s.offset[0]) == s.cube * size


def test_the_docs_pictures_are_what_the_code_does():
    doc = DOCS.read_text()
    for c, p, nc, npe in [("row_wise", "column_wise", 2, 2), ("column_wise", "column_wise", 2, 2),
                          ("column_wise", "row_wise", 2, 2), ("replicate", "column_wise", 2, 2),
                          ("replicate", "tiled_row_major", 1, 4),
                          ("replicate", "tiled_column_major", 1, 4)]:
        pol = DPPolicy(cube=c, pe=p, num_cubes=nc, num_pes=npe)
        block = (f"DPPolicy(cube={c!r}, pe={p!r}, num_cubes={nc}, num_pes={npe})\n"
                 + picture(pol, (4, 8), nc, npe))
        assert block in doc, block
    assert picture(DPPolicy(cube="row_wise", pe="column_wise", num_cubes=2, num_pes=2), (2, 4),
                   2, 2) == "0.0 0.0 0.1 0.1\n1.0 1.0 1.1 1.1"

"""ADR-0001 rev 2 address encode/decode: worked examples, round trips, invalid encodings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbtrace.errors import AddressError
from kbtrace.topology import address as A

sips = st.integers(0, 15)
cubes = st.integers(0, 15)
ios = st.integers(16, 20)


def test_adr_appendix_a_examples():
    assert A.hbm_addr(2, 5, 0x1000) == 0x1142000001000
    assert A.pe_tcm_addr(0, 0, 3, 0x400) == 0x6C000400
    assert A.mcpu_addr(1, 3, 5, 0) == 0x8C040A000000
    assert A.iocpu_addr(1, 17, 2, 0x20000) == 0xC40010020000
    assert A.ual_addr(0, 16, 0x1_0000_0000 - A.UAL_BASE) == 0x400100000000


def test_decode_fields():
    d = A.decode(0x1142000001000)
    assert (d.sip, d.die, d.target, d.pe, d.sub_unit, d.offset) == (2, 5, "hbm", None, None, 0x1000)
    d = A.decode(A.pe_tcm_addr(1, 7, 15, 123))
    assert (d.target, d.pe, d.sub_unit, d.sub_unit_name, d.offset) == ("pe_local", 15, 6, "pe_tcm", 123)
    assert A.decode(A.sram_addr(0, 2, 5)).target == "cube_sram"
    assert A.decode(A.iocpu_addr(0, 20, 5, 7)).sub_unit_name == "io_sram"
    assert A.decode(A.ual_addr(3, 18, 9)) == A.PhysAddr(3, 18, "ual", None, None, 9)


@given(sips, cubes, st.integers(0, A.HBM_WINDOW_BYTES - 1))
def test_hbm_roundtrip(s, d, off):
    a = A.hbm_addr(s, d, off)
    assert a < 1 << 51
    assert A.decode(a) == A.PhysAddr(s, d, "hbm", None, None, off)
    assert A.decode(a).encode() == a


@given(sips, cubes, st.integers(0, 15), st.sampled_from(sorted(A.PE_SUB_UNITS)), st.data())
def test_pe_local_roundtrip(s, d, pe, sub, data):
    off = data.draw(st.integers(0, A.PE_SUB_UNITS[sub][1] - 1))
    a = A.pe_local_addr(s, d, pe, sub, off)
    assert A.decode(a) == A.PhysAddr(s, d, "pe_local", pe, sub, off)
    assert A.decode(a).encode() == a


@given(sips, cubes, st.sampled_from(sorted(A.MCPU_SUB_UNITS)), st.data())
def test_mcpu_roundtrip(s, d, sub, data):
    off = data.draw(st.integers(0, A.MCPU_SUB_UNITS[sub][1] - 1))
    a = A.mcpu_addr(s, d, sub, off)
    assert A.decode(a) == A.PhysAddr(s, d, "mcpu_local", None, sub, off)


@given(sips, cubes, st.integers(0, A.SRAM_BYTES - 1))
def test_sram_roundtrip(s, d, off):
    assert A.decode(A.sram_addr(s, d, off)) == A.PhysAddr(s, d, "cube_sram", None, None, off)


@given(sips, ios, st.sampled_from(sorted(A.IOCPU_SUB_UNITS)), st.data())
def test_iocpu_roundtrip(s, d, sub, data):
    off = data.draw(st.integers(0, A.IOCPU_SUB_UNITS[sub][1] - 1))
    a = A.iocpu_addr(s, d, sub, off)
    assert A.decode(a) == A.PhysAddr(s, d, "iocpu", None, sub, off)
    assert A.decode(a).encode() == a


@given(sips, ios, st.integers(0, A.UAL_BYTES - 1))
def test_ual_roundtrip(s, d, off):
    a = A.ual_addr(s, d, off)
    assert A.decode(a).encode() == a


@given(st.integers(0, (1 << 51) - 1))
def test_decode_is_total_or_address_error(a):
    """Every 51-bit integer either decodes and re-encodes to itself, or raises AddressError."""
    try:
        d = A.decode(a)
    except AddressError:
        return
    assert d.encode() == a


@pytest.mark.parametrize("bad, needle", [
    (1 << 41 | A.hbm_addr(0, 0, 0), "must-be-zero"),                 # MBZ [41:38]
    ((3 << 34), "resource kind 3 is reserved"),                       # reserved kind
    ((21 << 42), "die 21 is reserved"),                               # reserved die
    ((7 << 25), "pe_sub_unit = 7 is reserved"),                       # reserved PE sub-unit
    ((6 << 25) | (2 << 20), "budget"),                                # TCM offset 2 MB: beyond budget
    ((1 << 34) | (1 << 30), "must-be-zero"),                          # MCPU MBZ
    ((2 << 34) | (1 << 25), "must-be-zero"),                          # SRAM MBZ
    ((16 << 42) | (1 << 40), "must-be-zero"),                         # IO chiplet MBZ
    (1 << 51, "not a 51-bit"),
    (-1, "not a 51-bit"),
])
def test_invalid_addresses(bad, needle):
    with pytest.raises(AddressError, match=needle):
        A.decode(bad)


@pytest.mark.parametrize("call", [
    lambda: A.hbm_addr(16, 0, 0),
    lambda: A.hbm_addr(0, 16, 0),
    lambda: A.hbm_addr(0, 0, A.HBM_WINDOW_BYTES),
    lambda: A.pe_tcm_addr(0, 0, 16, 0),
    lambda: A.pe_tcm_addr(0, 0, 0, 2 << 20),
    lambda: A.pe_local_addr(0, 0, 0, 9, 0),
    lambda: A.iocpu_addr(0, 15, 0, 0),
    lambda: A.ual_addr(0, 21, 0),
    lambda: A.mcpu_addr(0, 0, 6, 0),
])
def test_encoders_reject_out_of_range(call):
    with pytest.raises(AddressError):
        call()

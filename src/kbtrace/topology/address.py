"""51-bit physical addresses (ADR-0001 rev 2): encode, decode, validate.

Layout::

    [50:47] sip (4)  [46:42] die (5)  [41:0] local_offset (42)
    die 0..15  AHBM (cube) dies:  [41:38] MBZ  [37] 1 = HBM window, 0 = local resources
        HBM       [36:0] hbm_offset (128 GB window)
        resources [36:34] kind: 0 PE_LOCAL, 1 MCPU_LOCAL, 2 CUBE_SRAM, 3..7 reserved
          PE_LOCAL   [33] MBZ [32:29] pe [28:25] sub_unit [24:0] offset (32 MB slots)
          MCPU_LOCAL [33:30] MBZ [29:25] sub_unit [24:0] offset (32 MB slots)
          CUBE_SRAM  [33:25] MBZ [24:0] offset (32 MB)
    die 16..20 IO chiplets:      [41:40] MBZ  [39:0] chiplet_offset (1 TB)
        IOCPU  chiplet_offset <  2 GB: [30:27] sub_unit [26:0] offset (128 MB slots)
        UAL    chiplet_offset >= 2 GB  (``offset`` here is relative to the 2 GB UAL base)
    die 21..31 reserved

Decoding is purely positional and never consults a topology (ADR-0001 D3/D4);
``Topology.resolve`` adds the capacity checks. Invalid addresses (MBZ bits set,
reserved die/kind/sub-unit, offset beyond a sub-unit's budget) raise
``AddressError``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kbtrace.errors import AddressError

__all__ = [
    "ADDR_BITS", "SIP_SHIFT", "DIE_SHIFT", "MAX_SIPS", "MAX_CUBES", "MAX_PES",
    "IO_DIE_BASE", "IO_DIE_COUNT", "HBM_WINDOW_BYTES", "SLOT_BYTES", "SRAM_BYTES",
    "IOCPU_SLOT_BYTES", "IOCPU_REGION_BYTES", "UAL_BASE", "UAL_BYTES",
    "PE_SUB_UNITS", "MCPU_SUB_UNITS", "IOCPU_SUB_UNITS", "PE_TCM", "TARGETS",
    "PhysAddr", "hbm_addr", "pe_local_addr", "pe_tcm_addr", "sram_addr", "mcpu_addr",
    "iocpu_addr", "ual_addr", "decode",
]

ADDR_BITS = 51
SIP_SHIFT = 47
DIE_SHIFT = 42
MAX_SIPS = 16
MAX_CUBES = 16          # AHBM dies 0..15
MAX_PES = 16            # pe field is 4 bits
IO_DIE_BASE = 16
IO_DIE_COUNT = 5        # dies 16..20
_LOCAL_MASK = (1 << DIE_SHIFT) - 1

_HBM_BIT = 1 << 37
HBM_WINDOW_BYTES = 1 << 37          # 128 GB
_KIND_SHIFT = 34
_KIND_PE, _KIND_MCPU, _KIND_SRAM = 0, 1, 2
SLOT_BYTES = 1 << 25                # 32 MB per PE / MCPU sub-unit slot
SRAM_BYTES = 1 << 25                # 32 MB cube SRAM window
_PE_SHIFT = 29
_SUB_SHIFT = 25
IOCPU_SLOT_BYTES = 1 << 27          # 128 MB
IOCPU_REGION_BYTES = 1 << 31        # 2 GB
_IOCPU_SUB_SHIFT = 27
UAL_BASE = IOCPU_REGION_BYTES
UAL_BYTES = (1 << 40) - UAL_BASE    # 1 TB chiplet window minus the IOCPU region

_KB = 1024
_MB = 1024 * 1024

#: pe_sub_unit -> (name, implemented budget in bytes). 7..15 reserved.
PE_SUB_UNITS: dict[int, tuple[str, int]] = {
    0: ("pe_cpu_dtcm", 8 * _KB),
    1: ("math_engine_dtcm", 8 * _KB),
    2: ("ipcq", 256 * _KB),
    3: ("pe_cpu_sfr", 16 * _KB),
    4: ("math_engine_sfr", 16 * _KB),
    5: ("dma_engine_sfr", 192 * _KB),
    6: ("pe_tcm", 2 * _MB),
}
PE_TCM = 6

#: mcpu_sub_unit -> (name, budget). 6..31 reserved.
MCPU_SUB_UNITS: dict[int, tuple[str, int]] = {
    0: ("mcpu_itcm", 512 * _KB),
    1: ("mcpu_dtcm", 512 * _KB),
    2: ("ipcq", 256 * _KB),
    3: ("mcpu_sfr", 8 * _KB),
    4: ("mcpu_dma_sfr", 16 * _KB),
    5: ("mcpu_sram", 10 * _MB),
}

#: iocpu_sub_unit -> (name, budget). 6..15 reserved.
IOCPU_SUB_UNITS: dict[int, tuple[str, int]] = {
    0: ("iocpu_itcm", 512 * _KB),
    1: ("iocpu_dtcm", 512 * _KB),
    2: ("ipcq", 2 * _MB),
    3: ("iocpu_sfr", 8 * _KB),
    4: ("io_dma_sfr", 16 * _KB),
    5: ("io_sram", 64 * _MB),
}

TARGETS = ("hbm", "pe_local", "mcpu_local", "cube_sram", "iocpu", "ual")


@dataclass(frozen=True, slots=True)
class PhysAddr:
    """A decoded address. ``pe``/``sub_unit`` are None where the target has none."""
    sip: int
    die: int
    target: str          # one of TARGETS
    pe: int | None
    sub_unit: int | None
    offset: int

    def encode(self) -> int:
        """The 51-bit integer this value decodes from."""
        t = self.target
        if t == "hbm":
            return hbm_addr(self.sip, self.die, self.offset)
        if t == "pe_local":
            return pe_local_addr(self.sip, self.die, _req(self.pe, "pe"), _req(self.sub_unit, "sub_unit"),
                                 self.offset)
        if t == "mcpu_local":
            return mcpu_addr(self.sip, self.die, _req(self.sub_unit, "sub_unit"), self.offset)
        if t == "cube_sram":
            return sram_addr(self.sip, self.die, self.offset)
        if t == "iocpu":
            return iocpu_addr(self.sip, self.die, _req(self.sub_unit, "sub_unit"), self.offset)
        if t == "ual":
            return ual_addr(self.sip, self.die, self.offset)
        raise AddressError(f"unknown address target {t!r}; use one of {', '.join(TARGETS)}")

    @property
    def sub_unit_name(self) -> str | None:
        table = {"pe_local": PE_SUB_UNITS, "mcpu_local": MCPU_SUB_UNITS, "iocpu": IOCPU_SUB_UNITS}
        tab = table.get(self.target)
        return None if tab is None or self.sub_unit is None else tab[self.sub_unit][0]


def _req(v: int | None, name: str) -> int:
    if v is None:
        raise AddressError(f"PhysAddr.{name} is required for this target")
    return v


# ----------------------------------------------------------------------------- encode

def _check(name: str, value: int, lo: int, hi: int, fix: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value < hi:
        raise AddressError(f"{name} = {value!r} out of range [{lo}, {hi}); {fix}")


def _top(sip: int, die: int, cube_die: bool) -> int:
    _check("sip", sip, 0, MAX_SIPS, "a SIP index is 4 bits (0..15)")
    if cube_die:
        _check("die", die, 0, MAX_CUBES, "cube dies are 0..15")
    else:
        _check("die", die, IO_DIE_BASE, IO_DIE_BASE + IO_DIE_COUNT, "IO-chiplet dies are 16..20")
    return (sip << SIP_SHIFT) | (die << DIE_SHIFT)


def hbm_addr(sip: int, die: int, hbm_offset: int) -> int:
    """Address of byte ``hbm_offset`` of cube ``die``'s HBM window (128 GB)."""
    _check("hbm_offset", hbm_offset, 0, HBM_WINDOW_BYTES, "the HBM window is 128 GB")
    return _top(sip, die, True) | _HBM_BIT | hbm_offset


def pe_local_addr(sip: int, die: int, pe: int, sub_unit: int, offset: int) -> int:
    """Address inside a PE-local sub-unit slot (PE_SUB_UNITS)."""
    _check("pe", pe, 0, MAX_PES, "a PE index is 4 bits (0..15)")
    name, budget = _sub_unit(PE_SUB_UNITS, "pe_sub_unit", sub_unit)
    _check(f"offset into {name}", offset, 0, budget, f"{name} holds {budget} bytes")
    return (_top(sip, die, True) | (_KIND_PE << _KIND_SHIFT) | (pe << _PE_SHIFT)
            | (sub_unit << _SUB_SHIFT) | offset)


def pe_tcm_addr(sip: int, die: int, pe: int, offset: int) -> int:
    """Address of byte ``offset`` of a PE's TCM (sub-unit 6, 2 MB)."""
    return pe_local_addr(sip, die, pe, PE_TCM, offset)


def sram_addr(sip: int, die: int, offset: int) -> int:
    """Address in a cube's shared SRAM (32 MB window)."""
    _check("sram offset", offset, 0, SRAM_BYTES, "the cube SRAM window is 32 MB")
    return _top(sip, die, True) | (_KIND_SRAM << _KIND_SHIFT) | offset


def mcpu_addr(sip: int, die: int, sub_unit: int, offset: int) -> int:
    """Address inside an M_CPU sub-unit slot (MCPU_SUB_UNITS)."""
    name, budget = _sub_unit(MCPU_SUB_UNITS, "mcpu_sub_unit", sub_unit)
    _check(f"offset into {name}", offset, 0, budget, f"{name} holds {budget} bytes")
    return _top(sip, die, True) | (_KIND_MCPU << _KIND_SHIFT) | (sub_unit << _SUB_SHIFT) | offset


def iocpu_addr(sip: int, die: int, sub_unit: int, offset: int) -> int:
    """Address inside an IO_CPU sub-unit slot of IO-chiplet die 16..20."""
    name, budget = _sub_unit(IOCPU_SUB_UNITS, "iocpu_sub_unit", sub_unit)
    _check(f"offset into {name}", offset, 0, budget, f"{name} holds {budget} bytes")
    return _top(sip, die, False) | (sub_unit << _IOCPU_SUB_SHIFT) | offset


def ual_addr(sip: int, die: int, offset: int) -> int:
    """Address ``offset`` bytes into the UAL region (which starts at chiplet offset 2 GB)."""
    _check("ual offset", offset, 0, UAL_BYTES, "the UAL region is 1 TB - 2 GB")
    return _top(sip, die, False) | (UAL_BASE + offset)


def _sub_unit(table: dict[int, tuple[str, int]], field: str, sub_unit: int) -> tuple[str, int]:
    entry = table.get(sub_unit) if isinstance(sub_unit, int) else None
    if entry is None:
        raise AddressError(f"{field} = {sub_unit!r} is reserved or invalid; "
                           f"use one of {', '.join(f'{k} ({v[0]})' for k, v in table.items())}")
    return entry


# ----------------------------------------------------------------------------- decode

def decode(addr: int) -> PhysAddr:
    """Split a 51-bit address into its domains; AddressError for invalid encodings."""
    if not isinstance(addr, int) or isinstance(addr, bool) or not 0 <= addr < (1 << ADDR_BITS):
        raise AddressError(f"address {addr!r} is not a 51-bit physical address")
    sip = addr >> SIP_SHIFT
    die = (addr >> DIE_SHIFT) & 0x1F
    local = addr & _LOCAL_MASK
    if die < MAX_CUBES:
        return _decode_cube(addr, sip, die, local)
    if die < IO_DIE_BASE + IO_DIE_COUNT:
        return _decode_io(addr, sip, die, local)
    raise AddressError(f"address {addr:#x}: die {die} is reserved (cubes 0..15, IO chiplets 16..20)")


def _mbz(addr: int, bits: int, where: str) -> None:
    if bits:
        raise AddressError(f"address {addr:#x}: must-be-zero bits set in {where} (ADR-0001 D2.5)")


def _decode_cube(addr: int, sip: int, die: int, local: int) -> PhysAddr:
    _mbz(addr, local >> 38, "[41:38]")
    if local & _HBM_BIT:
        return PhysAddr(sip, die, "hbm", None, None, local & (_HBM_BIT - 1))
    kind = (local >> _KIND_SHIFT) & 0x7
    kind_local = local & ((1 << _KIND_SHIFT) - 1)
    if kind == _KIND_PE:
        _mbz(addr, kind_local >> 33, "PE_LOCAL [33]")
        pe = (kind_local >> _PE_SHIFT) & 0xF
        sub = (kind_local >> _SUB_SHIFT) & 0xF
        off = kind_local & (SLOT_BYTES - 1)
        name, budget = _sub_unit(PE_SUB_UNITS, "pe_sub_unit", sub)
        _over(addr, off, budget, name)
        return PhysAddr(sip, die, "pe_local", pe, sub, off)
    if kind == _KIND_MCPU:
        _mbz(addr, kind_local >> 30, "MCPU_LOCAL [33:30]")
        sub = (kind_local >> _SUB_SHIFT) & 0x1F
        off = kind_local & (SLOT_BYTES - 1)
        name, budget = _sub_unit(MCPU_SUB_UNITS, "mcpu_sub_unit", sub)
        _over(addr, off, budget, name)
        return PhysAddr(sip, die, "mcpu_local", None, sub, off)
    if kind == _KIND_SRAM:
        _mbz(addr, kind_local >> 25, "CUBE_SRAM [33:25]")
        return PhysAddr(sip, die, "cube_sram", None, None, kind_local)
    raise AddressError(f"address {addr:#x}: resource kind {kind} is reserved "
                       "(0 PE_LOCAL, 1 MCPU_LOCAL, 2 CUBE_SRAM)")


def _decode_io(addr: int, sip: int, die: int, local: int) -> PhysAddr:
    _mbz(addr, local >> 40, "IO chiplet [41:40]")
    if local >= UAL_BASE:
        return PhysAddr(sip, die, "ual", None, None, local - UAL_BASE)
    sub = local >> _IOCPU_SUB_SHIFT
    off = local & (IOCPU_SLOT_BYTES - 1)
    name, budget = _sub_unit(IOCPU_SUB_UNITS, "iocpu_sub_unit", sub)
    _over(addr, off, budget, name)
    return PhysAddr(sip, die, "iocpu", None, sub, off)


def _over(addr: int, off: int, budget: int, name: str) -> None:
    if off >= budget:
        raise AddressError(f"address {addr:#x}: offset {off:#x} beyond {name}'s "
                           f"{budget}-byte budget (ADR-0001 D2.5 rule 3)")

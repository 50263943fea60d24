"""Every hardware parameter, its YAML key, unit, default and meaning.

The topology YAML mirrors these dataclasses one to one: the YAML path of a
field is its attribute path (``cube.mesh.link_bw_gbps``), which is also the key
``kbtrace replay --set`` overrides. No model number is hard-coded anywhere else;
components read them from ``Topology.params``.

Defaults are the predecessor's (``reference/``); where the reference is silent
the default is ours and its ``doc`` says so ("kbtrace default").
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass
from functools import partial
from typing import Any

__all__ = [
    "P",
    "SipsParams", "HostParams", "PcieParams", "SystemParams",
    "UcieParams", "IoChipletParams", "SipParams",
    "MeshParams", "PeLinkParams", "HbmParams", "SramParams", "MCpuParams", "CubeParams",
    "PeCpuParams", "SchedulerParams", "DmaParams", "FetchStoreParams", "GemmParams",
    "MathParams", "TcmParams", "TileParams", "IpcqTierParams", "IpcqParams", "PeParams",
    "TopologyParams",
    "iter_params",
]


def P(default: Any, unit: str, doc: str) -> Any:  # noqa: N802 - reads like a declaration
    """Declare a parameter field with its unit and documentation."""
    if isinstance(default, (list, dict)):
        return field(default_factory=partial(copy.copy, default), metadata={"unit": unit, "doc": doc})
    return field(default=default, metadata={"unit": unit, "doc": doc})


def _sub(cls: type) -> Any:
    return field(default_factory=cls, metadata={"unit": "", "doc": cls.__doc__ or ""})


# ----------------------------------------------------------------------------- system

@dataclass(frozen=True, slots=True)
class SipsParams:
    """How many SIPs the tray holds and how they are connected."""
    count: int = P(2, "-", "number of SIPs (<= 16, 4 address bits)")
    topology: str = P("ring_1d", "-", "inter-SIP pattern for collectives: ring_1d | torus_2d | mesh_2d")
    w: int = P(0, "-", "SIP grid width for torus_2d/mesh_2d (0 = square grid; a non-square count needs w and h)")
    h: int = P(0, "-", "SIP grid height for torus_2d/mesh_2d (0 = square grid; a non-square count needs w and h)")


@dataclass(frozen=True, slots=True)
class HostParams:
    """The host CPU that launches kernels and copies tensors."""
    overhead_ns: float = P(0.0, "ns", "host-side per-transaction overhead (kbtrace default)")
    copy_from: str = P("pcie_ep", "-", "where h2d / d2h copies enter the tray: pcie_ep (the "
                       "reference: memory operations are injected at the SIP's PCIe EP, "
                       "ADR-0007 D2) or host (also cross host -> switch -> PCIe EP)")


@dataclass(frozen=True, slots=True)
class PcieParams:
    """Host <-> tray switch <-> SIP PCIe links."""
    bw_gbps: float = P(64.0, "GB/s", "PCIe link bandwidth per direction (kbtrace default: Gen5 x16)")
    distance_mm: float = P(100.0, "mm", "host/switch <-> PCIe EP trace length (kbtrace default)")
    switch_overhead_ns: float = P(5.0, "ns", "tray switch per-transaction overhead")


@dataclass(frozen=True, slots=True)
class SystemParams:
    """Tray level: SIPs, host, inter-SIP fabric."""
    sips: SipsParams = _sub(SipsParams)
    host: HostParams = _sub(HostParams)
    pcie: PcieParams = _sub(PcieParams)
    ns_per_mm: float = P(0.1, "ns/mm", "wire propagation delay (kbtrace default: repeated wire ~100 ps/mm)")


# ----------------------------------------------------------------------------- SIP

@dataclass(frozen=True, slots=True)
class UcieParams:
    """Die-to-die UCIe ports (N/S/E/W per cube)."""
    overhead_ns: float = P(8.0, "ns", "per-endpoint protocol overhead (a crossing pays TX + RX = 16 ns)")
    connections: int = P(4, "-", "connections per port")
    conn_bw_gbps: float = P(128.0, "GB/s", "bandwidth per connection")
    seam_mm: float = P(1.0, "mm", "die-to-die seam length")
    conn_distance_mm: float = P(0.5, "mm", "router <-> connection <-> endpoint bridge wire length (kbtrace default)")


@dataclass(frozen=True, slots=True)
class IoChipletParams:
    """IO chiplet: PCIe EP, io_noc, IO_CPU and its own UCIe endpoints to shoreline cubes."""
    side: str = P("W", "-", "SIP shoreline the chiplet sits on: N | S | E | W")
    pcie_ep_overhead_ns: float = P(5.0, "ns", "PCIe endpoint overhead")
    io_noc_overhead_ns: float = P(0.0, "ns", "IO-chiplet NoC overhead")
    io_cpu_overhead_ns: float = P(10.0, "ns", "IO_CPU command-processing overhead")
    ucie_overhead_ns: float = P(8.0, "ns", "IO-chiplet UCIe endpoint overhead")
    noc_bw_gbps: float = P(256.0, "GB/s", "PCIe EP / IO_CPU <-> io_noc bandwidth")
    distance_mm: float = P(2.0, "mm", "IO UCIe <-> shoreline cube UCIe distance")
    noc_distance_mm: float = P(1.0, "mm", "wire length of io_noc links (pcie_ep/io_cpu/conn <-> io_noc; kbtrace default)")


@dataclass(frozen=True, slots=True)
class SipParams:
    """SIP level: the cube mesh, UCIe, IO chiplets."""
    cube_mesh_w: int = P(4, "-", "cubes per row of the SIP's cube mesh")
    cube_mesh_h: int = P(4, "-", "cube rows of the SIP's cube mesh")
    cube_pitch_mm: float = P(12.0, "mm", "cube centre spacing (drawing + distances; kbtrace default)")
    ucie: UcieParams = _sub(UcieParams)
    io_chiplets: tuple = P((IoChipletParams(),), "-",
                           "IO chiplets: a list of mappings with the io_chiplets[] keys below "
                           "(1..5 chiplets, dies 16..20; at most 2 per side)")


# ----------------------------------------------------------------------------- cube

@dataclass(frozen=True, slots=True)
class MeshParams:
    """The cube NoC: a router mesh with XY routing and a central HBM exclusion zone."""
    rows: int = P(6, "-", "router rows")
    cols: int = P(6, "-", "router columns")
    hbm_zone: tuple = P(((2, 2), (2, 3), (3, 2), (3, 3)), "-", "[row, col] slots with no router")
    pitch_mm: float = P(1.5, "mm", "router spacing (kbtrace default)")
    router_overhead_ns: float = P(2.0, "ns", "per-router switching overhead (ADR-0019 proposal)")
    link_bw_gbps: float = P(256.0, "GB/s", "router <-> router link bandwidth")


@dataclass(frozen=True, slots=True)
class PeLinkParams:
    """Where the PEs attach to the cube mesh and how."""
    count: int = P(8, "-", "PEs per cube (<= 16, 4 address bits)")
    routers: tuple = P(((0, 0), (1, 0), (0, 5), (1, 5), (4, 0), (5, 0), (4, 5), (5, 5)), "-",
                      "[row, col] of the router each PE attaches to (ADR-0017 D4: PE0 r0c0, PE2 r0c5, "
                      "PE4 r4c0, PE6 r4c5; odd PEs one row below, ADR-0053 D3.3)")
    bw_gbps: float = P(256.0, "GB/s", "PE DMA <-> router bandwidth")
    distance_mm: float = P(0.5, "mm", "PE <-> router distance (kbtrace default)")


@dataclass(frozen=True, slots=True)
class HbmParams:
    """Per-PE HBM controller slice (pseudo-channels selected by address bits)."""
    pcs_per_pe: int = P(8, "-", "pseudo-channels per PE slice (power of 2)")
    pc_bw_gbps: float = P(32.0, "GB/s", "bandwidth per pseudo-channel")
    burst_bytes: int = P(256, "bytes", "burst = flit size (power of 2)")
    efficiency: float = P(1.0, "-", "effective/spec bandwidth (ADR-0034 D9: 1.0; ADR-0004 uses 0.8)")
    capacity_gb: int = P(48, "GB", "HBM capacity per cube, split evenly over PE slices")
    overhead_ns: float = P(0.0, "ns", "controller per-transaction overhead")
    switch_penalty_ns: float = P(0.0, "ns", "read/write turnaround penalty per PC")
    router_bw_gbps: float = P(256.0, "GB/s", "router <-> hbm_ctrl link bandwidth (x efficiency at build time, ADR-0004)")
    distance_mm: float = P(0.5, "mm", "router <-> hbm_ctrl distance (kbtrace default; keeps every hop > 0 ns)")


@dataclass(frozen=True, slots=True)
class SramParams:
    """Cube-shared SRAM scratchpad on the NoC."""
    router: tuple = P((3, 0), "-", "[row, col] of the router the SRAM attaches to (ADR-0017 D4)")
    router_bw_gbps: float = P(128.0, "GB/s", "SRAM <-> router link bandwidth, each way (ADR-0041 D5: "
                              "one 128 GB/s edge, the narrowest link on an SRAM path)")
    size_mb: int = P(32, "MB", "capacity (address window is 32 MB)")
    overhead_ns: float = P(2.0, "ns", "access overhead (kbtrace default)")


@dataclass(frozen=True, slots=True)
class MCpuParams:
    """Per-cube management CPU (launch fan-out, completion aggregation)."""
    router: tuple = P((2, 0), "-", "[row, col] of the router M_CPU attaches to (ADR-0017 D4)")
    overhead_ns: float = P(5.0, "ns", "command-processing overhead")


@dataclass(frozen=True, slots=True)
class CubeParams:
    """Cube (AHBM die) level."""
    mesh: MeshParams = _sub(MeshParams)
    pes: PeLinkParams = _sub(PeLinkParams)
    hbm: HbmParams = _sub(HbmParams)
    sram: SramParams = _sub(SramParams)
    m_cpu: MCpuParams = _sub(MCpuParams)


# ----------------------------------------------------------------------------- PE

@dataclass(frozen=True, slots=True)
class PeCpuParams:
    """Scalar control core running the kernel body."""
    clock_ghz: float = P(1.0, "GHz", "PE_CPU clock (kbtrace default)")
    dispatch_cycles: int = P(1, "cycles", "cycles to issue one tl.* op (ADR-0046 D6)")


@dataclass(frozen=True, slots=True)
class SchedulerParams:
    """The single dispatcher inside a PE."""
    overhead_ns: float = P(1.0, "ns", "per-command dispatch overhead (kbtrace default)")


@dataclass(frozen=True, slots=True)
class DmaParams:
    """DMA engine: one read and one write channel, each held through its round trip."""
    read_channels: int = P(1, "-", "DMA_READ channel capacity")
    write_channels: int = P(1, "-", "DMA_WRITE channel capacity")
    overhead_ns: float = P(2.0, "ns", "descriptor setup, charged once per DMA when it starts "
                              "(kbtrace default; data arriving at the DMA pays no overhead)")


@dataclass(frozen=True, slots=True)
class FetchStoreParams:
    """TCM <-> register-file gateway."""
    bw_gbps: float = P(512.0, "GB/s", "fetch/store bandwidth (ADR-0021 D7)")


@dataclass(frozen=True, slots=True)
class GemmParams:
    """MAC array: a rows x cols output-stationary array; K streams through."""
    mac_rows: int = P(32, "-", "MAC array rows (kbtrace default)")
    mac_cols: int = P(32, "-", "MAC array columns (kbtrace default)")
    clock_ghz: float = P(1.0, "GHz", "GEMM clock (kbtrace default)")
    pipeline_cycles: int = P(16, "cycles", "fill/drain latency per tile (kbtrace default)")


@dataclass(frozen=True, slots=True)
class MathParams:
    """SIMD vector unit; latency = max(overhead_ns, ceil(elems/lanes)*cycles_per_op/clock)."""
    simd_lanes: int = P(64, "-", "elements per cycle (kbtrace default)")
    clock_ghz: float = P(1.0, "GHz", "MATH clock (kbtrace default)")
    overhead_ns: float = P(4.0, "ns", "minimum latency of one math op (kbtrace default)")
    transcendental_cycles: int = P(4, "cycles", "cycles per lane-group for exp/log/sqrt/sin/cos/sigmoid")


@dataclass(frozen=True, slots=True)
class TcmParams:
    """PE-local scratchpad with independent read and write channels."""
    size_kb: int = P(2048, "KB", "TCM capacity (ADR-0001: PE_TCM 2 MB)")
    scratch_kb: int = P(1024, "KB", "part of TCM reserved for compute outputs (ADR-0046 D5: 1 MiB)")
    read_bw_gbps: float = P(512.0, "GB/s", "read channel bandwidth (ADR-0040)")
    write_bw_gbps: float = P(512.0, "GB/s", "write channel bandwidth (ADR-0040)")


@dataclass(frozen=True, slots=True)
class TileParams:
    """Hardware tile of composite ops (ADR-0044: TILE_M/K/N = 32/64/32)."""
    m: int = P(32, "-", "tile rows of the output")
    k: int = P(64, "-", "tile reduction length")
    n: int = P(32, "-", "tile columns of the output")


@dataclass(frozen=True, slots=True)
class IpcqTierParams:
    """Cost of touching one IPCQ slot in a given memory tier."""
    bw_gbps: float = P(512.0, "GB/s", "slot read/write bandwidth")
    overhead_ns: float = P(0.0, "ns", "slot access overhead")


@dataclass(frozen=True, slots=True)
class IpcqParams:
    """PE-to-PE queues: slots, credits and the buffer tier."""
    n_slots: int = P(4, "-", "slots per (direction, rx) buffer")
    slot_bytes: int = P(4096, "bytes", "slot size; larger messages use several slots")
    credit_bytes: int = P(16, "bytes", "credit-return message size")
    buffer_kind: str = P("tcm", "-", "where slots live: tcm | sram | hbm")
    tcm: IpcqTierParams = _sub(IpcqTierParams)
    sram: IpcqTierParams = field(default_factory=lambda: IpcqTierParams(512.0, 2.0),
                                 metadata={"unit": "", "doc": "SRAM tier (512 GB/s, 2 ns; ADR-0041)"})
    hbm: IpcqTierParams = field(default_factory=lambda: IpcqTierParams(256.0, 6.0),
                                metadata={"unit": "", "doc": "HBM tier (256 GB/s per PE, 6 ns; "
                                          "commit 533e699)"})


@dataclass(frozen=True, slots=True)
class PeParams:
    """PE level: the pipeline components."""
    pe_cpu: PeCpuParams = _sub(PeCpuParams)
    scheduler: SchedulerParams = _sub(SchedulerParams)
    dma: DmaParams = _sub(DmaParams)
    fetch_store: FetchStoreParams = _sub(FetchStoreParams)
    gemm: GemmParams = _sub(GemmParams)
    math: MathParams = _sub(MathParams)
    tcm: TcmParams = _sub(TcmParams)
    tile: TileParams = _sub(TileParams)
    ipcq: IpcqParams = _sub(IpcqParams)
    link_distance_mm: float = P(0.2, "mm", "wire length of pe_internal links (kbtrace default; keeps every hop > 0 ns)")


@dataclass(frozen=True, slots=True)
class TopologyParams:
    """The whole tray. YAML top-level keys: name, system, sip, cube, pe."""
    name: str = P("default", "-", "topology name (reports, run ids)")
    system: SystemParams = _sub(SystemParams)
    sip: SipParams = _sub(SipParams)
    cube: CubeParams = _sub(CubeParams)
    pe: PeParams = _sub(PeParams)


def iter_params(cls: type = TopologyParams, prefix: str = "", inst: Any = None) -> list[tuple[str, Any, str, str]]:
    """Flatten the parameter tree: ``(yaml_path, default, unit, doc)`` rows (README reference).

    Recurses into the *default instances* (not fresh ``type()`` instances), so a
    sub-section whose default differs from its class defaults (``pe.ipcq.sram``)
    reports its real defaults.
    """
    rows: list[tuple[str, Any, str, str]] = []
    inst = cls() if inst is None else inst
    for f in fields(cls):
        path = f"{prefix}{f.name}"
        val = getattr(inst, f.name)
        if is_dataclass(val):
            rows.extend(iter_params(type(val), path + ".", val))
        elif isinstance(val, tuple) and val and is_dataclass(val[0]):
            rows.append((path, val, f.metadata.get("unit", ""), f.metadata.get("doc", "")))
            rows.extend(iter_params(type(val[0]), path + "[].", val[0]))
        else:
            rows.append((path, val, f.metadata.get("unit", ""), f.metadata.get("doc", "")))
    return rows

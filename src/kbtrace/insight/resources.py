"""Resource classes: groups of topology parameters that one design decision moves together.

Each class names the ``--set`` keys (YAML paths, ``topology.params``) that make that
resource faster, and in which sense: a ``rate`` (bandwidth, clock) is multiplied by the
factor, a ``time`` (overhead, set-up) is divided by it, a ``count`` (slots) is multiplied
and rounded (at least 1). ``scaled(params, name, factor)`` returns the overrides that make
the class ``factor`` times faster (``factor < 1``: slower). Keys under
``sip.io_chiplets[]`` live in a list; they come back as one ``sip.io_chiplets`` override
holding every chiplet with its fields scaled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kbtrace.errors import UsageError
from kbtrace.topology.params import TopologyParams

__all__ = ["Knob", "ResourceClass", "RESOURCES", "resource_names", "scaled", "get_param",
           "check_resources"]

SENSES = ("rate", "time", "count")


@dataclass(frozen=True, slots=True)
class Knob:
    """One topology parameter of a resource class and the sense in which it speeds it up."""
    key: str      # YAML path; ``sip.io_chiplets[].FIELD`` for the chiplets' list
    sense: str    # rate | time | count


@dataclass(frozen=True, slots=True)
class ResourceClass:
    name: str
    doc: str
    knobs: tuple[Knob, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k.key for k in self.knobs)


def _rc(name: str, doc: str, *knobs: tuple[str, str]) -> ResourceClass:
    return ResourceClass(name, doc, tuple(Knob(k, s) for k, s in knobs))


#: The classes in declaration order (also the tie-break order of rankings).
RESOURCES: tuple[ResourceClass, ...] = (
    _rc("mesh", "cube NoC: router-router and PE-router link bandwidth",
        ("cube.mesh.link_bw_gbps", "rate"), ("cube.pes.bw_gbps", "rate")),
    _rc("ucie", "die-to-die UCIe connection bandwidth",
        ("sip.ucie.conn_bw_gbps", "rate")),
    _rc("pcie", "host / inter-SIP PCIe link bandwidth",
        ("system.pcie.bw_gbps", "rate")),
    _rc("io", "IO-chiplet NoC bandwidth",
        ("sip.io_chiplets[].noc_bw_gbps", "rate")),
    _rc("overheads", "router and node per-transaction overheads (routers, UCIe endpoints, "
        "PCIe switch and EP, IO_CPU, M_CPU, SRAM, HBM controller)",
        ("cube.mesh.router_overhead_ns", "time"), ("sip.ucie.overhead_ns", "time"),
        ("system.pcie.switch_overhead_ns", "time"), ("system.host.overhead_ns", "time"),
        ("sip.io_chiplets[].pcie_ep_overhead_ns", "time"),
        ("sip.io_chiplets[].io_noc_overhead_ns", "time"),
        ("sip.io_chiplets[].io_cpu_overhead_ns", "time"),
        ("sip.io_chiplets[].ucie_overhead_ns", "time"),
        ("cube.m_cpu.overhead_ns", "time"), ("cube.sram.overhead_ns", "time"),
        ("cube.hbm.overhead_ns", "time")),
    _rc("hbm", "HBM pseudo-channel bandwidth (and the controller's router link that carries it)",
        ("cube.hbm.pc_bw_gbps", "rate"), ("cube.hbm.router_bw_gbps", "rate")),
    _rc("sram", "cube SRAM router-link bandwidth",
        ("cube.sram.router_bw_gbps", "rate")),
    _rc("dma", "DMA descriptor set-up per transfer",
        ("pe.dma.overhead_ns", "time")),
    _rc("gemm", "GEMM (MAC array) clock",
        ("pe.gemm.clock_ghz", "rate")),
    _rc("math", "MATH (SIMD) clock",
        ("pe.math.clock_ghz", "rate")),
    _rc("tcm", "TCM read/write channels and the fetch/store gateway bandwidth",
        ("pe.tcm.read_bw_gbps", "rate"), ("pe.tcm.write_bw_gbps", "rate"),
        ("pe.fetch_store.bw_gbps", "rate")),
    _rc("ipcq", "IPCQ slots per buffer and credit-return size, slot-tier bandwidth and overhead",
        ("pe.ipcq.n_slots", "count"), ("pe.ipcq.credit_bytes", "time"),
        ("pe.ipcq.tcm.bw_gbps", "rate"), ("pe.ipcq.sram.bw_gbps", "rate"),
        ("pe.ipcq.hbm.bw_gbps", "rate"), ("pe.ipcq.sram.overhead_ns", "time"),
        ("pe.ipcq.hbm.overhead_ns", "time")),
    _rc("dispatch", "PE_CPU clock and scheduler dispatch overhead",
        ("pe.pe_cpu.clock_ghz", "rate"), ("pe.scheduler.overhead_ns", "time")),
)

_BY_NAME = {r.name: r for r in RESOURCES}


def resource_names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def check_resources(names: list[str] | tuple[str, ...] | None, where: str) -> tuple[str, ...]:
    """Validate resource class names (None = all, in declaration order)."""
    if not names:
        return resource_names()
    for n in names:
        if n not in _BY_NAME:
            raise UsageError(f"{where}: unknown resource class {n!r}; use one of "
                             f"{', '.join(_BY_NAME)}")
    return tuple(dict.fromkeys(names))


def get_param(params: TopologyParams, key: str) -> Any:
    """The value of a dotted parameter path (``pe.gemm.clock_ghz``)."""
    obj: Any = params
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _scale(value: Any, sense: str, factor: float) -> Any:
    """``value`` made ``factor`` times faster; an integer parameter stays an integer (>= 1)."""
    out = float(value) / factor if sense == "time" else float(value) * factor
    if isinstance(value, int) and not isinstance(value, bool):
        return max(1, round(out)) if value >= 1 else round(out)
    return out


def scaled(params: TopologyParams, name: str, factor: float) -> dict[str, Any]:
    """Overrides that make resource class ``name`` ``factor`` times faster on ``params``."""
    if factor <= 0:
        raise UsageError(f"factor {factor}: must be > 0 (2 = twice as fast, 0.5 = half)")
    rc = _BY_NAME[name]
    out: dict[str, Any] = {}
    chiplet: list[Knob] = []
    for k in rc.knobs:
        if k.key.startswith("sip.io_chiplets[]."):
            chiplet.append(k)
        else:
            out[k.key] = _scale(get_param(params, k.key), k.sense, factor)
    if chiplet:
        rows = [asdict(c) for c in params.sip.io_chiplets]
        for row in rows:
            for k in chiplet:
                f = k.key.rsplit(".", 1)[1]
                row[f] = _scale(row[f], k.sense, factor)
        out["sip.io_chiplets"] = rows
    return out

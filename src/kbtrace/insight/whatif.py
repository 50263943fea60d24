"""What-if re-timing: a recorded run re-timed with changed parameters, without a replay.

Model. Every op's latency is the sum of its hops' ``crit_ns`` (``schema.HOPS``): the hops
are *segments* of the op's critical path, in hop order, starting at its issue. A segment's
``crit_ns`` splits into a wait (``min(queue_ns, crit_ns)``, at its start) and a service part
(the rest). A parameter change re-prices the service part (``pricing.Pricer``: link
bandwidth, propagation and node overheads from the compiled topologies' ``links`` /
``nodes`` tables; HBM pseudo-channel bandwidth, GEMM and MATH clocks, fetch/store and IPCQ
tier bandwidth, DMA set-up from the parameters). A transfer that crossed its path unqueued
is re-priced with fast mode's free-path wormhole closed form (its bottleneck link can
change); a MATH op is ``max(overhead, compute / clock)`` with its compute from its shape.
Every recorded time inside an op maps to the new timeline by a piecewise-linear warp over
its segments.

Waits are re-derived, not kept: a hop that waited in the recording waited for some event
that happened at its service start (``t_enter_ns + queue_ns``) -- the end of another hop on
the same resource (the resource's recorded service order), of the matching IPCQ send, of a
dependency. ``_binders`` finds that event by time (same resource first, then the op's IPCQ
match and dependencies, then any); the new wait is ``max(0, new event time - new arrival)``.
An op's issue is re-derived the same way from its program-order predecessor and
dependencies. One pass over those events in recorded time order (ops' issues and waiting
hops; the segments in between are vectorised) re-times the run.

What it cannot see: a resource's service order is the recorded one. Where the new times
would reorder two users of an exclusive resource (HBM controller, link, GEMM, MATH), or
make a user that did not wait overlap its predecessor, the replay would schedule them
differently: ``WhatIf`` counts those places (``flips``, ``new_overlaps``), names the
resources, and estimates the makespan error by their summed overlap plus the critical waits
kept as recorded (``error_bound_ns``; an estimate, not a guarantee: errors that travel
through IPCQ waits or node overheads are not seen there). A flag means "replay this one". Waits whose cause is not found
(fast mode's shared-rate link waits) keep their recorded length (``unexplained_waits``).
IPCQ slot counts re-bind each send's credit wait to the receive it now waits for
(``credits``). Parameters that change tile plans, routes or placement, and runs with
composite ops, are refused with a pointer to ``exact=True``, which replays.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbtrace.errors import UsageError
from kbtrace.insight.base import BaseRun, load_base
from kbtrace.insight.retime import Retimer

__all__ = ["whatif", "WhatIf", "RETIMABLE", "Retimer"]

#: Parameters the re-timing prices analytically (prefixes of YAML paths).
RETIMABLE = (
    "cube.mesh.link_bw_gbps", "cube.mesh.router_overhead_ns", "cube.pes.bw_gbps",
    "cube.pes.distance_mm", "cube.mesh.pitch_mm",
    "cube.hbm.pc_bw_gbps", "cube.hbm.efficiency", "cube.hbm.router_bw_gbps",
    "cube.hbm.overhead_ns", "cube.hbm.distance_mm",
    "cube.sram.router_bw_gbps", "cube.sram.overhead_ns", "cube.m_cpu.overhead_ns",
    "sip.ucie.conn_bw_gbps", "sip.ucie.overhead_ns", "sip.ucie.seam_mm",
    "sip.ucie.conn_distance_mm", "sip.io_chiplets", "system.pcie.", "system.host.",
    "system.ns_per_mm",
    "pe.gemm.clock_ghz", "pe.math.clock_ghz", "pe.math.overhead_ns", "pe.dma.overhead_ns",
    "pe.scheduler.overhead_ns", "pe.pe_cpu.", "pe.fetch_store.bw_gbps", "pe.tcm.read_bw_gbps",
    "pe.tcm.write_bw_gbps", "pe.ipcq.tcm.", "pe.ipcq.sram.", "pe.ipcq.hbm.",
    "pe.ipcq.credit_bytes", "pe.ipcq.n_slots", "pe.ipcq.slot_bytes", "pe.link_distance_mm",
)


@dataclass
class WhatIf:
    """A re-timed run: the new makespan and where the estimate may be off."""
    run_dir: Path
    changes: dict[str, Any]
    base_makespan_ns: float
    makespan_ns: float
    exact: bool = False
    flips: int = 0                 # exclusive-resource users whose new order differs
    new_overlaps: int = 0          # users that did not wait and now overlap a predecessor
    error_bound_ns: float = 0.0    # their summed overlap + the waits kept: an error estimate
    unexplained_waits: int = 0     # recorded waits kept as recorded (cause not found)
    late_binders: int = 0          # events used before they were re-timed (ties)
    hot: list[tuple[str, int]] = field(default_factory=list)   # resources with flips/overlaps
    wall_s: float = 0.0

    @property
    def delta_pct(self) -> float:
        return 100.0 * (self.makespan_ns - self.base_makespan_ns) / self.base_makespan_ns

    @property
    def order_stable(self) -> bool:
        return self.exact or (self.flips == 0 and self.new_overlaps == 0)

    def frame(self) -> Any:
        """One row: the change, both makespans and the order-flip diagnostics
        (``--format csv|md|json``)."""
        import polars as pl
        return pl.DataFrame([{
            "run": str(self.run_dir),
            "changes": ", ".join(f"{k}={v}" for k, v in self.changes.items()),
            "base_makespan_ns": self.base_makespan_ns, "makespan_ns": self.makespan_ns,
            "delta_pct": self.delta_pct, "exact": self.exact,
            "order_stable": self.order_stable, "flips": self.flips,
            "new_overlaps": self.new_overlaps, "error_bound_ns": self.error_bound_ns,
            "unexplained_waits": self.unexplained_waits, "wall_s": self.wall_s}])

    def text(self) -> str:
        what = ", ".join(f"{k}={v}" for k, v in self.changes.items())
        how = "replayed (--exact)" if self.exact else "re-timed on the recorded graph"
        lines = [f"whatif {what}: makespan {self.base_makespan_ns:,.1f} -> "
                 f"{self.makespan_ns:,.1f} ns ({self.delta_pct:+.2f}%), {how} in "
                 f"{self.wall_s:.3f} s"]
        if not self.exact:
            if self.order_stable:
                lines.append("  recorded service order holds at every exclusive resource "
                             "(estimate within the model's error; see docs)")
            else:
                where = ", ".join(f"{r} ({n})" for r, n in self.hot[:3])
                lines.append(f"  order could flip: {self.flips} reordered and "
                             f"{self.new_overlaps} newly overlapping resource users "
                             f"(most at {where}); error estimate +-{self.error_bound_ns:,.1f} ns "
                             f"({100 * self.error_bound_ns / self.base_makespan_ns:.1f}%); "
                             "--exact replays")
            if self.unexplained_waits:
                lines.append(f"  {self.unexplained_waits} recorded waits kept as recorded "
                             "(their cause was not found)")
        return "\n".join(lines)


def _check_keys(changes: dict[str, Any]) -> None:
    for key in changes:
        if not any(key == r or (r.endswith(".") and key.startswith(r)) for r in RETIMABLE):
            raise UsageError(f"whatif --set {key}: the re-timing cannot price this parameter "
                             "(it changes tile plans, routes, buffers or placement); add --exact "
                             "to replay instead")


def whatif(run: str | os.PathLike[str], changes: dict[str, Any], *, exact: bool = False,
           topology: str | os.PathLike[str] | None = None,
           overrides: dict[str, Any] | None = None,
           retimer: Retimer | None = None) -> WhatIf:
    """Re-time ``run`` with topology ``changes`` (``{"cube.hbm.pc_bw_gbps": 48}``) on its
    recorded dependency graph; ``exact``: replay instead (into a temporary directory).
    ``retimer``: a ``Retimer`` of this run, prepared once for many what-ifs."""
    from kbtrace.topology import compile_topology

    if not changes:
        raise UsageError("whatif: nothing to change; give --set KEY=VALUE")
    t0 = time.perf_counter()
    base = retimer.base if retimer is not None else load_base(run, topology, overrides,
                                                               where="whatif")
    new_topo = compile_topology(base.topology_path, overrides={**base.overrides, **changes})
    if exact:
        return _replay(base, new_topo, changes, t0)
    _check_keys(changes)
    if (len(new_topo.nodes) != len(base.topology.nodes)
            or len(new_topo.links) != len(base.topology.links)):
        raise UsageError("whatif: the change alters the topology's graph; add --exact")
    rt = retimer if retimer is not None else Retimer(base)
    if rt.composite:
        raise UsageError(f"whatif: {base.run_dir} has {rt.composite} composite op(s), whose "
                         "tile pipelines the re-timing does not model; add --exact to replay")
    est = rt.retime(new_topo)
    return WhatIf(base.run_dir, dict(changes), base.makespan_ns, est.makespan_ns,
                  flips=est.flips, new_overlaps=est.new_overlaps,
                  error_bound_ns=est.error_bound_ns, unexplained_waits=rt.unexplained,
                  late_binders=est.late, hot=est.hot, wall_s=time.perf_counter() - t0)


def _replay(base: BaseRun, topo: Any, changes: dict[str, Any], t0: float) -> WhatIf:
    import tempfile

    from kbtrace.replay import ReplayOptions, replay
    with tempfile.TemporaryDirectory(prefix="kbtrace-whatif-") as tmp:
        r = replay(base.trace_dir, topo, ReplayOptions(
            fidelity=base.fidelity, out_dir=str(Path(tmp) / "run"),
            check_invariants=base.check_invariants))
    return WhatIf(base.run_dir, dict(changes), base.makespan_ns, r.makespan_ns, exact=True,
                  wall_s=time.perf_counter() - t0)

"""Replay options and the ``Run`` handle returned by ``replay``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kbtrace.errors import ReplayError

__all__ = ["ReplayOptions", "Run", "Progress", "FIDELITIES", "add_hbm_pcs"]

#: ``flit``: per-flit events (the reference); ``fast``: closed-form per-transfer timing with
#: streams that meet on a link served together (``fabric/fair.py``); ``fast-fcfs``: the same
#: without moving a booking once made (a transfer keeps what it found when it started): up to
#: ~3x faster than ``fast`` where many streams meet, and late under contention (README,
#: Replay -> Fidelity modes)
FIDELITIES = ("flit", "fast", "fast-fcfs")


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """How to replay.

    ``fidelity``: ``flit`` (per-flit events, the reference) or ``fast`` (closed-form
    per-transfer wormhole timing). ``out_dir``: run directory (default
    ``data/runs/<trace>-<topology>-<fidelity>``). ``batch_rows``: hop rows per
    Parquet batch (bounds memory). ``check_invariants``: run the physical checks.
    ``hbm_pcs``: also write ``hbm_pcs.parquet`` (``schema.HBM_PCS``: what each HBM
    pseudo-channel served when; the Perfetto export draws a track per pseudo-channel from
    it). Only ``fidelity`` and ``check_invariants`` enter the run id; output location,
    batching and the pseudo-channel log do not change results.
    """
    fidelity: str = "fast"
    out_dir: str | None = None
    batch_rows: int = 65_536
    check_invariants: bool = True
    hbm_pcs: bool = False

    def __post_init__(self) -> None:
        if self.fidelity not in FIDELITIES:
            raise ReplayError(f"options.fidelity: unknown fidelity {self.fidelity!r}; "
                              f"use one of {', '.join(FIDELITIES)}")
        if self.batch_rows < 1:
            raise ReplayError(f"options.batch_rows: {self.batch_rows} must be >= 1")

    def key(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("out_dir", "batch_rows", "hbm_pcs"):
            d.pop(k)
        return d


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a running replay is (``replay(..., progress=fn)`` calls ``fn`` with one of these
    every ``PROGRESS_EVERY`` SimPy events and once when the simulation ends)."""
    ops_done: int
    ops: int
    events: int
    sim_ns: float
    wall_s: float

    @property
    def fraction(self) -> float:
        return self.ops_done / self.ops if self.ops else 1.0


@dataclass(frozen=True, slots=True)
class Run:
    """A finished replay: where it was written and its headline figures."""
    run_dir: Path
    run_id: str
    fidelity: str
    makespan_ns: float
    ops: int
    hops: int
    events: int
    wall_s: float

    def op_timing(self) -> pa.Table:
        return pq.read_table(self.run_dir / "op_timing.parquet")

    def hops_table(self) -> pa.Table:
        return pq.read_table(self.run_dir / "hops.parquet")


def add_hbm_pcs(p: Any) -> None:
    """The ``--hbm-pcs`` flag of ``kbtrace replay`` and ``kbtrace run`` (``hbm_pcs``)."""
    p.add_argument("--hbm-pcs", action="store_true",
                   help="also write hbm_pcs.parquet: what each HBM pseudo-channel served when "
                        "(the Perfetto timeline then has a track per pseudo-channel)")

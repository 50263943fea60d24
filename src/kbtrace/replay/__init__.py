"""Replay stage: SimPy timing of captured traces against a compiled topology.

Role: play a trace (``ops.parquet``) on a ``Topology`` and record where time goes.
Inputs: a trace directory (or ``Trace``), a ``Topology`` (or YAML path),
``ReplayOptions`` (fidelity ``flit`` | ``fast``, output directory), optionally a
``progress`` callback (``Progress``: ops done, events, simulated and wall time).
Outputs: a run directory with ``op_timing.parquet`` (``schema.OP_TIMING``),
``hops.parquet`` (``schema.HOPS``), ``nodes.parquet`` / ``links.parquet`` (a copy
of the topology tables) and ``run.json``; the ``Run`` handle.
Phases: build -> elaborate -> run -> finalize (``engine``); components:
``fabric`` (a package: links and forwarding nodes, flit and fast modes; ``fabric.booking``
holds fast mode's reservation arithmetic), ``hbm`` (per-PE controller), ``pe`` (the wiring
of a PE) with ``cpu`` (PE_CPU) and ``stations`` (scheduler, DMA, fetch/store, GEMM, MATH,
TCM, IPCQ servers; fast mode runs both compiled with the compiled core), ``plans`` (pure tile-plan generator), ``intervals`` (busy-interval lists of
fast mode's exclusive resources), ``recorder`` (columnar outputs), ``invariants``
(physical checks). ``sweep``: many replays of traces on topologies over a grid of
parameter values (``kbtrace sweep``; hive-partitioned run directories plus
``points.parquet``), its config read by ``sweep_config``.

Imports run one way: ``engine`` builds the components and imports them; they see the
simulation through ``context.SimContext`` (a protocol ``engine.Sim`` satisfies), never
``engine`` itself (``tests/test_replay_structure.py``).
"""

from __future__ import annotations

from kbtrace.replay.engine import replay
from kbtrace.replay.options import FIDELITIES, Progress, ReplayOptions, Run

__all__ = ["replay", "ReplayOptions", "Run", "Progress", "FIDELITIES"]

from kbtrace._callable import make_module_callable  # noqa: E402

make_module_callable(__name__, "replay")  # kbtrace.replay(...) calls replay()

"""``SimContext``: what the components (``pe``, ``invariants``) may use of the simulation.

``engine.Sim`` builds the components and satisfies this protocol; the components are
typed against it, not against ``Sim``, so the imports run one way (``engine`` imports
``pe``, ``invariants``, ``fabric``, ``recorder``; none of them imports ``engine``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import simpy

    from kbtrace.replay.fabric.base import Fabric
    from kbtrace.replay.hbm import HbmController
    from kbtrace.replay.ops import Op
    from kbtrace.replay.recorder import Recorder
    from kbtrace.topology.params import TopologyParams

__all__ = ["SimContext"]


class SimContext(Protocol):
    """The shared simulation context (``engine.Sim``) as the components see it."""

    topo: Any                               # the compiled Topology
    params: TopologyParams
    source: Any                             # the trace's ops (``source.OpSource``)
    n_ops: int
    sends: dict[int, Op]                    # IPCQ sends issued, not yet received
    env: simpy.Environment
    hbm: dict[int, HbmController]           # node index -> its controller
    rec: Recorder
    fabric: Fabric
    fast: bool
    pe_model: Any                           # ``stations`` or its compiled twin (``Pe``)
    pe_cpu: Any                             # ``cpu.Cpu`` or its compiled twin (``Pe``)
    host: int                               # the host's node index
    launches: list[dict[str, float]]
    _done: bytearray                        # per op: 1 once completed
    _resolved: dict[int, int]               # address -> node memo (``resolve``)
    _ready: dict[int, simpy.Event]          # IPCQ send id -> data in the receiver's slots
    _match: dict[int, int]                  # recv id -> send id
    ipcq_waiting: dict[int, int]            # IPCQ send id -> slots it waits for
    ipcq_held: dict[tuple[int, int, int, str], list[int]]   # rx buffer -> sends holding slots

    def plan(self, op: Op) -> Any: ...
    def on_done(self, op_id: int, fn: Callable[[], Any]) -> None: ...
    def complete(self, op: Op, t_issue: float, t_start: float, engine: str) -> None: ...
    def resolve(self, addr: int) -> int: ...
    def copy_end(self, mem: int) -> int: ...
    def hbm_read(self, op_id: int, tile: int, src: int, dst: int, addr: int,
                 nbytes: int) -> Any: ...
    def dma_read(self, op_id: int, tile: int, dma: int, addr: int,
                 nbytes: int) -> Generator[Any, Any, None]: ...
    def dma_write(self, op_id: int, tile: int, dma: int, addr: int,
                  nbytes: int) -> Generator[Any, Any, None]: ...
    def peer_pe(self, op: Op) -> Any: ...                  # the ``pe.Pe`` of op's peer
    def match_of(self, recv: Op) -> int: ...
    def ipcq_params(self, op: Op) -> tuple[int, int, str]: ...
    def ipcq_channel(self, send: Op) -> tuple[simpy.Container, int]: ...
    def ipcq_ready(self, send_id: int) -> simpy.Event: ...
    def slot_access(self, op_id: int, pe: Any, nbytes: int, write: bool,
                    kind: str | None = None) -> Generator[Any, Any, None]: ...

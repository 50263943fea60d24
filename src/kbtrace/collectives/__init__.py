"""Collectives: all-reduce algorithms over PEs, cubes and SIPs, as IPCQ kernels.

Role: turn "every shard of this tensor ends holding the elementwise sum of all of
them" into one launch of a kernel that reduces with ``tl.send`` / ``tl.recv`` and
adds, plus the neighbour table that wires its IPCQ directions. Capture runs it like
any kernel, so the trace holds real sends, receives and adds that replay times and
verify checks.

Inputs: a compiled ``Topology`` (SIP count and fabric ``system.sips.topology`` / ``w`` /
``h``, cube mesh, PEs per cube) and the shards of the tensor(s) to reduce (one per
taking-part PE: PE lanes ``0..P-1`` of every cube, or of one cube, on every SIP).
Output: ``w.launch(kernel, grid, args, neighbors, ipcq)`` on the host program.

Phases of ``all_reduce(w, tensors, ...)``: validate the shards (every SIP = rank
present, one dtype and shape, a regular layout) -> ``Geometry`` -> neighbour table
derived from the topology (``neighbors``) -> the algorithm's kernel (``lrab``,
``hier3``, ``ring``) -> one launch.

Algorithms (``../shared/reference``: ADR-0029, ADR-0032, ADR-0050):

* ``lrab`` (ADR-0032): with several PEs per cube, first a bidirectional reduce to PE 0
  of each cube (``intra_E/W``); then, PE lane by lane, (1) row reduce converging on the
  root column, (2) column reduce on it converging on the root row (both sides at once,
  ``E/W/N/S`` = same lane of the mesh-neighbour cube), (3) inter-SIP exchange at the
  root cube (``global_*`` = same cube and lane on the neighbouring SIP: ring_1d ring,
  torus_2d row ring then column ring, mesh_2d row and column chains reduce + broadcast),
  (4) column and (5) row broadcast back, then the broadcast to the cube's PEs. Root at
  the centre cube ``(w // 2, h // 2)`` (``root="corner"``: the SE corner, the
  predecessor's earlier choice); one cube per SIP skips phases 1-2 and 4-5.
* ``hier3`` (ADR-0029): reduce to PE 0 (intra-cube bidirectional ring), to cube 0
  (bidirectional ring over the SIP's cubes, ``N/S`` = previous / next cube), inter-SIP
  exchange at cube 0, broadcast back down both levels.
* ``ring``: one flat ring over every taking-part PE in (SIP, cube, PE) order
  (``E`` = next, ``W`` = previous): reduce-scatter then all-gather, P - 1 steps each.

Imports run one way: this package uses ``kbtrace.errors`` and the topology it is
given; ``kbtrace.capture`` (``Workload.all_reduce``) imports it, never the reverse.
"""

from kbtrace.collectives.dist import Distributed
from kbtrace.collectives.geometry import SIP_TOPOLOGIES, Geometry
from kbtrace.collectives.host import ALGORITHMS, OPS, ROOTS, all_reduce, neighbor_table

__all__ = ["all_reduce", "Distributed", "Geometry", "neighbor_table", "ALGORITHMS", "ROOTS",
           "OPS", "SIP_TOPOLOGIES"]

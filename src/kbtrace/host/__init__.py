"""Host runtime: what a host program does around its kernels, as the predecessor's users wrote it.

Role
    The layer a workload's ``build(w, p)`` uses to place tensors over SIPs, cubes and PEs,
    to work per rank (rank = SIP, ADR-0024), to move data between host and device, and to
    build tensor-parallel layers (ADR-0027). It emits nothing by itself: every call ends in
    the capture ``Workload`` (tensors, launches, host copies), so traces, replay and
    verify see ordinary ops.
Inputs
    a capture ``Workload`` (``w``), its topology (``w.topo``), the workload's parameters.
Outputs
    tensor placements (``ShardSpec`` lists), launches, ``h2d`` / ``d2h`` copy ops.
Modules
    ``placement``  ``DPPolicy`` (replicate / row_wise / column_wise / tiled_* at cube and PE
                   level, ADR-0026) -> ``ShardSpec(sip, cube, pe, offset_bytes, nbytes)``.
    ``tp``         tensor parallelism (ADR-0027): TP groups, ``RankTensor``,
                   ``ColumnParallelLinear`` / ``RowParallelLinear``, region primitives.
Ranks and sparse launches live on the capture ``Workload`` itself (they are what the capture
engine runs): ``w.world_size``, ``w.ranks``, ``w.per_rank(...)``, ``w.tensor(..., dp=, sip=)``,
``w.launch(kernel, sips=, cubes=, pes=, on=)``; kernels ask ``tl.sip_id() / cube_id() /
pe_id() / num_sips() / num_cubes() / num_pes()``. So do host memory and copies:
``w.host_tensor(...)``, ``w.copy_to_device(src, dst)``, ``w.copy_to_host(src, dst=None)``
(``h2d`` / ``d2h`` ops in the host program's order, ``kbtrace.capture.hostcopy``).
Imports are one way: ``host`` imports ``capture``, never the reverse (capture takes a
placement policy by duck typing: any object with ``resolve(...)``).
"""

from kbtrace.host import tp
from kbtrace.host.placement import POLICIES, DPPolicy, ShardSpec, resolve_dp_policy, tile_grid

__all__ = ["DPPolicy", "ShardSpec", "POLICIES", "resolve_dp_policy", "tile_grid", "tp"]

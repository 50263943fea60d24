"""A sweep point's replay cost, predicted before it runs, so that ``-j N`` hands out the
largest points first on a sweep's first run too (issue 22, target 7).

The points of one trace replay the same ops, yet they do not cost the same: fast mode's
fair share (``fabric/fair.py``) does its work when a stream reaches a link that has not the
bandwidth it needs while flows booked earlier still arrive there. On gemm (15,872 ops,
``small.yaml``) a point whose HBM slice reads faster than the link out of its controller
costs ~2x one whose slice does not; a link narrower further along the path costs
1.1-1.4x; a slower HBM slice costs less (fewer reads in flight at once). Handed out in
config order, the costliest point of such a sweep may start last and run alone.

``cost(job)`` = the trace's ops (``_sweepsafe.work``: x ``FLIT_OP_COST`` in flit mode)
x ``contention(params)``, the point's topology parameters read from its YAML and grid
values (no graph is built), where, with ``src`` the HBM slice bandwidth per PE
(``pcs_per_pe x pc_bw_gbps x efficiency``), ``exit`` the controller's router link
(``router_bw_gbps x efficiency``) and ``path`` the narrower of the mesh and PE links:

* ``src`` above ``exit``: ``1 + min(1, src / exit - 1)`` (streams meet at the controller);
* else ``src`` above ``path``: ``1 + PATH_WEIGHT`` (they meet further on);
* else ``0.5 + 0.5 src / path`` (a slower slice: fewer reads in flight at once);
* a point whose topology does not compile: 0 (it fails at once: hand it out last).

In flit mode the factor is 1: its cost, per flit event, did not follow the HBM speed on
gemm (1,664 ops, 9.2-10.7 CPU s at 16 to 64 GB/s per channel, 128 or 256 GB/s exit).

Only the order of the points depends on it (never their outputs). It is asked for only
where the points hold enough work for workers (``_sweepsafe.execute``; at ``-j 1`` too,
to record the order ``-j N`` would take, ``SweepCpu.jobs``), once per topology and
distinct values of the grid keys it reads (~2.4 ms each). What it does not see: how much of a trace's traffic reads HBM in
parallel streams (softmax, one read per block at a time, costs the same at 16 to 128
GB/s per channel, where gemm doubles), and routes across cubes (UCIe). fast-fcfs has no
fair share, yet its points' cost followed the same order on gemm (0.63, 0.71, 1.20 CPU s
at 16, 32, 64 GB/s per channel; 0.88 at 32 with a 128 GB/s exit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kbtrace.replay._sweepsafe import work

__all__ = ["contention", "cost", "PATH_WEIGHT"]

#: the extra cost of streams that meet on a link past the HBM controller's (measured
#: 1.1-1.4x on gemm: mesh links of 32-128 GB/s, PE links of 128 GB/s)
PATH_WEIGHT = 0.25

_PARAMS: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_TEXT: dict[str, str] = {}


#: the parameters ``contention`` reads (a grid key elsewhere does not change it)
_READS = ("cube.hbm", "cube.mesh", "cube.pes")


def _reads(key: str) -> bool:
    return any(key == r or key.startswith(r + ".") or r.startswith(key + ".") for r in _READS)


def _params(topology: str, overrides: Mapping[str, Any]) -> Any:
    """The point's ``TopologyParams`` (YAML plus the grid values ``contention`` reads; no
    graph built; ~2.4 ms), or None when they do not compile; cached per topology and those
    values."""
    overrides = {k: v for k, v in overrides.items() if _reads(k)}
    key = (topology, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
    if key not in _PARAMS:
        from kbtrace._yaml import read_text
        from kbtrace.topology._spec import apply_overrides, build_params, load_yaml
        try:
            if topology not in _TEXT:
                _TEXT[topology] = read_text(topology)
            raw = apply_overrides(load_yaml(_TEXT[topology], topology), dict(overrides),
                                  topology)
            _PARAMS[key] = build_params(raw, topology, dict(overrides))
        except Exception:  # noqa: BLE001 - the point reports it when it runs
            _PARAMS[key] = None
    return _PARAMS[key]


def contention(params: Any) -> float:
    """The cost factor of a point's topology parameters (see the module docstring);
    0.0 for None (parameters that do not compile)."""
    if params is None:
        return 0.0
    cube = params.cube
    h = cube.hbm
    src = h.pcs_per_pe * h.pc_bw_gbps * h.efficiency
    exit_ = h.router_bw_gbps * h.efficiency
    path = min(cube.mesh.link_bw_gbps, cube.pes.bw_gbps)
    if src <= 0 or exit_ <= 0 or path <= 0:
        return 1.0
    if src > exit_:
        return 1.0 + min(1.0, src / exit_ - 1.0)
    if src > path:
        return 1.0 + PATH_WEIGHT
    return 0.5 + 0.5 * src / path


def cost(job: Mapping[str, Any]) -> float:
    """A point's predicted replay cost (``job``: ``Point.as_json()`` plus ``out``), in
    fast-mode ops of an uncontended point; 0 when its trace is not captured yet or its
    topology does not compile."""
    ops = work(dict(job))
    if not ops:
        return 0.0
    f = contention(_params(str(job.get("topology", "")), job.get("params") or {}))
    return ops * (float(f > 0) if job.get("fidelity") == "flit" else f)

"""Calibration scenarios: single-flow and hot-target PE DMA reads, replayed on a topology.

Each scenario is a small synthetic trace (one ``load`` op per issuing PE, built straight
from ``schema.OPS`` rows) replayed alone with the fast fidelity; its figure is the span
from the first issue to the last completion of those loads, in ns. They mirror the
predecessor's PE_DMA perf harness (reference ``commitlog.md`` section "PE_DMA perf
harness", ADR-0049's PE DMA cases): issuer ``sip0.cube0.pe0`` unless stated.

=====================  ======================================================
``local``              PE0 reads its own HBM slice
``same_half``          PE0 reads PE1's slice (same cube, same half)
``cross_half``         PE0 reads PE4's slice (same cube, far half)
``cross_cube_best``    PE0 reads PE0's slice of the adjacent cube (cube 1)
``cross_cube_worst``   PE0 reads PE0's slice of the farthest cube (the last one)
``cross_sip``          PE0 reads PE0's slice of cube 0 on SIP 1
``hot_N``              PEs 1..N of cube 0 read PE0's slice at once (N = 1..7)
``all_to_pe0``         all PEs of cube 0 read PE0's slice at once
=====================  ======================================================

plus ``probe:CASE`` for every case of ``kbtrace probe`` (issue 20's library, which landed
after these scenarios were written): ``probe:h2d-2hop``, ``probe:pe-local-hbm``, ...
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kbtrace import schema
from kbtrace.errors import UsageError
from kbtrace.topology import address

__all__ = ["SCENARIOS", "PROBE", "scenario_ops", "predict", "check_scenario"]

#: ``probe:CASE`` is a case of ``kbtrace probe`` (``studies.probe``: H2D / D2H over N cube
#: hops, PE DMA writes), its figure the probe's ``actual_ns``.
PROBE = "probe:"
SCENARIOS = ("local", "same_half", "cross_half", "cross_cube_best", "cross_cube_worst",
             "cross_sip", "hot_N", "all_to_pe0")
_HOT = re.compile(r"^hot_([1-9][0-9]*)$")


class _Trace:
    """A synthetic trace for ``replay`` (duck-types ``capture.Trace``)."""

    def __init__(self, name: str, rows: list[dict[str, Any]]) -> None:
        full = []
        for i, r in enumerate(rows):
            row = {f.name: schema.field_default(f) for f in schema.OPS}
            row.update(op_id=i, name=r["kind"], **r)
            full.append(row)
        self.table = pa.Table.from_pylist(full, schema=schema.OPS)
        self.path = None
        self.meta = {"workload": f"calibration-{name}",
                     "content_hash": {"ops": f"calibration-{name}-{len(rows)}"},
                     "topology": {"name": "calibration"}}

    def ops(self) -> pa.Table:
        return self.table


def _load(topo: Any, program: int, reader: tuple[int, int, int], src: tuple[int, int, int],
          nbytes: int) -> dict[str, Any]:
    s, c, p = reader
    ss, sc, sp = src
    return {"launch": 0, "program": program, "pid0": p, "pid1": c, "sip": s, "cube": c, "pe": p,
            "seq": 0, "kind": "load", "src_space": "hbm",
            "src_addr": address.hbm_addr(ss, sc, sp * topo.hbm_slice_bytes),
            "dst_space": "tcm", "dst_addr": address.pe_tcm_addr(s, c, p, 0),
            "nbytes": nbytes, "out_shape": [nbytes // 4], "out_dtype": "f32"}


def check_scenario(name: str, topo: Any, where: str) -> None:
    """Raise ``UsageError`` when ``name`` is not a scenario or does not fit ``topo``."""
    if name.startswith(PROBE):
        from kbtrace.studies.probe import probe_cases
        names = [c.name for c in probe_cases(topo)]
        if name[len(PROBE):] not in names:
            raise UsageError(f"{where}: no probe case {name[len(PROBE):]!r} on "
                             f"{topo.params.name!r}; use {PROBE}NAME with one of "
                             f"{', '.join(names)}")
        return
    scenario_ops(name, topo, 4096, where)


def scenario_ops(name: str, topo: Any, nbytes: int, where: str = "scenario") -> _Trace:
    p = topo.params
    pes, cubes, sips = p.cube.pes.count, p.sip.cube_mesh_w * p.sip.cube_mesh_h, p.system.sips.count
    need = {"same_half": (2, 1, 1), "cross_half": (5, 1, 1), "cross_cube_best": (1, 2, 1),
            "cross_cube_worst": (1, 2, 1), "cross_sip": (1, 1, 2), "all_to_pe0": (2, 1, 1)}
    m = _HOT.match(name)
    if name not in SCENARIOS and not m:
        raise UsageError(f"{where}: unknown scenario {name!r}; use one of "
                         f"{', '.join(SCENARIOS)} (hot_N: N = 1..PEs-1)")
    if m:
        need[name] = (int(m.group(1)) + 1, 1, 1)
    np_, nc, ns = need.get(name, (1, 1, 1))
    if pes < np_ or cubes < nc or sips < ns:
        raise UsageError(f"{where}: scenario {name!r} needs {np_} PE(s) per cube, {nc} cube(s) "
                         f"and {ns} SIP(s); topology {p.name!r} has {pes}, {cubes} and {sips}")
    if nbytes < 4 or nbytes % 4:
        raise UsageError(f"{where}: nbytes {nbytes}: use a positive multiple of 4")
    me = (0, 0, 0)
    src = {"local": (0, 0, 0), "same_half": (0, 0, 1), "cross_half": (0, 0, 4),
           "cross_cube_best": (0, 1, 0), "cross_cube_worst": (0, cubes - 1, 0),
           "cross_sip": (1, 0, 0)}
    if name in src:
        rows = [_load(topo, 0, me, src[name], nbytes)]
    else:
        n = pes - 1 if name == "all_to_pe0" else int(m.group(1)) if m else 0
        first = 0 if name == "all_to_pe0" else 1
        rows = [_load(topo, i, (0, 0, first + i), (0, 0, 0), nbytes)
                for i in range(n + (1 if name == "all_to_pe0" else 0))]
    return _Trace(name, rows)


def predict(topo: Any, cases: list[tuple[str, int]]) -> list[float]:
    """Replay each (scenario, nbytes) alone on compiled ``topo``; its span in ns (first
    issue to last completion of the scenario's loads)."""
    from kbtrace.replay import ReplayOptions, replay

    out = []
    with tempfile.TemporaryDirectory(prefix="kbtrace-calibrate-") as tmp:
        for i, (name, nbytes) in enumerate(cases):
            if name.startswith(PROBE):
                from kbtrace.studies.probe import run_probe
                res = run_probe(topo, case=name[len(PROBE):], nbytes=nbytes)
                out.append(float(res.cases["actual_ns"][0]))
                continue
            trace = scenario_ops(name, topo, nbytes)
            run = replay(trace, topo, ReplayOptions(out_dir=str(Path(tmp) / str(i)),
                                                    check_invariants=False))
            t = pq.read_table(run.run_dir / "op_timing.parquet",
                              columns=["t_issue_ns", "t_end_ns"])
            out.append(float(np.max(t.column("t_end_ns").to_numpy())
                             - np.min(t.column("t_issue_ns").to_numpy())))
    return out

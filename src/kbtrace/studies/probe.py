"""``kbtrace probe``: single transfers replayed alone, against their analytical lower bound.

The predecessor's probe (ADR-0010 D5, ADR-0049) as a library: ``run_probe(topo)`` returns
frames, the CLI prints them. Each case is one memory transfer in a trace of its own,
replayed alone by the real engine (``kbtrace.replay.replay``), so there is no cross-talk:

* ``h2d-Nhop``: the host writes ``nbytes`` into PE 0's HBM slice of a SIP-0 cube ``N`` cube
  hops from the IO chiplet (an ``h2d`` op, entering the tray where the replay injects host
  copies: the SIP's PCIe EP by default, as the reference's probe, ``system.host.copy_from``). The cubes are chosen on the topology's own
  layout: for each N, the lowest-numbered cube whose host route crosses N cube entries (the
  IO chiplet's UCIe into its shoreline cube counts 1, every cube-to-cube seam 1 more).
  On ``default.yaml`` (one IO chiplet on the W side) that is cubes 0, 1, 2, 3: the
  reference's 0, 4, 8, 12 are all shoreline cubes here, one hop each.
* ``d2h-Nhop``: the host reads the same slices back (``d2h``: a command out, data back).
* ``pe-*``: PE 0 of sip0.cube0 writes ``nbytes`` by DMA (a ``store`` op) into an HBM slice:
  ``pe-local-hbm`` its own, ``pe-same-half-hbm`` the nearest other PE's, ``pe-cross-half-hbm``
  the farthest PE's of the same cube, ``pe-cross-cube-hbm-best`` / ``-worst`` PE 0's slice of
  the SIP's cube with the lowest / highest route lower bound, ``pe-cross-sip-hbm`` PE 0's
  slice of cube 0 on SIP 1 (when there is one).

Per case (ADR-0049 D4): ``actual_ns`` (the op's replayed duration: issue to completion for
host copies, DMA start to completion for PE DMA), the lower-bound parts ``overhead_ns``
(node overheads of every leg, command and data, the issuing node's own included), ``wire_ns``, ``drain_ns`` (nbytes over the
bottleneck link), ``commit_ns`` (the HBM burst commit of a write), their sum ``lb_ns`` (the probe formula),
``floor_ns`` (the wormhole bound the replay's invariants check: overheads after the
bottleneck link overlap its drain, so ``lb_ns`` can exceed what a transfer takes, e.g. host
copies whose UCIe and router overheads come after the PCIe link),
``efficiency = floor_ns / actual_ns``, ``eff_bw_gbps = nbytes / actual_ns``, the bottleneck link
and its bandwidth, ``util = eff_bw_gbps / bn_bw_gbps``. The sweep repeats every case over
``SWEEP_SIZES`` (4 KiB - 1 MiB).

Invariants (ADR-0049 D5, plus the ADR-0010 D5 ordering) are judged at ``nbytes``:
H2D and D2H strictly increase with hops, D2H >= H2D at each hop count, cross-cube best <
worst, and local <= cross-PE <= cross-cube <= cross-SIP, comparing the nearest case of each
group: the farthest cube of a SIP can be slower than the next SIP (the predecessor measured
573 ns to its worst remote cube and 409 ns to the other SIP, commitlog §6), so the ordering is
about distance classes, not every pair. A case left out by ``case=`` skips the checks that
need it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kbtrace import schema
from kbtrace.errors import UsageError
from kbtrace.topology.model import PeCoord

__all__ = ["ProbeCase", "ProbeResult", "SWEEP_SIZES", "DEFAULT_NBYTES", "probe_cases",
           "run_probe", "run_transfer", "ops_table", "TraceTable"]

DEFAULT_NBYTES = 32768            # ADR-0049 D2
SWEEP_SIZES = (4096, 16384, 65536, 262144, 1048576)   # ADR-0049 D3
_CUBE_ENTRY = ("io_to_cube", "ucie_mesh")             # link kinds that enter a cube


@dataclass(frozen=True)
class ProbeCase:
    """One transfer: ``kind`` h2d / d2h (host side) or store (PE DMA from ``src``)."""
    name: str
    category: str                 # h2d | d2h | pe_dma
    kind: str                     # h2d | d2h | store
    dst: PeCoord                  # owner of the HBM slice written / read
    src: PeCoord | None = None    # the issuing PE (PE DMA)
    hops: int | None = None       # cube hops (host cases)
    group: str = ""               # local | cross_pe | cross_cube | cross_sip (PE DMA)


@dataclass
class ProbeResult:
    """``cases``: one row per case at ``nbytes``; ``sweep``: case x size; ``invariants``:
    name, ok, detail; ``hops``: the replayed hops of every case at ``nbytes``."""
    topology: str
    nbytes: int
    fidelity: str
    cases: pl.DataFrame
    sweep: pl.DataFrame | None
    invariants: pl.DataFrame
    hops: pl.DataFrame

    @property
    def ok(self) -> bool:
        return bool(self.invariants["ok"].all()) if self.invariants.height else True

    def as_json(self) -> dict[str, Any]:
        return {"topology": self.topology, "nbytes": self.nbytes, "fidelity": self.fidelity,
                "ok": self.ok, "cases": self.cases.to_dicts(),
                "sweep": self.sweep.to_dicts() if self.sweep is not None else None,
                "invariants": self.invariants.to_dicts()}


# --------------------------------------------------------------------------- cases

def copy_end(topo: Any, sip: int) -> Any:
    """Where a host copy enters the tray (the replay's rule, ``system.host.copy_from``): the
    SIP's PCIe EP (the reference's injection point, the default) or the host."""
    if topo.params.system.host.copy_from == "host":
        return topo.host
    return topo.pcie_ep(sip)


def _cube_hops(topo: Any, dst: PeCoord) -> int:
    r = topo.route(copy_end(topo, dst.sip), topo.hbm_ctrl(dst))
    return sum(1 for li in r.links if topo.links[li].kind in _CUBE_ENTRY)


def probe_cases(topo: Any) -> list[ProbeCase]:
    """The cases for this topology, in report order (h2d, d2h, PE DMA)."""
    by_hops: dict[int, int] = {}
    for c in range(topo.cubes_per_sip):
        by_hops.setdefault(_cube_hops(topo, PeCoord(0, c, 0)), c)
    host = [(h, by_hops[h]) for h in range(1, 5) if h in by_hops]
    out = [ProbeCase(f"h2d-{h}hop", "h2d", "h2d", PeCoord(0, c, 0), hops=h) for h, c in host]
    out += [ProbeCase(f"d2h-{h}hop", "d2h", "d2h", PeCoord(0, c, 0), hops=h) for h, c in host]
    src = PeCoord(0, 0, 0)
    dma = topo.pe_node(src, "dma")

    def lb(dst: PeCoord) -> float:
        return topo.route(dma, topo.hbm_ctrl(dst)).lower_bound_ns(DEFAULT_NBYTES)

    out.append(ProbeCase("pe-local-hbm", "pe_dma", "store", src, src, group="local"))
    others = [PeCoord(0, 0, p) for p in range(1, topo.pes_per_cube)]
    if others:
        near = min(others, key=lambda d: (lb(d), d.pe))
        far = max(others, key=lambda d: (lb(d), -d.pe))
        out.append(ProbeCase("pe-same-half-hbm", "pe_dma", "store", near, src, group="cross_pe"))
        if far != near:
            out.append(ProbeCase("pe-cross-half-hbm", "pe_dma", "store", far, src,
                                 group="cross_pe"))
    cubes = [PeCoord(0, c, 0) for c in range(1, topo.cubes_per_sip)]
    if cubes:
        best = min(cubes, key=lambda d: (lb(d), d.cube))
        worst = max(cubes, key=lambda d: (lb(d), -d.cube))
        out.append(ProbeCase("pe-cross-cube-hbm-best", "pe_dma", "store", best, src,
                             group="cross_cube"))
        if worst != best:
            out.append(ProbeCase("pe-cross-cube-hbm-worst", "pe_dma", "store", worst, src,
                                 group="cross_cube"))
    if topo.n_sips > 1:
        out.append(ProbeCase("pe-cross-sip-hbm", "pe_dma", "store", PeCoord(1, 0, 0), src,
                             group="cross_sip"))
    return out


# --------------------------------------------------------------------------- traces

def ops_table(rows: list[dict[str, Any]]) -> pa.Table:
    """An ``ops`` table (``schema.OPS``) from partial rows: a missing nullable column is null,
    a missing list column empty, any other missing column 0 / false / ''."""
    cols = {}
    for f in schema.OPS:
        def default(f=f):
            if f.nullable:
                return None
            t = f.type
            if pa.types.is_list(t) or pa.types.is_large_list(t):
                return []
            if pa.types.is_boolean(t):
                return False
            if pa.types.is_dictionary(t) or pa.types.is_string(t):
                return ""
            return 0
        vals = [r.get(f.name, default()) for r in rows]
        typ = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        arr = pa.array(vals, typ)
        cols[f.name] = arr.dictionary_encode() if pa.types.is_dictionary(f.type) else arr
    return pa.Table.from_pydict(cols, schema=schema.OPS)


@dataclass
class TraceTable:
    """A trace held in memory (what ``replay`` accepts besides a directory)."""
    table: pa.Table
    meta: dict[str, Any]
    path: Path | None = None

    def ops(self) -> pa.Table:
        return self.table


def _case_ops(topo: Any, case: ProbeCase, nbytes: int) -> list[dict[str, Any]]:
    from kbtrace.topology import address
    addr = topo.hbm_base(case.dst)
    shape = [nbytes // 4]
    if case.kind in ("h2d", "d2h"):
        d = case.dst
        row = {"op_id": 0, "kind": case.kind, "name": case.kind, "sip": d.sip, "cube": d.cube,
               "pe": d.pe, "nbytes": nbytes, "out_shape": shape, "out_dtype": "f32"}
        if case.kind == "h2d":
            row.update(dst_space="hbm", dst_addr=addr)
        else:
            row.update(src_space="hbm", src_addr=addr)
        return [row]
    s = case.src
    assert s is not None
    tcm = address.pe_tcm_addr(s.sip, s.cube, s.pe, 0)
    return [{"op_id": 0, "kind": "store", "name": "store", "sip": s.sip, "cube": s.cube,
             "pe": s.pe, "pid0": s.pe, "pid1": s.sip * topo.cubes_per_sip + s.cube,
             "src_space": "tcm", "src_addr": tcm, "dst_space": "hbm", "dst_addr": addr,
             "nbytes": nbytes, "out_shape": shape, "out_dtype": "f32"}]


def run_transfer(topo: Any, rows: list[dict[str, Any]], name: str, fidelity: str = "fast",
                 work: Path | None = None) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, Any]]:
    """Replay the ops ``rows`` (see ``ops_table``) alone on ``topo``: (op_timing, hops with
    node ids, run.json). ``work``: where the run directory goes (a temporary one if None)."""
    import json

    from kbtrace.replay import replay
    from kbtrace.replay.options import ReplayOptions
    trace = TraceTable(ops_table(rows), {"workload": name,
                                         "topology": {"name": topo.params.name}})
    with tempfile.TemporaryDirectory(prefix="kbtrace-probe-", dir=work) as tmp:
        run = replay(trace, topo, ReplayOptions(fidelity=fidelity, out_dir=str(Path(tmp) / name)))
        ot = pl.from_arrow(pq.read_table(run.run_dir / "op_timing.parquet"))
        hops = pl.from_arrow(pq.read_table(run.run_dir / "hops.parquet"))
        meta = json.loads((run.run_dir / "run.json").read_text())
    ids = pl.DataFrame({"node_idx": [n.idx for n in topo.nodes],
                        "node": [n.id for n in topo.nodes]},
                       schema={"node_idx": pl.Int32, "node": pl.Utf8})
    assert isinstance(ot, pl.DataFrame) and isinstance(hops, pl.DataFrame)
    hops = hops.join(ids, on="node_idx", how="left").sort(["op_id", "hop"])
    return ot, hops, meta


def _legs(topo: Any, case: ProbeCase) -> tuple[Any, list[Any]]:
    """(the data route, the command-only routes) of a case."""
    mem = topo.hbm_ctrl(case.dst)
    end = copy_end(topo, case.dst.sip)
    if case.kind == "h2d":
        return topo.route(end, mem), []
    if case.kind == "d2h":
        return topo.route(mem, end), [topo.route(end, mem)]
    dma = topo.pe_node(case.src, "dma")
    return topo.route(dma, mem), [topo.route(mem, dma)]


def _measure(topo: Any, case: ProbeCase, nbytes: int, fidelity: str,
             work: Path | None) -> tuple[dict[str, Any], pl.DataFrame]:
    ot, hops, _meta = run_transfer(topo, _case_ops(topo, case, nbytes), case.name, fidelity, work)
    row = ot.row(0, named=True)
    t0 = row["t_issue_ns"] if case.kind in ("h2d", "d2h") else row["t_start_ns"]
    actual = row["t_end_ns"] - t0
    data, cmds = _legs(topo, case)
    # the issuing engine's own cost (routes leave out the source): the DMA's 2 ns by default
    issuer = topo.params.pe.dma.overhead_ns if case.kind == "store" else 0.0
    overhead = issuer + data.overhead_ns + sum(r.overhead_ns for r in cmds)
    wire = data.wire_ns + sum(r.wire_ns for r in cmds)
    drain = nbytes / data.bottleneck_gbps if data.bottleneck_gbps > 0 else 0.0
    commit = max(0.0, round(data.lower_bound_ns(nbytes) - data.overhead_ns - data.wire_ns - drain,
                            9))
    lb = overhead + wire + drain + commit
    floor = issuer + data.floor_ns(nbytes) + sum(r.floor_ns(0) for r in cmds)
    bn = min((topo.links[li] for li in data.links if topo.links[li].bw_gbps > 0),
             key=lambda lk: (lk.bw_gbps, lk.idx))
    eff_bw = nbytes / actual if actual > 0 else 0.0
    return {
        "case": case.name, "category": case.category, "hops": case.hops,
        "src": topo.nodes[data.nodes[0]].id, "dst": topo.nodes[data.nodes[-1]].id,
        "nbytes": nbytes,
        "actual_ns": actual, "overhead_ns": overhead, "wire_ns": wire, "drain_ns": drain,
        "commit_ns": commit, "lb_ns": lb, "floor_ns": floor,
        "efficiency": floor / actual if actual > 0 else 0.0,
        "eff_bw_gbps": eff_bw, "bn_bw_gbps": bn.bw_gbps,
        "util": eff_bw / bn.bw_gbps if bn.bw_gbps > 0 else 0.0,
        "bottleneck": f"{topo.nodes[bn.src].id} -> {topo.nodes[bn.dst].id}",
        "route_links": len(data.links) + sum(len(r.links) for r in cmds),
    }, hops.with_columns(pl.lit(case.name).alias("case"))


# --------------------------------------------------------------------------- invariants

def _invariants(cases: list[ProbeCase], actual: dict[str, float]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(name: str, ok: bool, detail: str) -> None:
        out.append({"invariant": name, "ok": bool(ok), "detail": detail})

    def fmt(names: list[str]) -> str:
        return ", ".join(f"{n} {actual[n]:.1f}" for n in names)

    for cat in ("h2d", "d2h"):
        names = [c.name for c in cases if c.category == cat]
        if len(names) > 1:
            lat = [actual[n] for n in names]
            add(f"{cat.upper()} increases with cube hops",
                all(a < b for a, b in zip(lat, lat[1:], strict=False)), fmt(names) + " ns")
    h2d = {c.hops: c.name for c in cases if c.category == "h2d" and c.hops is not None}
    d2h = {c.hops: c.name for c in cases if c.category == "d2h" and c.hops is not None}
    both = sorted(set(h2d) & set(d2h))
    if both:
        add("D2H >= H2D at every hop count", all(actual[d2h[h]] >= actual[h2d[h]] for h in both),
            "; ".join(f"{h} hop(s): D2H {actual[d2h[h]]:.1f} vs H2D {actual[h2d[h]]:.1f}"
                      for h in both) + " ns")
    if "pe-cross-cube-hbm-best" in actual and "pe-cross-cube-hbm-worst" in actual:
        names = ["pe-cross-cube-hbm-best", "pe-cross-cube-hbm-worst"]
        add("PE DMA cross-cube best < worst", actual[names[0]] < actual[names[1]],
            fmt(names) + " ns")
    groups = [(g, [c.name for c in cases if c.group == g])
              for g in ("local", "cross_pe", "cross_cube", "cross_sip")]
    groups = [(g, n) for g, n in groups if n]
    if len(groups) > 1:
        near = [(g, min(ns, key=actual.__getitem__)) for g, ns in groups]
        ok = all(actual[a] <= actual[b] for (_, a), (_, b) in zip(near, near[1:], strict=False))
        add("PE DMA local <= cross-PE <= cross-cube <= cross-SIP (nearest of each)", ok,
            " <= ".join(f"{n} {actual[n]:.1f}" for _, n in near) + " ns")
    return out


# --------------------------------------------------------------------------- run

def run_probe(topology: Any, case: str = "all", nbytes: int = DEFAULT_NBYTES, *,
              sweep: bool = False, fidelity: str = "fast",
              sizes: tuple[int, ...] = SWEEP_SIZES) -> ProbeResult:
    """Replay every case (or the one named ``case``) alone; see the module docstring."""
    from kbtrace.replay.options import FIDELITIES
    from kbtrace.topology import compile_topology
    topo = compile_topology(topology) if isinstance(topology, (str, Path)) else topology
    if nbytes <= 0 or nbytes % 4:
        raise UsageError(f"--nbytes {nbytes}: use a positive multiple of 4 bytes, e.g. 32768")
    if fidelity not in FIDELITIES:
        raise UsageError(f"fidelity {fidelity!r}: use one of {', '.join(FIDELITIES)}")
    cases = probe_cases(topo)
    if case != "all":
        sel = [c for c in cases if c.name == case]
        if not sel:
            raise UsageError(f"--case {case!r}: no such probe case on {topo.params.name!r}; "
                             f"use all or one of {', '.join(c.name for c in cases)}")
        cases = sel
    rows, hops = [], []
    with tempfile.TemporaryDirectory(prefix="kbtrace-probe-") as work:
        for c in cases:
            r, h = _measure(topo, c, nbytes, fidelity, Path(work))
            rows.append(r)
            hops.append(h)
        sweep_rows = [_measure(topo, c, n, fidelity, Path(work))[0]
                      for c in cases for n in sizes] if sweep else None
    frame = pl.DataFrame(rows)
    inv = _invariants(cases, {r["case"]: r["actual_ns"] for r in rows})
    inv_df = pl.DataFrame(inv, schema={"invariant": pl.Utf8, "ok": pl.Boolean,
                                       "detail": pl.Utf8})
    return ProbeResult(topo.params.name, nbytes, fidelity, frame,
                       pl.DataFrame(sweep_rows) if sweep_rows is not None else None, inv_df,
                       pl.concat(hops, how="diagonal_relaxed"))

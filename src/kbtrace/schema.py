"""Every Arrow schema kbtrace reads or writes: the single source of truth.

Writers, readers, SQL view DDL, tests and the README's file-format section all
import from here. Each field carries metadata ``unit`` (``ns``, ``bytes``,
``GB/s``, ``mm``, ``-``) and ``doc``; column names carry their unit as a suffix
(``t_start_ns``, ``nbytes``, ``bw_gbps``, ``distance_mm``).

Tables
------
topology  ``nodes``, ``links``          (compile_topology, cached by content hash)
capture   ``ops``, ``memory``           (ops.parquet, memory.parquet + trace.json)
replay    ``op_timing``, ``hops``       (op_timing.parquet, hops.parquet + run.json)
sweep     ``sweep_points``              (points.parquet + sweep.json; grid columns appended)
insight   ``attribution``               (attribution.parquet of `kbtrace attribute`)

Bump ``SCHEMA_VERSION`` whenever a column is added, removed, renamed or changes
meaning; readers refuse files written with another major version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from kbtrace.errors import SchemaError

__all__ = [
    "SCHEMA_VERSION",
    "field_default",
    "NODE_KINDS",
    "LINK_KINDS",
    "OP_KINDS",
    "SPACES",
    "DTYPES",
    "STAGES",
    "BREAKDOWN_STAGES",
    "DIRECTIONS",
    "NODES",
    "LINKS",
    "OPS",
    "MEMORY",
    "OP_TIMING",
    "HOPS",
    "HBM_PCS",
    "SWEEP_POINTS",
    "ATTRIBUTION",
    "TABLES",
    "check_schema",
    "check_version",
    "schema_markdown",
]

#: Major.minor. Readers accept any minor of the same major.
SCHEMA_VERSION = "1.0"

# --------------------------------------------------------------------------- enums
# Dictionary-encoded string columns take their values from these tuples.

NODE_KINDS = (
    "host", "switch",                                    # tray
    "pcie_ep", "io_cpu", "io_noc", "io_ucie", "io_conn",  # IO chiplet
    "router", "ucie", "ucie_conn", "hbm_ctrl", "sram", "m_cpu",  # cube
    "pe_cpu", "scheduler", "dma", "fetch_store", "gemm", "math", "tcm", "ipcq",  # PE
)

LINK_KINDS = (
    "pe_internal",      # between components of one PE
    "pe_to_router",     # PE DMA / PE CPU <-> its router
    "router_mesh",      # router <-> router inside a cube
    "router_to_hbm",    # router <-> hbm_ctrl.peX
    "router_to_sram",   # router <-> cube SRAM
    "router_to_mcpu",   # router <-> M_CPU (command path)
    "ucie_internal",    # ucie endpoint <-> its connections
    "router_to_ucie",   # router <-> ucie connection
    "ucie_mesh",        # ucie endpoint (cube A) <-> ucie endpoint (cube B): the seam
    "io_internal",      # inside an IO chiplet
    "io_to_cube",       # IO chiplet ucie <-> shoreline cube ucie
    "pcie",             # host / switch <-> PCIe EP
)

OP_KINDS = (
    "load",       # tl.load: DMA read into TCM (blocking)
    "store",      # tl.store: DMA write from TCM (blocking)
    "dot",        # tl.dot: GEMM on TCM operands (blocking)
    "math",       # unary / binary / ternary / reduction / softmax / operators
    "fill",       # tl.zeros / tl.full / tl.arange: TCM placeholder initialisation
    "composite",  # tl.composite: tiled pipeline (async; completes at its wait)
    "send",       # tl.send: IPCQ send (fire and forget)
    "recv",       # tl.recv / tl.recv_async: IPCQ receive
    "wait",       # tl.wait: join an async op (deps name it)
    "cycles",     # tl.cycles: explicit PE_CPU scalar work
    "h2d",        # host -> device copy over PCIe (host program)
    "d2h",        # device -> host copy over PCIe (host program)
)

SPACES = ("hbm", "tcm", "sram", "ipcq", "host")

DTYPES = ("f32", "f16", "bf16", "i32", "i8", "bool")

#: Stage names of hop rows; the stage breakdown groups by these.
STAGES = (
    "launch", "pe_cpu", "dma_read", "fetch", "gemm", "math", "store", "dma_write",
    "ipcq", "fabric", "hbm", "sram", "pcie",
    "scheduler",  # replay: PE scheduler command dispatch (added by the replay stage)
)

#: Exclusive stages of the per-PE stage breakdown (``_pe_segments``, ``stage_breakdown_pe``,
#: report, diff), derived at analysis time from the hop stages above, in priority order: an
#: instant where several are active goes to the first (time hidden behind compute is not a
#: data-movement cost). ``hbm_queue``: a transfer of the PE waiting for an HBM pseudo-channel
#: (the queue part of its ``hbm`` hop, ``[t_enter_ns, t_enter_ns + queue_ns]``); the rest of a
#: transfer is ``dma_read`` / ``dma_write`` / ``ipcq``; ``other``: launch, pe_cpu, scheduler,
#: PCIe and host copies. A PE's time outside all of them is ``idle`` (not listed here).
#: Derived, not stored: runs recorded before ``hbm_queue`` existed are read as they are.
BREAKDOWN_STAGES = (
    "gemm", "math", "fetch", "store", "hbm_queue", "dma_read", "dma_write", "ipcq", "other",
)

DIRECTIONS = (
    "N", "S", "E", "W",
    "intra_N", "intra_S", "intra_E", "intra_W",
    "global_N", "global_S", "global_E", "global_W",
)


def _f(name: str, typ: pa.DataType, unit: str, doc: str, nullable: bool = False) -> pa.Field:
    return pa.field(name, typ, nullable=nullable, metadata={"unit": unit, "doc": doc})


def _schema(name: str, doc: str, fields: Iterable[pa.Field]) -> pa.Schema:
    return pa.schema(list(fields), metadata={
        "kbtrace.table": name, "kbtrace.schema_version": SCHEMA_VERSION, "doc": doc})


_DICT = pa.dictionary(pa.int16(), pa.string())
_SHAPE = pa.list_(pa.int64())

# --------------------------------------------------------------------------- topology

NODES = _schema("nodes", "One row per node of the compiled topology.", [
    _f("node_idx", pa.int32(), "-", "dense integer id, position in Topology.nodes"),
    _f("node_id", pa.string(), "-", "dotted id, e.g. sip0.cube3.pe5.dma"),
    _f("kind", _DICT, "-", f"node kind, one of {', '.join(NODE_KINDS)}"),
    _f("sip", pa.int16(), "-", "SIP index, null above SIP level", nullable=True),
    _f("cube", pa.int16(), "-", "cube index within the SIP, null outside cubes", nullable=True),
    _f("pe", pa.int16(), "-", "PE index within the cube, null outside PEs", nullable=True),
    _f("overhead_ns", pa.float64(), "ns", "per-transaction overhead charged once (first flit)"),
    _f("x_mm", pa.float64(), "mm", "drawing position within the node's level (cube or SIP)"),
    _f("y_mm", pa.float64(), "mm", "drawing position within the node's level (cube or SIP)"),
])

LINKS = _schema("links", "One row per directed link of the compiled topology.", [
    _f("link_idx", pa.int32(), "-", "dense integer id, position in Topology.links"),
    _f("src_idx", pa.int32(), "-", "source node_idx"),
    _f("dst_idx", pa.int32(), "-", "destination node_idx"),
    _f("src_id", pa.string(), "-", "source node_id"),
    _f("dst_id", pa.string(), "-", "destination node_id"),
    _f("kind", _DICT, "-", f"link kind, one of {', '.join(LINK_KINDS)}"),
    _f("bw_gbps", pa.float64(), "GB/s", "bandwidth; 1 GB/s = 1 byte/ns; 0 = command-only link"),
    _f("distance_mm", pa.float64(), "mm", "physical length"),
    _f("latency_ns", pa.float64(), "ns", "propagation delay = distance_mm * ns_per_mm"),
])

# --------------------------------------------------------------------------- capture

OPS = _schema("ops", "One row per captured op, in capture order (launch, program, seq).", [
    _f("op_id", pa.int64(), "-", "unique id within the trace, dense from 0 in capture order"),
    _f("launch", pa.int32(), "-", "launch index within the workload (0-based)"),
    _f("program", pa.int32(), "-", "flat program index within the launch"),
    _f("pid0", pa.int32(), "-", "tl.program_id(0): PE within cube"),
    _f("pid1", pa.int32(), "-", "tl.program_id(1): cube"),
    _f("sip", pa.int16(), "-", "placement: SIP of the program"),
    _f("cube", pa.int16(), "-", "placement: cube of the program"),
    _f("pe", pa.int16(), "-", "placement: PE of the program"),
    _f("seq", pa.int32(), "-", "program-order sequence number within (launch, program)"),
    _f("kind", _DICT, "-", f"op kind, one of {', '.join(OP_KINDS)}"),
    _f("name", _DICT, "-", "specific op: exp, add, softmax, gemm, ... (= kind for plain ops)"),
    _f("is_async", pa.bool_(), "-", "true for composite and recv_async; completes at a wait"),
    _f("src_space", _DICT, "-", f"space of the data source, one of {', '.join(SPACES)}", nullable=True),
    _f("src_addr", pa.uint64(), "-", "51-bit physical source address", nullable=True),
    _f("dst_space", _DICT, "-", "space of the destination", nullable=True),
    _f("dst_addr", pa.uint64(), "-", "51-bit physical destination address", nullable=True),
    _f("nbytes", pa.int64(), "bytes", "bytes moved (memory/IPCQ) or produced (compute)"),
    _f("in_addrs", pa.list_(pa.uint64()), "-", "compute operand addresses (TCM/HBM), in order"),
    _f("in_spaces", pa.list_(pa.string()), "-", "compute operand spaces"),
    _f("in_shapes", pa.list_(_SHAPE), "-", "compute operand shapes"),
    _f("in_dtypes", pa.list_(pa.string()), "-", "compute operand dtypes"),
    _f("scalars", pa.list_(pa.float64()), "-", "scalar operands (x * 2.0, clamp bounds, fill value)"),
    _f("out_shape", _SHAPE, "-", "result / transferred tensor shape"),
    _f("out_dtype", _DICT, "-", f"result dtype, one of {', '.join(DTYPES)}", nullable=True),
    _f("acc_dtype", _DICT, "-", "accumulation dtype of dot / composite gemm", nullable=True),
    _f("m", pa.int32(), "-", "GEMM rows of the output", nullable=True),
    _f("n", pa.int32(), "-", "GEMM columns of the output", nullable=True),
    _f("k", pa.int32(), "-", "GEMM reduction length", nullable=True),
    _f("axis", pa.int8(), "-", "reduction / softmax axis", nullable=True),
    _f("direction", _DICT, "-", f"IPCQ direction, one of {', '.join(DIRECTIONS)}", nullable=True),
    _f("peer_program", pa.int32(), "-", "IPCQ: flat program index of the peer", nullable=True),
    _f("peer_sip", pa.int16(), "-", "IPCQ: peer SIP", nullable=True),
    _f("peer_cube", pa.int16(), "-", "IPCQ: peer cube", nullable=True),
    _f("peer_pe", pa.int16(), "-", "IPCQ: peer PE", nullable=True),
    _f("ipcq_seq", pa.int32(), "-",
       "IPCQ: sequence number on the (sender, receiver, direction) channel", nullable=True),
    _f("match_op_id", pa.int64(), "-", "IPCQ: op_id of the matching send/recv", nullable=True),
    _f("deps", pa.list_(pa.int64()), "-", "op_ids this op must wait for (data / async joins)"),
    _f("handle_id", pa.int64(), "-", "async handle produced (composite, recv_async)", nullable=True),
    _f("cycles", pa.int64(), "cycles", "PE_CPU cycles (tl.cycles)", nullable=True),
    _f("src_file", _DICT, "-", "kernel source file of the call", nullable=True),
    _f("src_line", pa.int32(), "-", "kernel source line of the call", nullable=True),
    _f("extra_json", pa.string(), "-", "rare extras as JSON (epilogue list, tile_shape, ...)",
       nullable=True),
    _f("out_digest", pa.uint64(), "-",
       "64-bit digest of the op's result in the capture-order golden execution "
       "(verify names the first op whose replay-order result differs)", nullable=True),
    _f("mem_strides", pa.list_(pa.int64()), "-",
       "load/store: element strides of the memory-side (HBM/SRAM) view of a tile of a larger "
       "tensor; empty = contiguous"),
])

MEMORY = _schema("memory", "Initial contents of deployed tensors and reference outputs.", [
    _f("tensor", pa.string(), "-", "tensor name declared by the workload"),
    _f("role", _DICT, "-", "input | output | reference"),
    _f("shard", pa.int32(), "-", "shard index (0 for unsharded tensors); for a reference, "
       "its block index (references are stored in blocks of whole axis-0 rows, ~32 MiB each)"),
    _f("sip", pa.int16(), "-", "placement SIP", nullable=True),
    _f("cube", pa.int16(), "-", "placement cube", nullable=True),
    _f("pe", pa.int16(), "-", "placement PE (HBM slice owner)", nullable=True),
    _f("space", _DICT, "-", "memory space (hbm, sram, tcm)"),
    _f("addr", pa.uint64(), "-", "51-bit physical address of the shard", nullable=True),
    _f("dtype", _DICT, "-", "element dtype"),
    _f("shape", _SHAPE, "-", "shard shape"),
    _f("offset", _SHAPE, "-", "start index of this shard in the full tensor"),
    _f("global_shape", _SHAPE, "-", "shape of the full tensor"),
    _f("nbytes", pa.int64(), "bytes", "shard size"),
    _f("data", pa.large_binary(), "-", "raw little-endian C-order element bytes"),
])

# --------------------------------------------------------------------------- replay

OP_TIMING = _schema("op_timing", "One row per replayed op, sorted by op_id.", [
    _f("op_id", pa.int64(), "-", "ops.op_id"),
    _f("launch", pa.int32(), "-", "ops.launch"),
    _f("program", pa.int32(), "-", "ops.program"),
    _f("sip", pa.int16(), "-", "placement SIP"),
    _f("cube", pa.int16(), "-", "placement cube"),
    _f("pe", pa.int16(), "-", "placement PE"),
    _f("seq", pa.int32(), "-", "ops.seq"),
    _f("kind", _DICT, "-", "ops.kind"),
    _f("name", _DICT, "-", "ops.name"),
    _f("engine", _DICT, "-", "node_id of the engine that executed the op"),
    _f("t_issue_ns", pa.float64(), "ns", "PE_CPU issued the op"),
    _f("t_start_ns", pa.float64(), "ns", "first resource acquired / first hop entered"),
    _f("t_end_ns", pa.float64(), "ns", "op complete (last byte committed / result ready)"),
    _f("queue_ns", pa.float64(), "ns", "time spent waiting for resources between issue and end"),
    _f("nbytes", pa.int64(), "bytes", "ops.nbytes"),
])

HOPS = _schema("hops", "One row per op per hop (fabric link or engine stage).", [
    _f("op_id", pa.int64(), "-", "ops.op_id"),
    _f("hop", pa.int32(), "-", "hop index within the op (0-based, path order)"),
    _f("tile", pa.int32(), "-", "composite tile index, -1 for non-tiled ops"),
    _f("stage", _DICT, "-", f"stage, one of {', '.join(STAGES)}"),
    _f("node_idx", pa.int32(), "-", "node where the hop happens (link source for link hops)"),
    _f("link_idx", pa.int32(), "-", "directed link traversed, -1 for engine/node-only hops"),
    _f("t_enter_ns", pa.float64(), "ns", "head of the transfer entered the hop"),
    _f("t_leave_ns", pa.float64(), "ns", "tail of the transfer left the hop"),
    _f("busy_ns", pa.float64(), "ns",
       "time the resource was exclusively occupied by this hop (serialisation / compute)"),
    _f("queue_ns", pa.float64(), "ns", "time waiting for the resource inside the hop"),
    _f("crit_ns", pa.float64(), "ns",
       "latency attributed to this hop; an op's crit_ns sum to t_end_ns - t_issue_ns"),
    _f("nbytes", pa.int64(), "bytes", "bytes through the hop"),
])

HBM_PCS = _schema(
    "hbm_pcs", "Optional (replay with hbm_pcs / --hbm-pcs): one row per op per HBM "
    "pseudo-channel per run of back-to-back services, sorted by (node_idx, pc, t_start_ns).", [
        _f("node_idx", pa.int32(), "-", "the HBM controller's node (nodes.node_idx)"),
        _f("op_id", pa.int64(), "-", "ops.op_id of the read or write served"),
        _f("pc", pa.int32(), "-", "pseudo-channel, 0 .. cube.hbm.pcs_per_pe - 1"),
        _f("write", pa.bool_(), "-", "a write (true) or a read (false)"),
        _f("t_start_ns", pa.float64(), "ns", "the first burst's service began (after any "
           "read/write turnaround penalty)"),
        _f("t_end_ns", pa.float64(), "ns", "the last burst's service ended"),
        _f("nbytes", pa.int64(), "bytes", "bytes of the bursts served"),
    ])

# --------------------------------------------------------------------------- sweep

SWEEP_POINTS = _schema(
    "sweep_points", "One row per point of a sweep (points.parquet), sorted by point; one typed "
    "column per grid key follows these (named by the key, e.g. cube.hbm.pc_bw_gbps), then one "
    "nullable column per workload grid key (e.g. BM; null for traces not gridded over it).", [
        _f("point", pa.int32(), "-", "index in enumeration order (traces x topologies x "
           "fidelities x grid, the last grid key varying fastest)"),
        _f("trace", pa.string(), "-", "trace name (the trace=... partition)"),
        _f("topology", pa.string(), "-", "topology name (the topology=... partition)"),
        _f("fidelity", pa.string(), "-", "replay fidelity, fast or flit"),
        _f("params_json", pa.string(), "-", "the point's grid values as a JSON object"),
        _f("run_dir", pa.string(), "-", "the point's run directory, relative to the sweep's"),
        _f("status", pa.string(), "-", "ok or error"),
        _f("error", pa.string(), "-", "the error line of a failed point", nullable=True),
        _f("run_id", pa.string(), "-", "run.json run_id", nullable=True),
        _f("makespan_ns", pa.float64(), "ns", "run makespan", nullable=True),
        _f("body_ns", pa.float64(), "ns", "kernel body time: per launch, from the start "
           "barrier to its last program's end, summed over launches (null: no launch)",
           nullable=True),
        _f("ops", pa.int64(), "-", "ops replayed", nullable=True),
        _f("hops", pa.int64(), "-", "hop rows written", nullable=True),
        _f("events", pa.int64(), "-", "SimPy events processed", nullable=True),
    ])

# --------------------------------------------------------------------------- insight

ATTRIBUTION = _schema(
    "attribution", "One row per resource class of `kbtrace attribute` (attribution.parquet): "
    "the run replayed with that class made `factor` times faster and slower; sorted by rank.", [
        _f("rank", pa.int32(), "-", "1 = the class whose speed-up shortens the makespan most "
           "(ties: larger slow-down loss first, then the class order of `kbtrace attribute "
           "--list`)"),
        _f("resource", pa.string(), "-", "resource class name (mesh, hbm, gemm, ...)"),
        _f("keys", pa.string(), "-", "the topology parameters the class scales, comma-separated"),
        _f("factor", pa.float64(), "-", "speed-up factor (bandwidths and clocks x factor, "
           "overheads / factor, slot counts x factor)"),
        _f("base_makespan_ns", pa.float64(), "ns", "makespan of the recorded run"),
        _f("faster_makespan_ns", pa.float64(), "ns", "makespan with the class factor x faster"),
        _f("faster_gain_pct", pa.float64(), "%",
           "makespan saved by the faster class, percent of the base makespan"),
        _f("elasticity", pa.float64(), "-", "ln(base / faster makespan) / ln(factor): 1 = the "
           "makespan scales fully with this resource, 0 = not at all"),
        _f("slower_makespan_ns", pa.float64(), "ns", "makespan with the class factor x slower "
           "(null with --no-reverse)", nullable=True),
        _f("slower_loss_pct", pa.float64(), "%", "makespan added by the slower class, percent "
           "of the base makespan (null with --no-reverse)", nullable=True),
    ])

TABLES: dict[str, pa.Schema] = {
    "nodes": NODES, "links": LINKS, "ops": OPS, "memory": MEMORY,
    "op_timing": OP_TIMING, "hops": HOPS, "hbm_pcs": HBM_PCS, "sweep_points": SWEEP_POINTS,
    "attribution": ATTRIBUTION,
}


# --------------------------------------------------------------------------- checks

def field_default(f: pa.Field) -> Any:
    """The neutral value of a column when building rows by hand (synthetic traces): [] for
    lists, null where nullable, False, "" for strings and dictionaries, else 0."""
    if pa.types.is_list(f.type):
        return []
    if f.nullable:
        return None
    if pa.types.is_boolean(f.type):
        return False
    if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type):
        return ""
    return 0


def check_version(found: str | None, where: str) -> None:
    """Raise SchemaError unless ``found`` has this build's major schema version."""
    if found is None:
        raise SchemaError(f"{where}: no kbtrace schema version recorded; "
                          f"re-create it with this kbtrace (schema {SCHEMA_VERSION})")
    if found.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise SchemaError(f"{where}: written with schema {found}, this kbtrace reads "
                          f"{SCHEMA_VERSION}; re-create it with this kbtrace version")


def check_schema(actual: pa.Schema, expected: pa.Schema, where: str) -> None:
    """Raise SchemaError if ``actual`` lacks a column of ``expected`` or types differ."""
    meta = actual.metadata or {}
    ver = meta.get(b"kbtrace.schema_version")
    check_version(ver.decode() if ver else None, where)
    for fld in expected:
        idx = actual.get_field_index(fld.name)
        if idx < 0:
            raise SchemaError(f"{where}: missing column {fld.name!r}; "
                              f"re-create it with this kbtrace (schema {SCHEMA_VERSION})")
        got = actual.field(idx).type
        if got != fld.type:
            raise SchemaError(f"{where}: column {fld.name!r} has type {got}, expected {fld.type}")


def schema_markdown(schema: pa.Schema) -> str:
    """Render a schema as a markdown table (README file-format section)."""
    lines = ["| column | type | unit | meaning |", "|---|---|---|---|"]
    for fld in schema:
        md = {k.decode(): v.decode() for k, v in (fld.metadata or {}).items()}
        typ = str(fld.type).replace("dictionary<values=string, indices=int16, ordered=0>",
                                    "string (dict)")
        null = "" if not fld.nullable else " (nullable)"
        lines.append(f"| `{fld.name}` | {typ}{null} | {md.get('unit', '')} | {md.get('doc', '')} |")
    return "\n".join(lines)


def schema_json(schema: pa.Schema) -> str:
    """A stable JSON description of a schema (for hashing and trace.json)."""
    return json.dumps([[f.name, str(f.type)] for f in schema], separators=(",", ":"))

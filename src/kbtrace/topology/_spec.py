"""YAML text + overrides -> validated ``TopologyParams`` (phase 1 of compile).

Every user error is raised here as one ``TopologyError`` line naming the file,
the YAML path, the bad value and the fix. Later phases trust the result.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
from dataclasses import fields, is_dataclass, replace
from typing import Any

import yaml

from kbtrace._yaml import DuplicateKey as _DuplicateKey
from kbtrace._yaml import YamlProblem as _YamlProblem
from kbtrace._yaml import load_unique as _safe_load_unique
from kbtrace._yaml import problem as _yaml_problem
from kbtrace.errors import TopologyError
from kbtrace.topology import address
from kbtrace.topology.params import IoChipletParams, TopologyParams

__all__ = ["load_yaml", "apply_overrides", "build_params", "describe", "SIP_TOPOLOGIES", "SIDES"]

SIP_TOPOLOGIES = ("ring_1d", "torus_2d", "mesh_2d")
SIDES = ("N", "S", "E", "W")
#: fields holding [row, col] router coordinates or lists of them
_COORD = {"router"}
_COORD_LISTS = {"hbm_zone", "routers"}


def load_yaml(text: str, where: str) -> dict[str, Any]:
    """Parse YAML; malformed text, a repeated key or an empty file -> TopologyError."""
    try:
        raw = _safe_load_unique(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise TopologyError(f"{where}: malformed YAML at {pos}: {_yaml_problem(exc)}; "
                            "fix the syntax there") from None
    except _YamlProblem as bad:
        raise TopologyError(f"{where}: {bad.message()}") from None
    if raw is None:
        raise TopologyError(f"{where}: the topology file is empty (no keys, only comments or null); "
                            "start from a copy of topologies/small.yaml")
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: top level must be a mapping with keys name/system/sip/cube/pe, "
                            f"got {type(raw).__name__}")
    return raw


def _suggest(key: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(choices)}"


#: keys of earlier versions: what to write instead
_REMOVED = dict.fromkeys(
    ("cube.sram.banks", "cube.sram.bank_bw_gbps"),
    "the SRAM attaches by one link (ADR-0041 D5); set cube.sram.router_bw_gbps (default 128) "
    "instead")


def _unknown(full: str, key: str, choices: list[str]) -> str:
    """How to fix an unknown key: its replacement if it was removed, else a close match."""
    if full in _REMOVED:
        return f"{full} was removed: {_REMOVED[full]}"
    return _suggest(key, choices)


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """Return a copy of ``raw`` with dotted-path overrides (``cube.mesh.link_bw_gbps``) applied."""
    if not overrides:
        return raw
    out = copy.deepcopy(raw)
    for key in sorted(overrides):
        value = overrides[key]
        cls: Any = TopologyParams
        node = out
        parts = key.split(".")
        for i, part in enumerate(parts):
            names = [f.name for f in fields(cls)]
            if part not in names:
                done = ".".join(parts[:i]) or "top level"
                raise TopologyError(f"{where}: override {key!r}: unknown key {part!r} under {done}; "
                                    f"{_unknown('.'.join(parts[:i + 1]), part, names)}")
            fld = next(f for f in fields(cls) if f.name == part)
            sub = getattr(cls(), part)
            if i == len(parts) - 1:
                if is_dataclass(sub):
                    raise TopologyError(f"{where}: override {key!r} names a section; "
                                        f"set one of its keys, e.g. {key}.{fields(sub)[0].name}")
                if isinstance(value, str) and fld.type != "str":
                    value = _parse_value(key, value, where)
                node[part] = value
            else:
                if not is_dataclass(sub):
                    raise TopologyError(f"{where}: override {key!r}: {'.'.join(parts[:i + 1])} "
                                        "is a value, not a section")
                nxt = node.setdefault(part, {})
                if not isinstance(nxt, dict):
                    nxt = node[part] = {}
                node, cls = nxt, type(sub)
    return out


def _parse_value(key: str, value: str, where: str) -> Any:
    """A ``--set`` value parsed as YAML (``16``, ``[1, 2]``, ``[{side: N}]``)."""
    try:
        return _safe_load_unique(value)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at column {mark.column + 1}" if mark and mark.line == 0 else ""
        why = f"{_yaml_problem(exc)}{at}"
    except _DuplicateKey as dup:
        why = f"duplicate key {dup.path}"
    except _YamlProblem as bad:
        why = bad.message()
    raise TopologyError(f"{where}: --set {key}={value}: the value is not valid YAML ({why}); write "
                        "a YAML scalar, list or mapping, e.g. 16, [1, 2] or [{side: N}], and quote "
                        "it for the shell") from None


def describe(where: str, overrides: dict[str, Any] | None, *paths: str) -> str:
    """``where`` followed by the overrides that set one of the YAML ``paths`` (all of them
    without ``paths``): ``small.yaml with --set pe.tcm.size_kb=1``, the subject of a message
    about a value that may come from the command line rather than the file."""
    ov = overrides or {}
    hits = [k for k in sorted(ov) if not paths or any(_sets(k, p) for p in paths)]
    return where + (" with" + "".join(f" --set {k}={_show(ov[k])}" for k in hits) if hits else "")


def _sets(key: str, path: str) -> bool:
    """Does the override ``key`` set ``path`` (itself, or an element of a list it replaces)?"""
    return path == key or path.startswith((f"{key}.", f"{key}["))


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, default=list, separators=(", ", ": "))


# ----------------------------------------------------------------------------- typed build

class _Src:
    """The file being compiled and the overrides applied to it: the subject of messages."""

    __slots__ = ("where", "overrides")

    def __init__(self, where: str, overrides: dict[str, Any] | None) -> None:
        self.where, self.overrides = where, overrides or {}

    def at(self, *paths: str) -> str:
        """The file, plus the ``--set`` overrides that set one of ``paths``."""
        return describe(self.where, self.overrides, *paths) if self.overrides else self.where


def build_params(raw: dict[str, Any], where: str,
                 overrides: dict[str, Any] | None = None) -> TopologyParams:
    """Check keys and types, build the frozen params, then check semantics. ``overrides``
    (already applied to ``raw``) are named in a message about a value they set."""
    src = _Src(where, overrides)
    params = _build(TopologyParams, raw, "", src)
    _validate(params, src)
    return params


def _build(cls: Any, raw: Any, path: str, src: _Src, default: Any = None) -> Any:
    """Typed copy of ``default`` (the section's default instance) with ``raw``'s keys applied.
    ``path`` is the section's YAML path followed by ``.`` (empty at the top level)."""
    if not isinstance(raw, dict):
        section = path.removesuffix(".")
        raise TopologyError(f"{src.at(section)}: {section or 'top level'} must be a mapping, got "
                            f"{raw!r}; write its keys indented under it, or as {{key: value, ...}}")
    where = src.where
    flds = {f.name: f for f in fields(cls)}
    for key in raw:
        if key not in flds:
            raise TopologyError(f"{where}: {path}{key}: unknown key; "
                                f"{_unknown(f'{path}{key}', str(key), list(flds))}")
    default = cls() if default is None else default
    kwargs: dict[str, Any] = {}
    for name, fld in flds.items():
        if name not in raw:
            continue
        val, p = raw[name], f"{path}{name}"
        dflt = getattr(default, name)
        if is_dataclass(dflt):
            kwargs[name] = _build(type(dflt), val if val is not None else {}, p + ".", src, dflt)
        elif name == "io_chiplets":
            if not isinstance(val, list) or not val:
                raise TopologyError(f"{src.at(p)}: {p} = {val!r}: must be a non-empty list of mappings; "
                                    "e.g. [{side: W}]")
            kwargs[name] = tuple(_build(IoChipletParams, v, f"{p}[{i}].", src) for i, v in enumerate(val))
        elif name in _COORD:
            kwargs[name] = _coord(val, p, src)
        elif name in _COORD_LISTS:
            if not isinstance(val, list):
                raise TopologyError(f"{src.at(p)}: {p} = {val!r}: must be a list of [row, col] pairs")
            kwargs[name] = tuple(_coord(v, f"{p}[{i}]", src) for i, v in enumerate(val))
        else:
            kwargs[name] = _scalar(val, str(fld.type), p, src)   # (a string: postponed annotations)
    return replace(default, **kwargs)


def _coord(val: Any, path: str, src: _Src) -> tuple[int, int]:
    if (not isinstance(val, (list, tuple)) or len(val) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in val)):
        raise TopologyError(f"{src.at(path)}: {path} = {val!r}: must be a [row, col] pair of integers")
    return (val[0], val[1])


#: largest magnitude of any float parameter, and the range of a rate (``_gbps``, ``_ghz``):
#: far outside any hardware, yet every time the model derives from them stays finite
MAX_FLOAT = 1e15
RATE_RANGE = (1e-12, 1e12)
#: largest value of any integer parameter, and of those that count elements the compiler
#: builds one by one (checked before anything is allocated)
MAX_INT = 1 << 40
MAX_COUNT = {"rows": 64, "cols": 64, "connections": 64, "read_channels": 64,
             "write_channels": 64, "mac_rows": 4096, "mac_cols": 4096, "simd_lanes": 1 << 16,
             "n_slots": 1 << 16, "pcs_per_pe": 1024, "burst_bytes": 1 << 20,
             "slot_bytes": 1 << 30, "credit_bytes": 1 << 20, "m": 1 << 16, "k": 1 << 16,
             "n": 1 << 16}
#: a topology name becomes part of default output paths (data/runs/WORKLOAD-NAME-fast)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


def _short(val: Any) -> str:
    """``repr(val)``, a long one (a 400-digit number) cut to its first and last digits."""
    text = repr(val)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


def _scalar(val: Any, typ: str, path: str, src: _Src) -> Any:
    where = src.at(path)
    name = path.rsplit(".", 1)[-1]
    if typ == "float":
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise TopologyError(f"{where}: {path} = {_short(val)}: must be a number")
        if not (abs(val) <= MAX_FLOAT):     # also NaN, inf and ints too large for a float
            raise TopologyError(f"{where}: {path} = {_short(val)}: must be a finite number of "
                                f"magnitude <= {MAX_FLOAT:g}")
        lo, hi = RATE_RANGE
        if name.endswith(("_gbps", "_ghz")) and val > 0 and not lo <= val <= hi:
            raise TopologyError(f"{where}: {path} = {val!r}: a rate must be within "
                                f"[{lo:g}, {hi:g}]; use a value in that range")
        return float(val)
    if typ == "int":
        if isinstance(val, bool) or not isinstance(val, int):
            raise TopologyError(f"{where}: {path} = {_short(val)}: must be an integer")
        top = MAX_COUNT.get(name, MAX_INT)
        if val > top:
            raise TopologyError(f"{where}: {path} = {_short(val)}: at most {top:,}; use a "
                                "smaller value")
        return val
    if typ == "str":
        if not isinstance(val, str):
            raise TopologyError(f"{where}: {path} = {val!r}: must be a string")
        return val
    raise AssertionError(f"unhandled parameter type {typ} at {path}")  # pragma: no cover


# ----------------------------------------------------------------------------- semantics

def _leaves(obj: Any, path: str = ""):
    for f in fields(obj):
        val = getattr(obj, f.name)
        if is_dataclass(val):
            yield from _leaves(val, f"{path}{f.name}.")
        elif f.name == "io_chiplets":
            for i, io in enumerate(val):
                yield from _leaves(io, f"{path}{f.name}[{i}].")
        else:
            yield f"{path}{f.name}", f.name, val


def _fail(src: _Src, path: str, val: Any, why: str, also: tuple[str, ...] = ()) -> TopologyError:
    """``path = val: why``; ``also``: the other YAML paths a cross-field rule reads (an
    override of any of them is named)."""
    return TopologyError(f"{src.at(path, *also)}: {path} = {val!r}: {why}")


def _validate(p: TopologyParams, src: _Src) -> None:  # noqa: C901 - a flat list of rules
    if not _NAME.match(p.name):
        raise _fail(src, "name", p.name, "a topology name is a file-name-safe word (letters, "
                    "digits, . _ + -, at most 64 characters, no / or ..) because default output "
                    "paths use it; rename it, e.g. my_topology")
    for path, name, val in _leaves(p):
        if name.endswith("_gbps") and val <= 0:
            raise _fail(src, path, val, "bandwidth must be > 0; use a positive GB/s value")
        if (name.endswith(("_ns", "_mm", "_cycles")) or name in ("capacity_gb",)) and val < 0:
            raise _fail(src, path, val, "must be >= 0; use a non-negative value")
        if name.endswith("_ghz") and val <= 0:
            raise _fail(src, path, val, "clock must be > 0 GHz")
        if name in ("count", "connections", "rows", "cols", "pcs_per_pe", "burst_bytes",
                    "mac_rows", "mac_cols", "simd_lanes", "read_channels", "write_channels",
                    "n_slots", "slot_bytes", "credit_bytes", "m", "k", "n", "size_kb", "size_mb",
                    "cube_mesh_w", "cube_mesh_h") and val < 1:
            raise _fail(src, path, val, "must be >= 1")
    s, sip = p.system, p.sip
    if s.ns_per_mm <= 0:
        raise _fail(src, "system.ns_per_mm", s.ns_per_mm, "must be > 0 (no zero-latency wires, ADR-0002 D4)")
    if s.sips.count > address.MAX_SIPS:
        raise _fail(src, "system.sips.count", s.sips.count, "at most 16 SIPs (4 address bits); use <= 16")
    if s.host.copy_from not in ("pcie_ep", "host"):
        raise _fail(src, "system.host.copy_from", s.host.copy_from, "use pcie_ep or host")
    if s.sips.topology not in SIP_TOPOLOGIES:
        raise _fail(src, "system.sips.topology", s.sips.topology, f"use one of {', '.join(SIP_TOPOLOGIES)}")
    if s.sips.topology != "ring_1d":
        side = round(math.sqrt(s.sips.count))
        if not (s.sips.w or s.sips.h) and side * side != s.sips.count:
            # ADR-0024 D5: the square fallback only for a square count; never a guessed grid
            raise _fail(src, "system.sips.count", s.sips.count,
                        f"{s.sips.count} SIPs are not a square, so a {s.sips.topology} grid needs "
                        f"explicit system.sips.w and system.sips.h with w * h = {s.sips.count} "
                        f"(e.g. --set system.sips.w=3 --set system.sips.h=2 for 6)",
                        ("system.sips.topology",))
        w, h = sip_grid(p)
        if w * h != s.sips.count:
            raise _fail(src, "system.sips.w", s.sips.w,
                        f"a {w}x{h} SIP grid does not hold {s.sips.count} SIPs; set system.sips.w * h = count",
                        ("system.sips.h", "system.sips.count", "system.sips.topology"))
    n_cubes = sip.cube_mesh_w * sip.cube_mesh_h
    if n_cubes > address.MAX_CUBES:
        raise _fail(src, "sip.cube_mesh_w", sip.cube_mesh_w,
                    f"{sip.cube_mesh_w}x{sip.cube_mesh_h} = {n_cubes} cubes; at most 16 per SIP (die ids "
                    "0..15); lower sip.cube_mesh_w or sip.cube_mesh_h", ("sip.cube_mesh_h",))
    _validate_io(p, src)
    _validate_cube(p, src)
    _validate_pe(p, src)


def _validate_io(p: TopologyParams, src: _Src) -> None:
    ios = p.sip.io_chiplets
    if len(ios) > address.IO_DIE_COUNT:
        raise _fail(src, "sip.io_chiplets", len(ios),
                    "at most 5 IO chiplets per SIP (dies 16..20); remove entries from sip.io_chiplets")
    per_side: dict[str, int] = {}
    for i, io in enumerate(ios):
        if io.side not in SIDES:
            raise _fail(src, f"sip.io_chiplets[{i}].side", io.side, "use one of N, S, E, W")
        per_side[io.side] = per_side.get(io.side, 0) + 1
        edge = p.sip.cube_mesh_w if io.side in "NS" else p.sip.cube_mesh_h
        if per_side[io.side] > min(2, edge):
            raise _fail(src, f"sip.io_chiplets[{i}].side", io.side,
                        f"at most {min(2, edge)} IO chiplets on one shoreline; move it to another side",
                        ("sip.cube_mesh_w", "sip.cube_mesh_h"))


def _validate_cube(p: TopologyParams, src: _Src) -> None:
    mesh, pes, hbm = p.cube.mesh, p.cube.pes, p.cube.hbm
    zone = set(mesh.hbm_zone)

    dims = ("cube.mesh.rows", "cube.mesh.cols")

    def on_mesh(path: str, rc: tuple[int, int], what: str) -> None:
        r, c = rc
        if not (0 <= r < mesh.rows and 0 <= c < mesh.cols):
            raise _fail(src, path, list(rc), f"{what} is off the {mesh.rows}x{mesh.cols} mesh; "
                        f"use 0 <= row < {mesh.rows}, 0 <= col < {mesh.cols}", dims)
        if rc in zone:
            raise _fail(src, path, list(rc), f"{what} sits in the HBM zone (no router there); "
                        "pick a router slot outside cube.mesh.hbm_zone", ("cube.mesh.hbm_zone",))

    for i, rc in enumerate(mesh.hbm_zone):
        r, c = rc
        if not (0 <= r < mesh.rows and 0 <= c < mesh.cols):
            raise _fail(src, f"cube.mesh.hbm_zone[{i}]", list(rc),
                        f"off the {mesh.rows}x{mesh.cols} mesh; remove it", dims)
    if len(zone) >= mesh.rows * mesh.cols:
        raise _fail(src, "cube.mesh.hbm_zone", len(zone), "leaves no router; shrink the zone", dims)
    if pes.count > address.MAX_PES:
        raise _fail(src, "cube.pes.count", pes.count, "at most 16 PEs per cube (4 address bits); use <= 16")
    if pes.count > len(pes.routers):
        raise _fail(src, "cube.pes.count", pes.count,
                    f"{pes.count} PEs do not fit: cube.pes.routers lists {len(pes.routers)} router slots; "
                    f"use count <= {len(pes.routers)} or add slots", ("cube.pes.routers",))
    for i in range(pes.count):
        on_mesh(f"cube.pes.routers[{i}]", pes.routers[i], f"PE {i}'s router")
    on_mesh("cube.sram.router", p.cube.sram.router, "the SRAM router")
    on_mesh("cube.m_cpu.router", p.cube.m_cpu.router, "the M_CPU router")
    _check_connected(p, src)
    for name, val in (("pcs_per_pe", hbm.pcs_per_pe), ("burst_bytes", hbm.burst_bytes)):
        if val & (val - 1):
            raise _fail(src, f"cube.hbm.{name}", val, "must be a power of 2 (address-bit PC selection)")
    if not 0 < hbm.efficiency <= 1:
        raise _fail(src, "cube.hbm.efficiency", hbm.efficiency, "must be in (0, 1]")
    if hbm.capacity_gb * (1 << 30) > address.HBM_WINDOW_BYTES:
        raise _fail(src, "cube.hbm.capacity_gb", hbm.capacity_gb, "exceeds the 128 GB HBM window; use <= 128")
    if hbm.capacity_gb < 1:
        raise _fail(src, "cube.hbm.capacity_gb", hbm.capacity_gb, "must be >= 1")
    if p.cube.sram.size_mb * (1 << 20) > address.SRAM_BYTES:
        raise _fail(src, "cube.sram.size_mb", p.cube.sram.size_mb, "exceeds the 32 MB SRAM window; use <= 32")


def _check_connected(p: TopologyParams, src: _Src) -> None:
    mesh = p.cube.mesh
    slots = router_slots(p)
    start = slots[0]
    pool = slots_set(slots)
    seen = {start}
    todo = [start]
    while todo:
        r, c = todo.pop()
        for nb in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if nb in pool and nb not in seen:
                seen.add(nb)
                todo.append(nb)
    if len(seen) != len(slots):
        lost = sorted(set(slots) - seen)[0]
        raise _fail(src, "cube.mesh.hbm_zone", [list(z) for z in mesh.hbm_zone],
                    f"splits the router mesh (r{lost[0]}c{lost[1]} unreachable); shrink the zone",
                    ("cube.mesh.rows", "cube.mesh.cols"))
    for side in SIDES:
        if not edge_routers(p, side):
            raise _fail(src, "cube.mesh.hbm_zone", [list(z) for z in mesh.hbm_zone],
                        f"leaves no router on the {side} edge for UCIe; shrink the zone",
                        ("cube.mesh.rows", "cube.mesh.cols"))


def _validate_pe(p: TopologyParams, src: _Src) -> None:
    tcm = p.pe.tcm
    budget_kb = address.PE_SUB_UNITS[address.PE_TCM][1] // 1024
    if tcm.size_kb > budget_kb:
        raise _fail(src, "pe.tcm.size_kb", tcm.size_kb,
                    f"exceeds the {budget_kb} KB PE_TCM address budget; use <= {budget_kb}")
    if tcm.scratch_kb > tcm.size_kb:
        raise _fail(src, "pe.tcm.scratch_kb", tcm.scratch_kb, f"exceeds pe.tcm.size_kb = {tcm.size_kb}; "
                    "raise pe.tcm.size_kb or lower pe.tcm.scratch_kb", ("pe.tcm.size_kb",))
    if p.pe.ipcq.buffer_kind not in ("tcm", "sram", "hbm"):
        raise _fail(src, "pe.ipcq.buffer_kind", p.pe.ipcq.buffer_kind, "use one of tcm, sram, hbm")


# ----------------------------------------------------------------------------- geometry helpers

def sip_grid(p: TopologyParams) -> tuple[int, int]:
    """(w, h) of the SIP grid for 2D inter-SIP patterns (0 -> derive a square-ish grid)."""
    n, w, h = p.system.sips.count, p.system.sips.w, p.system.sips.h
    if w and h:
        return w, h
    if w:
        return w, math.ceil(n / w)
    if h:
        return math.ceil(n / h), h
    w = max(1, round(math.sqrt(n)))
    return w, math.ceil(n / w)


def router_slots(p: TopologyParams) -> list[tuple[int, int]]:
    """Router (row, col) slots in row-major order, HBM zone excluded."""
    zone = set(p.cube.mesh.hbm_zone)
    return [(r, c) for r in range(p.cube.mesh.rows) for c in range(p.cube.mesh.cols) if (r, c) not in zone]


def slots_set(slots: list[tuple[int, int]]) -> frozenset[tuple[int, int]]:
    return frozenset(slots)


def edge_routers(p: TopologyParams, side: str) -> list[tuple[int, int]]:
    """Routers on one cube edge, in order along the edge (W->E for N/S, N->S for E/W)."""
    rows, cols = p.cube.mesh.rows, p.cube.mesh.cols
    zone = set(p.cube.mesh.hbm_zone)
    if side == "N":
        cand = [(0, c) for c in range(cols)]
    elif side == "S":
        cand = [(rows - 1, c) for c in range(cols)]
    elif side == "W":
        cand = [(r, 0) for r in range(rows)]
    else:
        cand = [(r, cols - 1) for r in range(rows)]
    return [rc for rc in cand if rc not in zone]


def ucie_conn_routers(p: TopologyParams, side: str) -> list[tuple[int, int]]:
    """Router of each UCIe connection of a port: spread evenly along the edge."""
    edge = edge_routers(p, side)
    n = p.sip.ucie.connections
    return [edge[min(len(edge) - 1, int((i + 0.5) * len(edge) / n))] for i in range(n)]

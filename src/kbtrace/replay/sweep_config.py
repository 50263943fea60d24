"""Sweep configs: the YAML (or mapping) a sweep runs, read and validated (``load_config``),
and the CLI's ``--grid`` items (``parse_grid_items``). ``sweep`` describes the format and
runs the points; this module only turns input into a ``SweepConfig`` (or one
``SweepError`` line naming the file, the key and the fix)."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from kbtrace._paths import resolve
from kbtrace._yaml import YamlProblem, load_unique, problem, read_text
from kbtrace.errors import SweepError, TopologyError, UsageError
from kbtrace.replay.options import FIDELITIES
from kbtrace.topology._spec import apply_overrides

__all__ = ["SweepConfig", "TraceSpec", "load_config", "parse_grid_items", "fmt_value", "NAME_OK"]

_KEYS = ("traces", "workloads", "topologies", "fidelity", "grid", "check_invariants")
NAME_OK = re.compile(r"^[A-Za-z0-9_.+\-]+$")   # a value or name that can name a directory


@dataclass(frozen=True)
class TraceSpec:
    """A trace to replay: an existing directory (``path``) or a workload to capture.

    A workload entry with a ``grid`` of workload parameters expands into one spec per
    combination: ``base`` is the entry's name, ``grid`` this combination's values (also in
    ``params``), and ``name`` is ``base`` followed by ``-KEYvalue`` per grid key."""
    name: str
    path: str | None = None
    workload: str | None = None
    params: tuple[tuple[str, Any], ...] = ()
    base: str = ""
    grid: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class SweepConfig:
    traces: tuple[TraceSpec, ...]
    topologies: tuple[str, ...]
    fidelities: tuple[str, ...] = ("fast",)
    grid: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    check_invariants: bool = True
    source: str = "<config>"

    @property
    def workload_grid_keys(self) -> tuple[str, ...]:
        """The workload parameters some trace is gridded over, in first-seen order."""
        return tuple(dict.fromkeys(k for t in self.traces for k, _ in t.grid))

    def as_json(self) -> dict[str, Any]:
        return {"traces": [{"name": t.name, "path": t.path, "workload": t.workload,
                            "params": dict(t.params),
                            **({"base": t.base, "grid": dict(t.grid)} if t.grid else {})}
                           for t in self.traces],
                "topologies": list(self.topologies), "fidelity": list(self.fidelities),
                "grid": {k: list(v) for k, v in self.grid},
                "check_invariants": self.check_invariants}



def fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def _list(raw: Any, where: str, example: str) -> list[Any]:
    if isinstance(raw, (str, int, float, bool)):
        return [raw]
    if not isinstance(raw, list) or not raw:
        raise SweepError(f"{where}: expected a non-empty list, e.g. {example}")
    return raw


def parse_grid_items(items: Sequence[str] | None) -> dict[str, list[Any]]:
    """``["cube.hbm.pc_bw_gbps=8,16,32", ...]`` -> grid axes (values parsed as YAML scalars)."""
    out: dict[str, list[Any]] = {}
    for item in items or []:
        key, sep, vals = item.partition("=")
        if not sep or not key.strip() or not vals.strip():
            raise SweepError(f"--grid {item!r}: expected KEY=V1,V2,..., e.g. "
                             "--grid cube.hbm.pc_bw_gbps=8,16,32")
        out[key.strip()] = [_grid_value(item, v.strip()) for v in vals.split(",")]
    return out


def _grid_value(item: str, text: str) -> Any:
    """One ``--grid`` value parsed as a YAML scalar (``16``, ``0.5``, ``true``, ``W``)."""
    try:
        return load_unique(text)
    except yaml.YAMLError as exc:
        why = problem(exc)
    except YamlProblem as bad:
        why = bad.message()
    raise SweepError(f"--grid {item}: value {text!r} is not valid YAML ({why}); give plain values "
                     "separated by commas, e.g. --grid cube.hbm.pc_bw_gbps=8,16,32")


def load_config(src: str | Path | Mapping[str, Any],
                grid: Mapping[str, Sequence[Any]] | None = None) -> SweepConfig:
    """Read and validate a sweep config (YAML path or mapping); ``grid`` adds or replaces
    grid axes (the CLI's ``--grid``). Raises ``SweepError`` naming the file and key."""
    if isinstance(src, Mapping):
        raw, where = dict(src), "sweep config"
    else:
        where = str(src)
        try:
            raw = load_unique(read_text(src))
        except FileNotFoundError:
            raise SweepError(f"{where}: no such sweep config; see replay/*.yaml") from None
        except OSError as exc:
            raise SweepError(f"{where}: cannot read the sweep config ({exc.strerror or exc})"
                             ) from None
        except YamlProblem as bad:
            raise SweepError(f"{where}: {bad.message()}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" line {mark.line + 1}" if mark else ""
            raise SweepError(f"{where}:{at}: not valid YAML; fix the syntax") from None
        if not isinstance(raw, dict):
            raise SweepError(f"{where}: expected a mapping with traces/workloads, topologies "
                             "and grid keys")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise SweepError(f"{where}: unknown key {unknown[0]!r}; expected one of "
                         f"{', '.join(_KEYS)}")
    traces: list[TraceSpec] = []
    raw_traces, raw_workloads = raw.get("traces"), raw.get("workloads")
    for p in _list(raw_traces, f"{where}: traces", "[data/traces/gemm]") if raw_traces else []:
        if not isinstance(p, str):
            raise SweepError(f"{where}: traces: {p!r} is not a path; list trace directories")
        traces.append(TraceSpec(name=Path(p).name, path=p))
    for w in (_list(raw_workloads, f"{where}: workloads", "[capture/gemm.py]")
              if raw_workloads else []):
        if isinstance(w, str):
            w = {"path": w}
        if not isinstance(w, dict) or not isinstance(w.get("path"), str):
            raise SweepError(f"{where}: workloads: {w!r}: expected a path or "
                             "{path: capture/gemm.py, params: {M: 256}, name: gemm256}")
        extra = sorted(set(w) - {"path", "params", "name", "grid"})
        if extra:
            raise SweepError(f"{where}: workloads: {w['path']}: unknown key {extra[0]!r}; "
                             "use path, params, name, grid")
        params = w.get("params") or {}
        if not isinstance(params, dict):
            raise SweepError(f"{where}: workloads: {w['path']}: params must be a mapping, "
                             "e.g. {M: 256}")
        base = str(w.get("name") or Path(w["path"]).stem)
        wgrid = _axes(w.get("grid") or {}, f"{where}: workloads: {w['path']}: grid",
                      "{BM: [16, 32, 64]}")
        both = sorted(set(params) & {k for k, _ in wgrid})
        if both:
            raise SweepError(f"{where}: workloads: {w['path']}: {both[0]!r} is in both params "
                             "and grid; keep it in one")
        _check_size(math.prod(len(v) for _, v in wgrid), f"{where}: workloads: {w['path']}: grid")
        for combo in itertools.product(*(v for _, v in wgrid)):
            g = tuple(zip((k for k, _ in wgrid), combo, strict=True))
            traces.append(TraceSpec(name=base + "".join(f"-{k}{fmt_value(v)}" for k, v in g),
                                    workload=w["path"], params=tuple(params.items()) + g,
                                    base=base, grid=g))
    if not traces:
        raise SweepError(f"{where}: nothing to replay; add traces: [DIR, ...] or "
                         "workloads: [capture/WORKLOAD.py, ...]")
    names = [t.name for t in traces]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise SweepError(f"{where}: two traces are named {dup!r}; give workloads distinct "
                         "`name:`s (the name is the trace=... partition)")
    # one name per config entry (a gridded workload's traces share its name): reports
    # compare points within an entry, so two entries must not share one
    entries = list(dict.fromkeys((t.base, t.workload) if t.base else (t.name, t.path)
                                 for t in traces))
    entry_names = [n for n, _ in entries]
    dup = next((n for n in entry_names if entry_names.count(n) > 1), None)
    if dup:
        raise SweepError(f"{where}: two workloads are named {dup!r}; give each a distinct "
                         "`name:` (points are compared within a workload)")
    kinds: dict[str, str] = {}
    for t in traces:           # a workload grid key has one kind of value across entries
        for k, v in t.grid:
            if kinds.setdefault(k, _kind(v)) != _kind(v):
                raise SweepError(f"{where}: workloads: grid key {k!r} has both {kinds[k]} and "
                                 f"{_kind(v)} values; use one kind (its points column is typed)")
    for t in traces:
        if not NAME_OK.match(t.name):
            raise SweepError(f"{where}: trace name {t.name!r} cannot name a directory; use "
                             "letters, digits, '_', '.', '+', '-'")
    topos = [str(t) for t in _list(raw.get("topologies"), f"{where}: topologies",
                                   "[topologies/small.yaml]")]
    fids = [str(f) for f in _list(raw.get("fidelity", ["fast"]), f"{where}: fidelity",
                                  "[fast, flit]")]
    for f in fids:
        if f not in FIDELITIES:
            raise SweepError(f"{where}: fidelity: unknown {f!r}; use {' or '.join(FIDELITIES)}")
    axes = raw.get("grid") or {}
    if not isinstance(axes, dict):
        raise SweepError(f"{where}: grid: expected a mapping KEY: [values], e.g. "
                         "cube.hbm.pc_bw_gbps: [8, 16, 32]")
    axes_g = _axes({**axes, **(grid or {})}, f"{where}: grid", "cube.hbm.pc_bw_gbps: [8, 16, 32]")
    _check_size(len(traces) * len(topos) * len(set(fids)) * math.prod(len(v) for _, v in axes_g),
                f"{where}: traces x topologies x fidelities x grid")
    for key, vals in axes_g:
        try:   # the key must name a topology parameter (values are judged per point)
            apply_overrides({}, {key: vals[0]}, f"{where}: grid")
        except TopologyError as e:
            raise SweepError(str(e)) from None
    check = raw.get("check_invariants", True)
    if not isinstance(check, bool):
        raise SweepError(f"{where}: check_invariants: expected true or false")
    # the config is well formed: now what its paths (or catalog names) point at
    traces = [replace(t, path=_find(t.path, "trace", where, "traces")) if t.path is not None
              else replace(t, workload=_find(t.workload or "", "workload", where, "workloads"))
              for t in traces]
    topos = [_find(t, "topology", where, "topologies") for t in topos]
    return SweepConfig(tuple(traces), tuple(topos), tuple(dict.fromkeys(fids)), tuple(axes_g), check,
                       where)


#: most points one sweep may enumerate (checked before any is built)
MAX_POINTS = 100_000


def _check_size(n: int, what: str) -> None:
    if n > MAX_POINTS:
        raise SweepError(f"{what}: {n:,} points; at most {MAX_POINTS:,} per sweep; use fewer "
                         "values or split the sweep")


def _axes(raw: Any, where: str, example: str) -> list[tuple[str, tuple[Any, ...]]]:
    """A grid mapping KEY: [values] checked: scalar values that can name a directory,
    none repeated; (key, values) in the order written."""
    if not isinstance(raw, dict):
        raise SweepError(f"{where}: expected a mapping KEY: [values], e.g. {example}")
    out = []
    for key, vals in raw.items():
        vals = _list(vals, f"{where}.{key}", "[8, 16, 32]")
        for v in vals:
            if not isinstance(v, (str, int, float, bool)) or not NAME_OK.match(fmt_value(v)):
                raise SweepError(f"{where}.{key}: value {v!r} cannot name a directory; "
                                 "use numbers or words of letters, digits, '_', '.', '+', '-'")
        if len(set(map(fmt_value, vals))) != len(vals):
            raise SweepError(f"{where}.{key}: repeated value in {vals}")
        if len({_kind(v) for v in vals}) > 1:
            raise SweepError(f"{where}.{key}: values {vals} mix kinds; use only numbers, only "
                             "true/false or only words (its points column is typed)")
        out.append((str(key), tuple(vals)))
    return out


def _kind(v: Any) -> str:
    return "true/false" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) \
        else "word"


def _find(p: str, kind: str, where: str, key: str) -> str:
    """``p`` as written when it exists (so a config's point keys do not depend on where it
    runs from), else its path under the repository or the catalog entry it names."""
    try:
        found = resolve(p, kind)
    except UsageError as e:
        raise SweepError(f"{where}: {key}: {e}") from None
    return p if found == Path(p) else str(found)

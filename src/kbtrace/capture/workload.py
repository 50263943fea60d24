"""Host-side workload API: tensors, placement, launches, outputs and numpy references.

A workload is a Python file (``capture/<name>.py``) defining::

    PARAMS = {"M": 256, "dtype": "f32", "seed": 0}      # overridable: -p M=512

    def build(w: Workload, p) -> None:                    # p.M, p.dtype, ...
        a = w.tensor("a", (p.M, p.K), p.dtype, init=w.random(p.seed))       # PE (0,0,0) HBM
        x = w.tensor("x", (8, 64), "f32", init=w.random(1), shard="pes")   # row i on cube 0 PE i
        c = w.tensor("c", (p.M, p.N), p.dtype)                               # zeros
        w.launch(kernel, grid=w.grid(), args=(a, b, c, p.M))                 # Tensor -> address
        w.output(c, reference=lambda v: v["a"] @ v["b"])

Kernel arguments that are ``Tensor`` objects become the address of the tensor,
or for sharded tensors the address of the shard on the program's own PE; a
``PerRank`` argument (``w.per_rank(...)``) becomes its entry for the program's SIP.
On a dense grid program (pid0, pid1) runs on PE ``pid0`` of global cube ``pid1``
(cube-major over SIPs); a sparse launch (``sips=`` / ``cubes=`` / ``pes=`` / ``on=``)
numbers its (SIP, cube) pairs in order as pid1 and the PEs within each as pid0.
Launches and host copies run in declaration order, each to completion.

Placement policies (``dp=``) are duck-typed: any object with ``resolve(shape=,
itemsize=, num_cubes=, num_pes=, target_sip=)`` returning shards with ``sip, cube,
pe, offset, shape`` and ``replica`` (``kbtrace.host.DPPolicy`` is the one kbtrace
ships), so capture does not import the host runtime built on it.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

from kbtrace.capture._collective_api import CollectiveMixin
from kbtrace.capture._host_api import HostMemoryMixin
from kbtrace.capture._ipcq import check_ipcq
from kbtrace.capture.dtypes import STORAGE, check_dtype, itemsize, to_compute, to_storage
from kbtrace.capture.hostcopy import HOST_BASE, HOST_BYTES, MapSpec
from kbtrace.capture.memory import Allocator, FreeList, Region
from kbtrace.errors import CaptureError

__all__ = ["Workload", "Tensor", "Shard", "Random", "PerRank", "LaunchSpec", "load_workload",
           "parse_params"]


@dataclass(frozen=True)
class Random:
    """Seeded random initial values: ``uniform`` in [low, high) or ``normal`` (ints: integers)."""
    seed: int
    dist: str = "uniform"
    low: float = -1.0
    high: float = 1.0

    def draw(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if dtype in ("i32", "i8"):
            return rng.integers(int(self.low), int(self.high) + 1, size=shape).astype(np.int32)
        if dtype == "bool":
            return rng.integers(0, 2, size=shape).astype(bool)
        if self.dist == "normal":
            return rng.standard_normal(shape).astype(np.float32)
        return rng.uniform(self.low, self.high, size=shape).astype(np.float32)


@dataclass
class Shard:
    index: int
    sip: int
    cube: int
    pe: int
    addr: int
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    replica: int = 0


@dataclass(frozen=True)
class PerRank:
    """A kernel argument with one value per SIP (rank): each program gets ``values[sip]``."""
    values: Mapping[int, Any]


@dataclass
class Tensor:
    """A declared tensor: its initial values (storage dtype) and its shards in HBM."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    stored: np.ndarray
    shards: list[Shard] = field(default_factory=list)
    sharded: bool = False
    role: str = "input"
    #: "hbm" (device, on the shards' PEs) or "host" (host memory: kernels cannot address it)
    space: str = "hbm"
    #: placed in memory a freed tensor had: its values come by an h2d from ``<name>.init``
    staged: bool = False
    freed: bool = False
    regions: list[Region] = field(default_factory=list)

    @property
    def addr(self) -> int:
        """Base address (unsharded tensors; for sharded ones use ``shard_addr``)."""
        if self.sharded:
            raise CaptureError(f"tensor {self.name!r} is sharded; use t.shard_addr(i) or pass the "
                               f"tensor itself as a kernel argument (each program gets its shard)")
        return self.shards[0].addr

    def shard_addr(self, i: int) -> int:
        return self.shards[i].addr

    @property
    def value(self) -> np.ndarray:
        """Initial values in compute dtype (what references see)."""
        return to_compute(self.stored, self.dtype)

    @property
    def nbytes(self) -> int:
        return int(self.stored.nbytes)


@dataclass
class LaunchSpec:
    kernel: Callable[..., Any]
    grid: tuple[int, int]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    neighbors: Mapping[int, Mapping[str, int]] | None
    #: (sip, cube, pe) and (pid0, pid1) of every program, in program order
    coords: list[tuple[int, int, int]] = field(default_factory=list)
    pids: list[tuple[int, int]] = field(default_factory=list)
    #: this launch's IPCQ settings (None: the topology's pe.ipcq)
    ipcq: Mapping[str, Any] | None = None


class Workload(CollectiveMixin, HostMemoryMixin):
    """The host program's view while ``build(w, p)`` runs."""

    def __init__(self, topo: Any, name: str, params: SimpleNamespace, tracer: Any) -> None:
        self.topo, self.name, self.params = topo, name, params
        self._tracer = tracer
        self.tensors: dict[str, Tensor] = {}
        self.launches: list[LaunchSpec] = []
        #: launches and host copies in declaration order (the host program)
        self.actions: list[Any] = []
        self.outputs: dict[str, Callable[[dict[str, np.ndarray]], Any]] = {}
        self._hbm: dict[tuple[int, int, int], FreeList] = {}
        self._host = Allocator(HOST_BASE, HOST_BYTES, "host memory", 256)
        self._cubes = topo.n_sips * topo.cubes_per_sip

    # ------------------------------------------------------------------ helpers
    def grid(self, cubes: int | None = None) -> tuple[int, int]:
        """(programs per cube, cubes): every PE of the first ``cubes`` cubes (default all)."""
        return (self.topo.pes_per_cube, self._cubes if cubes is None else cubes)

    @staticmethod
    def random(seed: int, dist: str = "uniform", low: float = -1.0, high: float = 1.0) -> Random:
        return Random(int(seed), dist, low, high)

    def coord(self, pid0: int, pid1: int) -> tuple[int, int, int]:
        """(sip, cube, pe) of program (pid0, pid1)."""
        if not (0 <= pid0 < self.topo.pes_per_cube and 0 <= pid1 < self._cubes):
            raise CaptureError(f"workload {self.name!r}: program ({pid0},{pid1}) does not fit "
                               f"{self.topo.params.name!r} ({self.topo.pes_per_cube} PEs x "
                               f"{self._cubes} cubes); use a smaller grid")
        return (pid1 // self.topo.cubes_per_sip, pid1 % self.topo.cubes_per_sip, pid0)

    def _alloc(self, sip: int, cube: int, pe: int, nbytes: int, label: str) -> tuple[int, bool]:
        """(address, reuses freed memory) of ``nbytes`` on a PE's HBM slice (first fit)."""
        key = (sip, cube, pe)
        if not (0 <= sip < self.topo.n_sips and 0 <= cube < self.topo.cubes_per_sip
                and 0 <= pe < self.topo.pes_per_cube):
            raise CaptureError(f"workload {self.name!r}: {label} placed on sip{sip}.cube{cube}."
                               f"pe{pe}, which {self.topo.params.name!r} does not have")
        alloc = self._hbm.get(key)
        if alloc is None:
            base = self._tracer.addr.hbm_addr(sip, cube, pe * self.topo.hbm_slice_bytes)
            alloc = self._hbm[key] = FreeList(
                base, self.topo.hbm_slice_bytes, f"HBM slice of sip{sip}.cube{cube}.pe{pe}", 256)
        return alloc.alloc(max(nbytes, 1), label)

    # ------------------------------------------------------------------ ranks
    @property
    def world_size(self) -> int:
        """Ranks of the host program: one per SIP (ADR-0024 D1)."""
        return int(self.topo.n_sips)

    @property
    def ranks(self) -> range:
        """Rank ids ``0 .. world_size - 1`` (rank = SIP)."""
        return range(self.world_size)

    def check_rank(self, sip: Any, what: str) -> int:
        if isinstance(sip, bool) or not isinstance(sip, (int, np.integer)) or not (
                0 <= int(sip) < self.world_size):
            raise CaptureError(f"workload {self.name!r}: {what}: rank/SIP {sip!r} is out of range; "
                               f"{self.topo.params.name!r} has {self.world_size} SIP(s) "
                               f"(ranks 0..{self.world_size - 1}; --set system.sips.count=N "
                               f"for more)")
        return int(sip)

    def per_rank(self, values: Mapping[int, Any] | Sequence[Any] | Callable[[int], Any]
                 ) -> PerRank:
        """A kernel argument with one value per rank: a sequence indexed by rank, a mapping
        rank -> value, or a function of the rank (called for every rank)."""
        if callable(values) and not isinstance(values, (Mapping, Tensor)):
            vals = {r: values(r) for r in self.ranks}
        elif isinstance(values, Mapping):
            vals = {self.check_rank(k, "per_rank"): v for k, v in values.items()}
        else:
            vals = dict(enumerate(values))
            for k in vals:
                self.check_rank(k, "per_rank")
        return PerRank(vals)

    # ------------------------------------------------------------------ declarations
    def _values(self, name: str, shape: tuple[int, ...], dtype: str, init: Any) -> np.ndarray:
        if isinstance(init, Random):
            return init.draw(shape, dtype)
        if isinstance(init, str) and init == "zeros":
            return np.zeros(shape, dtype=STORAGE[dtype] if dtype != "bf16" else np.float32)
        vals = np.asarray(init)
        if vals.shape != shape:
            raise CaptureError(f"tensor {name!r}: init has shape {vals.shape}, declared {shape}")
        return vals

    def _declare(self, name: str, shape: Sequence[int] | int, dtype: str, init: Any,
                 space: str = "hbm") -> Tensor:
        if name in self.tensors:
            raise CaptureError(f"workload {self.name!r}: tensor {name!r} declared twice")
        check_dtype(dtype, f"tensor {name!r}")
        shp = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        if any(d < 0 for d in shp):
            raise CaptureError(f"tensor {name!r}: negative dimension in shape {shp}")
        nbytes = math.prod(shp) * itemsize(dtype)      # checked before anything is allocated
        topo = self.topo
        cap_gb = topo.n_sips * topo.cubes_per_sip * topo.params.cube.hbm.capacity_gb
        if nbytes > cap_gb << 30:
            raise CaptureError(f"tensor {name!r}: shape {shp} {dtype} needs {nbytes:,} B, more "
                               f"than the {cap_gb} GB of HBM in topology "
                               f"{topo.params.name!r}; use a smaller shape")
        return Tensor(name, shp, dtype, to_storage(self._values(name, shp, dtype, init), dtype),
                      space=space)

    def tensor(self, name: str, shape: Sequence[int] | int, dtype: str = "f32", init: Any = "zeros",
               *, pe: tuple[int, int, int] | None = None, shard: str | None = None, axis: int = 0,
               cube: int = 0, shard_pe: int = 0, dp: Any = None, sip: int | None = None) -> Tensor:
        """Declare and place a tensor in HBM.

        ``pe=(sip, cube, pe)`` places it on one PE's HBM slice; ``shard="pes"`` splits ``axis``
        evenly over the PEs of global cube ``cube``; ``shard="cubes"`` over all cubes (on PE
        ``shard_pe`` of each); ``shard="all"`` over every PE of every cube (shard ``i`` on PE
        ``i % pes_per_cube`` of global cube ``i // pes_per_cube``, i.e. the program with
        ``program_id(1) * num_programs(0) + program_id(0) == i`` on the default grid).
        ``dp=DPPolicy(...)`` places it over the cubes and PEs of SIP ``sip`` (default 0) by
        the policy (``kbtrace.host.placement``); ``sip`` alone means PE 0 of cube 0 of it.
        ``init``: "zeros", an array / nested list, or ``w.random(seed)``.
        """
        t = self._declare(name, shape, dtype, init)
        shape = t.shape
        given = [k for k, v in (("pe", pe), ("shard", shard), ("dp", dp)) if v is not None]
        if len(given) > 1:
            raise CaptureError(f"tensor {name!r}: pass only one of pe=, shard= and dp= "
                               f"(got {', '.join(given)})")
        places: list[tuple[tuple[int, int, int], tuple[int, ...], tuple[int, ...], int]] = []
        if dp is not None:
            target = self.check_rank(0 if sip is None else sip, f"tensor {name!r}")
            if not callable(getattr(dp, "resolve", None)):
                raise CaptureError(f"tensor {name!r}: dp= must be a placement policy such as "
                                   f"kbtrace.host.DPPolicy(...), got {type(dp).__name__}")
            specs = dp.resolve(shape=shape, itemsize=itemsize(dtype),
                               num_cubes=self.topo.cubes_per_sip, num_pes=self.topo.pes_per_cube,
                               target_sip=target)
            places = [((s.sip, s.cube, s.pe), tuple(s.offset), tuple(s.shape), s.replica)
                      for s in specs]
            t.sharded = len(places) > 1
        elif shard is None:
            if sip is not None:
                where = (self.check_rank(sip, f"tensor {name!r}"), 0, 0) if pe is None else pe
                if pe is not None and pe[0] != sip:
                    raise CaptureError(f"tensor {name!r}: sip={sip} but pe={pe} is on SIP "
                                       f"{pe[0]}; pass one of them")
            else:
                where = pe or (0, 0, 0)
            places = [(tuple(where), tuple(0 for _ in shape), shape, 0)]  # type: ignore[list-item]
        else:
            if shard == "pes":
                sp, cb = cube // self.topo.cubes_per_sip, cube % self.topo.cubes_per_sip
                owners = [(sp, cb, i) for i in range(self.topo.pes_per_cube)]
            elif shard == "cubes":
                owners = [(c // self.topo.cubes_per_sip, c % self.topo.cubes_per_sip, shard_pe)
                          for c in range(self._cubes)]
            elif shard == "all":
                owners = [(c // self.topo.cubes_per_sip, c % self.topo.cubes_per_sip, i)
                          for c in range(self._cubes) for i in range(self.topo.pes_per_cube)]
            else:
                raise CaptureError(f"tensor {name!r}: shard must be 'pes', 'cubes' or 'all', "
                                   f"got {shard!r}")
            n = len(owners)
            if shape[axis] % n:
                raise CaptureError(f"tensor {name!r}: dim {axis} = {shape[axis]} does not split "
                                   f"evenly over {n} {shard}; use a multiple of {n}")
            step = shape[axis] // n
            for i, own in enumerate(owners):
                off = tuple(i * step if d == axis else 0 for d in range(len(shape)))
                shp = tuple(step if d == axis else s for d, s in enumerate(shape))
                places.append((own, off, shp, 0))
            t.sharded = True
        regions = []
        for i, (own, off, shp, rep) in enumerate(places):
            nbytes = math.prod(shp) * itemsize(dtype)
            label = f"tensor {name!r}" + (f" shard {i}" if t.sharded else "")
            addr, reused = self._alloc(*own, nbytes, label)
            t.staged = t.staged or reused
            t.shards.append(Shard(i, own[0], own[1], own[2], addr, off, shp, rep))
            regions.append(Region(addr, nbytes, label, "hbm", dtype))
        self.tensors[name] = t
        t.regions = regions
        if t.staged:
            # memory a freed tensor had: it is mapped, and its values arrive by an h2d from a
            # host staging copy, where the host program reaches this declaration
            self.actions.append(MapSpec(regions))
            self.copy_to_device(self.host_tensor(f"{name}.init", shape, dtype, t.stored), t)
            return t
        for reg, s in zip(regions, t.shards, strict=True):
            self._tracer.regions.add(reg)
            idx = tuple(slice(o, o + n) for o, n in zip(s.offset, s.shape, strict=True))
            self._tracer.write_initial(s.addr, np.ascontiguousarray(t.stored[idx]))
        return t

    def _targets(self, sips: Any, cubes: Any, pes: Any, on: Any
                 ) -> list[tuple[int, int, int]]:
        """Program placements of a sparse launch, sorted by (sip, cube, pe)."""
        def norm(v: Any, n: int, what: str) -> list[int]:
            vals = list(range(n)) if v is None else [v] if isinstance(v, (int, np.integer)) \
                else list(v)
            for x in vals:
                if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= x < n:
                    raise CaptureError(f"workload {self.name!r}: launch on {what} {x!r}, which "
                                       f"{self.topo.params.name!r} does not have ({n} {what}s: "
                                       f"0..{n - 1})")
            if len(set(vals)) != len(vals) or not vals:
                raise CaptureError(f"workload {self.name!r}: launch {what}s={vals!r}: list each "
                                   f"{what} once (and at least one)")
            return sorted(int(x) for x in vals)

        if on is not None:
            coords = set()
            for t in on if isinstance(on, (list, tuple)) else [on]:
                if not isinstance(t, Tensor) or self.tensors.get(t.name) is not t:
                    raise CaptureError(f"workload {self.name!r}: launch(on=...) needs tensors of "
                                       f"this workload, got "
                                       f"{getattr(t, 'name', type(t).__name__)!r}")
                if t.space != "hbm":
                    raise CaptureError(f"workload {self.name!r}: launch(on={t.name!r}): a host "
                                       f"tensor has no PEs; launch on a device tensor")
                coords |= {(s.sip, s.cube, s.pe) for s in t.shards}
            for c in list(coords):
                if sips is not None and c[0] not in norm(sips, self.world_size, "SIP"):
                    coords.discard(c)
            return sorted(coords)
        ss = norm(sips, self.world_size, "SIP")
        cs = norm(cubes, self.topo.cubes_per_sip, "cube")
        ps = norm(pes, self.topo.pes_per_cube, "PE")
        return [(s, c, p) for s in ss for c in cs for p in ps]

    def launch(self, kernel: Callable[..., Any], grid: tuple[int, int] | None = None,
               args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
               neighbors: Mapping[int, Mapping[str, int]] | None = None, *,
               sips: Any = None, cubes: Any = None, pes: Any = None,
               on: Tensor | Sequence[Tensor] | None = None,
               ipcq: Mapping[str, Any] | None = None) -> LaunchSpec:
        """Run ``kernel(tl, *args, **kwargs)`` on every program of ``grid`` = (PEs, cubes), or
        (sparse) on the PEs ``pes`` of cubes ``cubes`` of SIPs ``sips`` (each an int, a list
        or None = all), or on the PEs holding a shard of tensor ``on`` (or of any of a list of
        tensors; of SIPs ``sips``).

        ``ipcq``: this launch's IPCQ settings (``n_slots``, ``slot_bytes``, ``buffer_kind``),
        overriding the topology's ``pe.ipcq`` for its sends and receives (recorded per op)."""
        if not callable(kernel):
            raise CaptureError(f"workload {self.name!r}: launch needs a kernel function, got "
                               f"{type(kernel).__name__}")
        sparse = on is not None or any(v is not None for v in (sips, cubes, pes))
        if sparse:
            if grid is not None:
                raise CaptureError(f"workload {self.name!r}: launch takes grid= or sips/cubes/"
                                   f"pes/on=, not both")
            coords = self._targets(sips, cubes, pes, on)
            if not coords:
                raise CaptureError(f"workload {self.name!r}: launch(on=..., sips={sips!r}) "
                                   f"selects no PE")
            cube_ids = sorted({(s, c) for s, c, _ in coords})
            pid1 = {sc: i for i, sc in enumerate(cube_ids)}
            pids, seen = [], dict.fromkeys(cube_ids, 0)
            for s, c, _p in coords:
                pids.append((seen[(s, c)], pid1[(s, c)]))
                seen[(s, c)] += 1
            g = (max(seen.values()), len(cube_ids))
        else:
            g = tuple(int(x) for x in (grid or self.grid()))  # type: ignore[assignment]
            if len(g) == 1:
                g = (g[0], 1)
            if len(g) != 2 or g[0] < 1 or g[1] < 1:
                raise CaptureError(f"workload {self.name!r}: grid {tuple(g)} must be (PEs >= 1, "
                                   f"cubes >= 1)")
            self.coord(g[0] - 1, g[1] - 1)
            pids = [(i % g[0], i // g[0]) for i in range(g[0] * g[1])]
            coords = [self.coord(a, b) for a, b in pids]
        spec = LaunchSpec(kernel, (g[0], g[1]), tuple(args), dict(kwargs or {}), neighbors,
                          coords, pids, check_ipcq(ipcq, self.name))
        self.launches.append(spec)
        self.actions.append(spec)
        return spec

    def output(self, tensor: Tensor, reference: Callable[[dict[str, np.ndarray]], Any]) -> None:
        """Declare ``tensor`` an output; ``reference(values)`` computes it from initial values."""
        if tensor.name not in self.tensors:
            raise CaptureError(f"output {tensor.name!r} is not a tensor of this workload")
        if tensor.staged or tensor.freed:
            state = "freed" if tensor.freed else "in memory a freed tensor had"
            raise CaptureError(f"output {tensor.name!r} is {state}; outputs are checked from "
                               f"their memory at the end: copy it to the host (w.copy_to_host) "
                               f"and make the host tensor the output")
        tensor.role = "output"
        self.outputs[tensor.name] = reference

    def resolve_arg(self, arg: Any, coord: tuple[int, int, int]) -> Any:
        if isinstance(arg, PerRank):
            if coord[0] not in arg.values:
                raise CaptureError(f"per-rank argument has no value for rank {coord[0]} (a "
                                   f"program runs on sip{coord[0]}.cube{coord[1]}.pe{coord[2]}); "
                                   f"give every launched rank a value")
            arg = arg.values[coord[0]]
        if isinstance(arg, (list, tuple)) and any(isinstance(a, (Tensor, PerRank)) for a in arg):
            return type(arg)(self.resolve_arg(a, coord) for a in arg)
        if not isinstance(arg, Tensor):
            return arg
        if arg.space != "hbm":
            raise CaptureError(f"tensor {arg.name!r} lives in host memory, which kernels cannot "
                               f"address; copy it to a device tensor with w.copy_to_device")
        if not arg.sharded:
            return arg.shards[0].addr
        for s in arg.shards:
            if (s.sip, s.cube, s.pe) == coord:
                return s.addr
        if all(s.offset == arg.shards[0].offset and s.shape == arg.shape for s in arg.shards):
            # whole copies (replicas): the nearest one, same cube first, then same SIP
            for near in (lambda s: (s.sip, s.cube) == coord[:2], lambda s: s.sip == coord[0]):
                for s in arg.shards:
                    if near(s):
                        return s.addr
        raise CaptureError(f"tensor {arg.name!r} has no shard on sip{coord[0]}.cube{coord[1]}."
                           f"pe{coord[2]}; pass t.shard_addr(i) explicitly")


def user_frame(exc: BaseException, path: str | Path) -> str:
    """``file:line`` where ``exc`` was raised in the workload file ``path`` (its deepest
    frame there), else the deepest frame of the traceback."""
    tb = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in tb if Path(f.filename).resolve() == Path(path).resolve()]
    frames = mine or list(tb)
    if not frames:
        return str(path)
    return f"{frames[-1].filename}:{frames[-1].lineno}"


def load_workload(path: str | Path) -> ModuleType:
    """Import a workload file as a fresh module (not cached in sys.modules)."""
    path = Path(path)
    if not path.is_file():
        raise CaptureError(f"workload file {str(path)!r} not found; pass a path like capture/gemm.py")
    mod_name = f"_kbtrace_workload_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as exc:
        where = f"{exc.filename or path}:{exc.lineno}" if exc.lineno else str(path)
        raise CaptureError(f"workload {str(path)!r} has a syntax error at {where}: {exc.msg}; "
                           "fix the file (kbtrace --traceback ... shows the whole error)"
                           ) from exc
    except Exception as exc:
        raise CaptureError(f"workload {str(path)!r} failed to import: {type(exc).__name__}: "
                           f"{exc} (at {user_frame(exc, path)}); fix the file (kbtrace "
                           "--traceback ... shows the whole error)") from exc
    finally:
        sys.modules.pop(mod_name, None)
    if not callable(getattr(mod, "build", None)):
        raise CaptureError(f"workload {str(path)!r} defines no build(w, p) function")
    return mod


def _convert(key: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            low = raw.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return low in ("true", "1", "yes")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise CaptureError(f"parameter {key}={raw!r}: expected {type(default).__name__} like the "
                           f"default {default!r}") from None
    return raw


def parse_params(defaults: Mapping[str, Any], overrides: Mapping[str, Any] | Sequence[str] | None
                 ) -> dict[str, Any]:
    """Merge overrides (``{"M": 256}`` or ``["M=256"]``) into defaults, typed by the defaults."""
    out = dict(defaults)
    if overrides is None:
        return out
    items: list[tuple[str, Any]] = []
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    else:
        for kv in overrides:
            if "=" not in kv:
                raise CaptureError(f"parameter {kv!r}: use KEY=VALUE, e.g. -p M=256")
            k, v = kv.split("=", 1)
            items.append((k.strip(), v.strip()))
    for k, v in items:
        if k not in defaults:
            import difflib
            close = difflib.get_close_matches(k, list(defaults), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise CaptureError(f"unknown parameter {k!r}; {hint}this workload takes "
                               f"{', '.join(sorted(defaults)) or 'no parameters'}")
        out[k] = _convert(k, v, defaults[k]) if isinstance(v, str) else v
    return out

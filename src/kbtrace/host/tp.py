"""Megatron-style tensor parallelism over SIPs (ADR-0027): TP groups, parallel linear layers,
region primitives.

A TP group is a set of SIPs (ranks); ``initialize_model_parallel(w, size)`` takes SIPs
``0 .. size-1``. A ``RankTensor`` is one tensor per rank of a group (what the predecessor's
workers each held); pass ``t.arg(w)`` (or the layer does) so every program gets its own
rank's tensor.

Shard ownership across ranks comes from the layer (ADR-0027 D4-pre); placement inside a
rank from a ``DPPolicy`` over ``cubes`` cubes (default 1) and all PEs of each:

``ColumnParallelLinear``  W (in, out) -> rank r owns columns ``[r*out/tp, (r+1)*out/tp)``,
                          ``DPPolicy(cube=column_wise, pe=column_wise)``; input replicated
                          per rank (a copy per cube), output (B, out/tp) column-sharded like
                          the weight. One launch: each PE ``tl.load`` s x and its weight
                          columns tile by tile, ``tl.dot`` s in f32, ``tl.store`` s its slice.
``RowParallelLinear``     W (in, out) -> rank r owns rows ``[r*in/tp, (r+1)*in/tp)``, split
                          column-wise over its PEs; input = a ColumnParallel output. Each PE
                          loads every shard of its rank's input (the whole K of that rank),
                          computes its output columns as an f32 partial sum into the rank's
                          (B, out) partial on PE 0 of cube 0, the partials are all-reduced
                          over the SIPs (``w.all_reduce``, kbtrace.collectives) and each PE
                          casts its columns to the dtype into the output shard.
``reduce_from_tp_region`` sum over the group's ranks per shard position: a ring over the
                          group's SIPs per (cube, PE) (reduce-scatter then all-gather over
                          ``global_E`` / ``global_W`` IPCQ). ``w.all_reduce`` of the
                          collectives package sums over *every* shard, so it serves here
                          only where each rank holds one shard: RowParallelLinear uses it
                          (LRAB) when the group is every SIP, this ring for a sub-group.
``copy_to_tp_region``     identity (forward only, ADR-0027 D6).
``scatter_to_tp_region``  a replicated per-rank tensor -> each rank keeps its column slice.
``gather_from_tp_region`` refused, as in the reference: it needs an all-gather collective.

Forward only; no bias (ADR-0027 D8/D9).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kbtrace.capture.workload import PerRank, Tensor, Workload
from kbtrace.collectives.kernels import ring_chunks
from kbtrace.errors import CaptureError
from kbtrace.host.placement import DPPolicy

__all__ = ["TPGroup", "RankTensor", "initialize_model_parallel", "ColumnParallelLinear",
           "RowParallelLinear", "copy_to_tp_region", "reduce_from_tp_region",
           "scatter_to_tp_region", "gather_from_tp_region", "ring_allreduce_kernel",
           "linear_kernel", "row_linear_kernel"]

_ACC = "f32"


@dataclass(frozen=True)
class TPGroup:
    """The SIPs (ranks) of one tensor-parallel group, in ring order."""
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)

    def rank(self, sip: int) -> int:
        """Position of SIP ``sip`` in the group (its TP rank)."""
        return self.ranks.index(sip)


def initialize_model_parallel(w: Workload, tensor_model_parallel_size: int | None = None
                              ) -> TPGroup:
    """The TP group of SIPs ``0 .. size-1`` (default: every SIP, as ADR-0027 D3)."""
    size = w.world_size if tensor_model_parallel_size is None else tensor_model_parallel_size
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= w.world_size:
        raise CaptureError(f"workload {w.name!r}: tensor-parallel size {size!r} must be between "
                           f"1 and the {w.world_size} SIP(s) of {w.topo.params.name!r} (more: "
                           f"--set system.sips.count=N)")
    return TPGroup(tuple(range(size)))


@dataclass
class RankTensor:
    """One tensor per rank of ``group`` (equal per-rank shape and dtype)."""
    group: TPGroup
    tensors: dict[int, Tensor] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensors[self.group.ranks[0]].shape

    @property
    def dtype(self) -> str:
        return self.tensors[self.group.ranks[0]].dtype

    def __getitem__(self, sip: int) -> Tensor:
        return self.tensors[sip]

    def arg(self) -> PerRank:
        """The kernel argument: each program gets its own rank's tensor."""
        return PerRank(dict(self.tensors))

    def shard_addrs(self) -> PerRank:
        """Per rank, the list of its shard addresses in shard order."""
        return PerRank({r: [s.addr for s in t.shards] for r, t in self.tensors.items()})


def rank_tensor(w: Workload, group: TPGroup, name: str, shape: Sequence[int], dtype: str,
                dp: DPPolicy, init: Callable[[int], Any] | None = None) -> RankTensor:
    """``name.r{sip}`` on every rank of ``group``, placed by ``dp``; ``init(tp_rank)`` gives a
    rank's initial values (default zeros)."""
    rt = RankTensor(group)
    for i, sip in enumerate(group.ranks):
        rt.tensors[sip] = w.tensor(f"{name}.r{sip}", tuple(shape), dtype,
                                   init="zeros" if init is None else init(i), dp=dp, sip=sip)
    return rt


# ----------------------------------------------------------------------------- kernels
def linear_kernel(tl, x_ptr, w_ptr, y_ptr, B, K, N, BK, dtype):
    """``y = x @ w`` on one PE: x (B, K) and the PE's weight columns (K, N), K in BK tiles."""
    esz = tl.sizeof(dtype)
    acc = tl.zeros((B, N), _ACC)
    for k0 in range(0, K, BK):
        a = tl.load(x_ptr + k0 * esz, (B, BK), dtype, strides=(K, 1))
        b = tl.load(w_ptr + k0 * N * esz, (BK, N), dtype)
        acc = tl.dot(a, b, acc)
    tl.store(y_ptr, acc if dtype == _ACC else acc.to(dtype))


def row_linear_kernel(tl, h_shards, w_ptr, y_ptr, B, KS, N, dtype, OUT=0):
    """Partial ``y = h @ w`` (f32) on one PE: h is the rank's input in column shards of
    (B, KS) (every shard loaded), w the PE's weight columns (len(h_shards) * KS, N). With
    ``OUT`` > 0, ``y_ptr`` is the rank's whole (B, OUT) partial and the PE stores its columns
    ``(cube * num_pes + pe) * N ..`` there; else ``y_ptr`` is the PE's own (B, N) shard."""
    esz = tl.sizeof(dtype)
    acc = tl.zeros((B, N), _ACC)
    for j, h_ptr in enumerate(h_shards):
        a = tl.load(h_ptr, (B, KS), dtype)
        b = tl.load(w_ptr + j * KS * N * esz, (KS, N), dtype)
        acc = tl.dot(a, b, acc)
    if OUT:
        col = (tl.cube_id() * tl.num_pes() + tl.pe_id()) * N
        tl.store(y_ptr + col * tl.sizeof(_ACC), acc, strides=(OUT, 1))
    else:
        tl.store(y_ptr, acc)


def cast_columns_kernel(tl, src_ptr, dst_ptr, B, OUT, N, dtype):
    """This PE's N columns of the rank's reduced (B, OUT) f32 sum -> its (B, N) ``dtype`` shard."""
    col = (tl.cube_id() * tl.num_pes() + tl.pe_id()) * N
    v = tl.load(src_ptr + col * tl.sizeof(_ACC), (B, N), _ACC, strides=(OUT, 1))
    tl.store(dst_ptr, v if dtype == _ACC else v.to(dtype))


def ring_allreduce_kernel(tl, src_ptr, dst_ptr, n, p, dtype, out_dtype):
    """Sum ``n`` elements over the ``p`` programs of a ring (``global_E`` to the next SIP):
    reduce-scatter then all-gather of ``n / p``-element chunks; stores the sum, cast to
    ``out_dtype``, at ``dst_ptr``."""
    r = tl.program_id(1) // max(1, tl.num_programs(1) // p) if p > 1 else 0
    c = n // p
    esz, osz = tl.sizeof(dtype), tl.sizeof(out_dtype)
    chunks = [tl.load(src_ptr + i * c * esz, (c,), dtype) for i in range(p)]
    ring_chunks(tl, chunks, r, "global_E", "global_W", dtype)
    for i in range(p):
        v = chunks[i] if out_dtype == dtype else chunks[i].to(out_dtype)
        tl.store(dst_ptr + i * c * osz, v)


# ----------------------------------------------------------------------------- primitives
def copy_to_tp_region(x: RankTensor) -> RankTensor:
    """Forward identity (ADR-0027 D6)."""
    return x


def reduce_from_tp_region(w: Workload, x: RankTensor, out: RankTensor | None = None
                          ) -> RankTensor:
    """All-reduce (sum) of ``x`` over its group, shard by shard (every rank must place ``x``
    alike): a ring per (cube, PE) over the group's SIPs. The sum goes to ``out`` (default:
    in place), cast to ``out``'s dtype."""
    g = x.group
    out = x if out is None else out
    first = x[g.ranks[0]]
    for sip in g.ranks:
        t, o = x[sip], out[sip]
        if [(s.cube, s.pe, s.shape) for s in t.shards] != [(s.cube, s.pe, s.shape)
                                                          for s in first.shards] or \
                [(s.cube, s.pe, s.shape) for s in o.shards] != [(s.cube, s.pe, s.shape)
                                                               for s in t.shards]:
            raise CaptureError(f"all-reduce of {first.name!r}: rank {sip} places its tensors "
                               f"differently from rank {g.ranks[0]}; use the same DPPolicy")
    n = int(np.prod(first.shards[0].shape))
    if n % g.size:
        raise CaptureError(f"all-reduce of {first.name!r}: {n} elements per shard do not split "
                           f"into {g.size} ring chunks; use a multiple of {g.size}")
    per_sip = len(first.shards)
    neighbors = {}
    for i in range(g.size):
        for k in range(per_sip):
            neighbors[i * per_sip + k] = {"global_E": ((i + 1) % g.size) * per_sip + k,
                                          "global_W": ((i - 1) % g.size) * per_sip + k}
    coords = sorted({(s.cube, s.pe) for s in first.shards})
    w.launch(ring_allreduce_kernel, args=(x.arg(), out.arg(), n, g.size, x.dtype, out.dtype),
             neighbors=neighbors, sips=list(g.ranks), cubes=sorted({c for c, _ in coords}),
             pes=sorted({p for _, p in coords}))
    return out


def scatter_to_tp_region(w: Workload, x: RankTensor, name: str, cubes: int = 1) -> RankTensor:
    """Each rank keeps columns ``[r*D/tp, (r+1)*D/tp)`` of its replicated (B, D) ``x``,
    column-sharded over the PEs of ``cubes`` cubes."""
    g = x.group
    b, d = x.shape
    if d % g.size:
        raise CaptureError(f"scatter of {x[g.ranks[0]].name!r}: {d} columns over {g.size} ranks "
                           f"does not divide; use a multiple of {g.size}")
    dp = DPPolicy(cube="column_wise", pe="column_wise", num_cubes=cubes)
    out = rank_tensor(w, g, name, (b, d // g.size), x.dtype, dp)
    first = out[g.ranks[0]]
    nl = first.shards[0].shape[1]
    w.launch(_slice_kernel, args=(x.arg(), out.arg(), b, d, nl, d // g.size, x.dtype),
             on=list(out.tensors.values()))
    return out


def _slice_kernel(tl, x_ptr, y_ptr, B, D, NL, DR, dtype):
    """Copy this PE's NL columns of the rank's DR-column part of x (B, D) into y (B, NL)
    (ranks are SIPs 0.., column-sharded cube-first over every PE of the launch's cubes)."""
    col = tl.sip_id() * DR + (tl.cube_id() * tl.num_programs(0) + tl.pe_id()) * NL
    v = tl.load(x_ptr + col * tl.sizeof(dtype), (B, NL), dtype, strides=(D, 1))
    tl.store(y_ptr, v)


def gather_from_tp_region(*_args: Any, **_kw: Any) -> RankTensor:
    raise CaptureError("gather_from_tp_region needs an all-gather collective, which kbtrace "
                       "does not have yet (the reference left it unimplemented too, ADR-0027 "
                       "D6); keep the output sharded and follow with a RowParallelLinear")


# ----------------------------------------------------------------------------- layers
class ColumnParallelLinear:
    """``y_r = x @ W[:, r-th column block]`` on every rank r of ``group`` (see module doc).

    ``weight``: the full (in, out) weight as an array (each rank gets its columns);
    ``cubes``: cubes per SIP the layer spreads over (all their PEs); ``BK``: K tile."""

    def __init__(self, w: Workload, group: TPGroup, in_features: int, out_features: int,
                 dtype: str, weight: np.ndarray, name: str = "col", cubes: int = 1,
                 BK: int = 128) -> None:
        if out_features % group.size:
            raise CaptureError(f"ColumnParallelLinear {name!r}: out_features {out_features} "
                               f"does not split over {group.size} ranks; use a multiple")
        self.w, self.group, self.name, self.dtype = w, group, name, dtype
        self.in_features, self.out_features, self.cubes = in_features, out_features, cubes
        self.k_local = out_features // group.size
        self.BK = min(BK, in_features)
        if in_features % self.BK:
            raise CaptureError(f"ColumnParallelLinear {name!r}: in_features {in_features} is "
                               f"not a multiple of the K tile {self.BK}")
        weight = np.asarray(weight)
        if weight.shape != (in_features, out_features):
            raise CaptureError(f"ColumnParallelLinear {name!r}: weight {weight.shape}, expected "
                               f"{(in_features, out_features)}")
        self.dp = DPPolicy(cube="column_wise", pe="column_wise", num_cubes=cubes)
        kl = self.k_local
        self.weight = rank_tensor(w, group, f"{name}.weight", (in_features, kl), dtype, self.dp,
                                  init=lambda i: weight[:, i * kl:(i + 1) * kl])

    def full_weight(self, v: dict[str, np.ndarray]) -> np.ndarray:
        """The layer's (in, out) weight from a reference's initial values ``v``."""
        return np.concatenate([v[self.weight[s].name] for s in self.group.ranks], axis=1)

    def __call__(self, x: RankTensor) -> RankTensor:
        if x.shape[-1] != self.in_features:
            raise CaptureError(f"ColumnParallelLinear {self.name!r}: input {x.shape}, expected "
                               f"(B, {self.in_features})")
        b = x.shape[0]
        out = rank_tensor(self.w, self.group, f"{self.name}.out", (b, self.k_local), self.dtype,
                          self.dp)
        wt = self.weight[self.group.ranks[0]]
        n = wt.shards[0].shape[1]
        self.w.launch(linear_kernel, args=(x.arg(), self.weight.arg(), out.arg(), b,
                                           self.in_features, n, self.BK, self.dtype),
                      on=list(self.weight.tensors.values()))
        return out

    forward = __call__


class RowParallelLinear:
    """``y = sum_r x_r @ W[r-th row block, :]`` on every rank of ``group`` (see module doc);
    ``x`` is a ColumnParallelLinear output (column-sharded the same way)."""

    def __init__(self, w: Workload, group: TPGroup, in_features: int, out_features: int,
                 dtype: str, weight: np.ndarray, name: str = "row", cubes: int = 1) -> None:
        if in_features % group.size:
            raise CaptureError(f"RowParallelLinear {name!r}: in_features {in_features} does not "
                               f"split over {group.size} ranks; use a multiple")
        self.w, self.group, self.name, self.dtype = w, group, name, dtype
        self.in_features, self.out_features, self.cubes = in_features, out_features, cubes
        self.n_local = in_features // group.size
        weight = np.asarray(weight)
        if weight.shape != (in_features, out_features):
            raise CaptureError(f"RowParallelLinear {name!r}: weight {weight.shape}, expected "
                               f"{(in_features, out_features)}")
        self.dp = DPPolicy(cube="column_wise", pe="column_wise", num_cubes=cubes)
        nl = self.n_local
        self.weight = rank_tensor(w, group, f"{name}.weight", (nl, out_features), dtype, self.dp,
                                  init=lambda i: weight[i * nl:(i + 1) * nl, :])

    def full_weight(self, v: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([v[self.weight[s].name] for s in self.group.ranks], axis=0)

    def __call__(self, x: RankTensor) -> RankTensor:
        if x.shape[-1] != self.n_local:
            raise CaptureError(f"RowParallelLinear {self.name!r}: input {x.shape} per rank, "
                               f"expected (B, {self.n_local}) (a ColumnParallelLinear output)")
        x0 = x[self.group.ranks[0]]
        ks = x0.shards[0].shape[-1]
        if any(s.shape[-1] != ks or s.offset[-1] != i * ks for i, s in enumerate(x0.shards)):
            raise CaptureError(f"RowParallelLinear {self.name!r}: input {x0.name!r} must be "
                               f"column-sharded in order (a ColumnParallelLinear output)")
        b = x.shape[0]
        wt = self.weight[self.group.ranks[0]]
        n = wt.shards[0].shape[1]
        out = rank_tensor(self.w, self.group, f"{self.name}.out", (b, self.out_features),
                          self.dtype, self.dp)
        if self.group.size < self.w.world_size:
            # a sub-group: the collectives package reduces over every SIP, so ring it here
            partial = rank_tensor(self.w, self.group, f"{self.name}.partial",
                                  (b, self.out_features), _ACC, self.dp)
            self.w.launch(row_linear_kernel, args=(x.shard_addrs(), self.weight.arg(),
                                                   partial.arg(), b, ks, n, self.dtype),
                          on=list(self.weight.tensors.values()))
            return reduce_from_tp_region(self.w, partial, out)
        # every PE writes its columns of the rank's (B, out) f32 partial on PE 0 of cube 0;
        # the collectives' all-reduce (LRAB, inter-SIP phase) sums them over the SIPs; each
        # PE then casts its columns into the output shard
        partial = RankTensor(self.group, {
            sip: self.w.tensor(f"{self.name}.partial.r{sip}", (b, self.out_features), _ACC,
                               sip=sip) for sip in self.group.ranks})
        self.w.launch(row_linear_kernel, args=(x.shard_addrs(), self.weight.arg(), partial.arg(),
                                               b, ks, n, self.dtype, self.out_features),
                      on=list(self.weight.tensors.values()))
        self.w.all_reduce([partial[s] for s in self.group.ranks], op="sum")
        self.w.launch(cast_columns_kernel, args=(partial.arg(), out.arg(), b, self.out_features,
                                                 n, self.dtype),
                      on=list(out.tensors.values()))
        return out

    forward = __call__

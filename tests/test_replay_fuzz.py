"""End-to-end property test: random small kernels through capture -> replay (fast, flit) -> verify.

Hypothesis generates a kernel *spec* (``KernelSpec``): input tensors of random shape and dtype
(f32, f16, bf16, i32, i8: tiny, odd and non-multiple-of-flit byte counts) on random PEs' HBM
slices (``tl``/``w.tensor`` place tensors in HBM only: there is no SRAM placement to draw), one
or two launches of 1-8 programs, and per program a random op sequence mixing 1-D and strided
2-D loads, contiguous and strided stores into per-program output tensors (re-loaded later, also
by the next launch), dots (with and without an accumulator), element-wise / scalar math,
comparisons, ``where``, ``fma``, ``clamp``, casts, reductions, fills, ``tl.cycles``,
asynchronous ``tl.composite`` gemm / math (operands referenced or pinned, random epilogues,
waited at once or later, the output re-loaded before or after the wait) and IPCQ exchanges over
a ring (1-3 messages per sender; ``send`` / ``recv``, ``recv_async`` waited at once or after
the next phase, or posted before the program's own send). The spec is type-checked
symbolically while it is drawn, so every generated kernel captures cleanly; it carries no
races (inputs are read-only, each program writes only its own outputs, composites their own).
Topologies: ``tiny.yaml`` (sometimes ``small.yaml``), plain or with one of ``VARIANTS``
(IPCQ slots in SRAM / HBM, more DMA channels, HBM turnaround penalty and efficiency).

Every example is captured twice: the first capture's capture-order golden execution gives the
values every output must end with, which the second capture declares as the outputs'
references. Then, for ``fast`` and ``flit``:

* the replay succeeds (the physical invariants run on every replay: ``InvariantError``);
* ``kbtrace.verify`` passes (outputs and every op digest in replay order);
* op_timing is consistent: ``t_issue <= t_start <= t_end``, ``0 <= queue_ns <= t_end -
  t_issue``; each op's hop rows lie inside ``[t_issue, t_end]``, are numbered 0..k-1 and
  their ``crit_ns`` sum to ``t_end - t_issue`` (README, Outputs);
* replaying the same inputs again gives byte-identical ``op_timing.parquet`` and
  ``hops.parquet`` (README, Determinism), and a replay with a small ``batch_rows`` gives the
  same tables and run id (README, Python API: batching does not change results);

and across the two modes:

* a kernel on one PE with only synchronous ops has every transfer alone on its path, for which
  the README (Fidelity modes) claims ``fast`` equals ``flit`` exactly, except an HBM write of
  3+ flits with a partial last flit ("under one flit time"): every op's latency must agree to
  1e-6 ns (the tolerance of ``test_lone_transfer_fast_equals_flit``), such a store's to one
  flit time at its bottleneck, and without one every ``t_end`` too;
* otherwise the makespans agree within ``MAKESPAN_TOL`` (10%).

``test_replay_fuzz`` runs 60 derandomized examples without shrinking (CI, ~10 s);
``test_replay_fuzz_slow`` (``-m slow``) runs ``KBTRACE_FUZZ_EXAMPLES`` (default 300) from seed
``KBTRACE_FUZZ_SEED`` (default 0), shrinks failures and prints (``-s``) the worst fast/flit
makespan ratio seen and its kernel. ``KBTRACE_FUZZ_AVOID=partial_burst`` sidesteps a known
failure family so the fuzzer can look for others: it skips the exact fast == flit check for
kernels with a load of more than one flit that is not a flit multiple. By default nothing is
avoided.
``KBTRACE_FUZZ_MAKESPAN_TOL`` overrides the 10% fast/flit makespan bound,
``KBTRACE_FUZZ_TOPOS`` the topologies drawn from (default ``tiny,tiny,tiny,tiny,small``).
"""

from __future__ import annotations

import math
import os
import shutil
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings, target
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

import kbtrace
from kbtrace.capture import ring
from kbtrace.replay import ReplayOptions
from kbtrace.topology import PeCoord

TOPO_DIR = Path(__file__).resolve().parent.parent / "topologies"
FLOATS = ("f32", "f16", "bf16")
DTYPES = FLOATS + ("i32", "i8")
ISZ = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i8": 1, "bool": 1}
ACC = {"f32": "f32", "f16": "f32", "bf16": "f32"}
FLIT = 256                      # cube.hbm.burst_bytes on tiny/small
MAKESPAN_TOL = float(os.environ.get("KBTRACE_FUZZ_MAKESPAN_TOL", "0.10"))
EXACT_NS = 1e-6
MAG_MAX = 1e3                   # float magnitudes stay far from f16 overflow
AVOID = frozenset(x.strip() for x in os.environ.get("KBTRACE_FUZZ_AVOID", "").split(",")
                  if x.strip())

#: topologies drawn from (repeats weight them); KBTRACE_FUZZ_TOPOS=tiny,small,default widens it
TOPOS = tuple(os.environ.get("KBTRACE_FUZZ_TOPOS", "tiny,tiny,tiny,tiny,small").split(","))
#: topology variants drawn besides the plain YAML (overrides as in ``kbtrace replay --set``)
VARIANTS: tuple[tuple[tuple[str, object], ...], ...] = (
    (),
    (("pe.ipcq.buffer_kind", "sram"),),
    (("pe.ipcq.buffer_kind", "hbm"),),
    (("pe.dma.read_channels", 2), ("pe.dma.write_channels", 3)),
    (("cube.hbm.switch_penalty_ns", 3.0), ("cube.hbm.efficiency", 0.8)),
)
_TOPOS: dict[tuple, object] = {}


def topo(name: str, overrides: tuple[tuple[str, object], ...] = ()):
    key = (name, overrides)
    t = _TOPOS.get(key)
    if t is None:
        t = _TOPOS[key] = kbtrace.compile_topology(TOPO_DIR / f"{name}.yaml",
                                                   overrides=dict(overrides) or None)
    return t


# ----------------------------------------------------------------------------- the spec

@dataclass(frozen=True)
class TSpec:
    """A tensor: ``shape`` (1-D or 2-D), dtype, the (sip, cube, pe) whose HBM slice holds it."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    pe: tuple[int, int, int]
    init: bool = True                  # random values (inputs) or zeros (outputs)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class KernelSpec:
    topo: str
    tensors: tuple[TSpec, ...]
    outputs: tuple[str, ...]
    #: per launch (in order): (grid, phases); a phase is ("local", per-program op tuples) or
    #: ("xchg", mode, per-program index of the handle sent east or None, messages per sender)
    launches: tuple[tuple[tuple[int, int], tuple[tuple, ...]], ...]
    sync_only: bool                    # one PE, no composite, recv_async or IPCQ at all
    overrides: tuple[tuple[str, object], ...] = ()     # topology overrides (``VARIANTS``)
    batch_rows: int = 65_536           # ReplayOptions.batch_rows of the third replay

    def describe(self) -> str:
        lines = [f"topo={self.topo} {dict(self.overrides)} sync_only={self.sync_only}"]
        lines += [f"  tensor {t.name} {t.shape} {t.dtype} on {t.pe}" for t in self.tensors]
        for li, (grid, phases) in enumerate(self.launches):
            lines.append(f"  launch {li} grid={grid}")
            for ph in phases:
                if ph[0] == "local":
                    for p, ops in enumerate(ph[1]):
                        lines += [f"    p{p}: {op}" for op in ops]
                else:
                    lines.append(f"    xchg {ph[1]} sends={ph[2]} x{ph[3]}")
        return "\n".join(lines)


@dataclass
class _H:
    """A symbolic TCM handle while drawing: shape, dtype, magnitude bound."""
    shape: tuple[int, ...]
    dtype: str
    mag: float


class _Drawer:
    """Draws a type-correct spec; mirrors exactly what ``fuzz_kernel`` will do."""

    def __init__(self, draw, topo_name: str, overrides: tuple) -> None:
        self.draw = draw
        self.topo = topo_name
        self.overrides = overrides
        t = topo(topo_name, overrides)
        self.pes = [(c.sip, c.cube, c.pe) for c in t.pes]
        self.ipcq = (t.params.pe.ipcq.n_slots, t.params.pe.ipcq.slot_bytes)
        self.tensors: list[TSpec] = []
        self.outputs: list[str] = []
        #: per-program output tensors: 1-D "o{launch}_{prog}_{dtype}" -> elements needed, 2-D
        #: "q{launch}_{prog}_{dtype}" (strided tile stores) -> [rows, cols] needed
        self.arena: dict[str, int] = {}
        self.arena2: dict[str, list[int]] = {}
        self.sync_only = True

    def start_launch(self, li: int, grid: tuple[int, int]) -> None:
        self.li = li
        self.n_prog = n = grid[0] * grid[1]
        self.pool: list[list[_H]] = [[] for _ in range(n)]
        self.later: list[list[_H]] = [[] for _ in range(n)]   # recv_async not yet waited
        self.couts: list[list[str]] = [[] for _ in range(n)]
        self.pending_comp = [0] * n
        self.done_arenas = dict(self.arena)                    # written by earlier launches

    # -- helpers
    def place(self) -> tuple[int, int, int]:
        return self.draw(st.sampled_from(self.pes))

    def size(self, lo: int, hi: int) -> int:
        """Sizes biased to the interesting: 1, odd, around flit multiples."""
        return self.draw(st.one_of(st.integers(lo, hi), st.sampled_from(
            [x for x in (1, 2, 3, 7, 31, 33, 63, 64, 65, 127, 129) if lo <= x <= hi] or [lo])))

    def new_tensor(self, prefix: str, shape, dtype: str, init: bool) -> str:
        name = f"{prefix}{len(self.tensors)}"
        self.tensors.append(TSpec(name, tuple(shape), dtype, self.place(), init))
        return name

    def inputs(self, dtype: str | None = None, min_numel: int = 1) -> list[TSpec]:
        return [t for t in self.tensors if t.init and (dtype is None or t.dtype == dtype)
                and t.numel >= min_numel]

    def float_dtypes(self) -> list[str]:
        return sorted({t.dtype for t in self.inputs() if t.dtype in FLOATS})

    def readable(self, p: int) -> list[tuple[str, int]]:
        """1-D output tensors program ``p`` may load without a race: its own of this launch
        (so far), and every one an earlier launch wrote."""
        mine = f"o{self.li}_{p}_"
        return sorted([(k, n) for k, n in self.arena.items() if k.startswith(mine)]
                      + list(self.done_arenas.items()))

    def handles(self, p: int, floats: bool = False, ndim: int | None = None) -> list[int]:
        return [i for i, h in enumerate(self.pool[p])
                if (not floats or h.dtype in FLOATS) and (ndim is None or len(h.shape) == ndim)]

    # -- ops of one program
    def local_op(self, p: int):
        d = self.draw
        pool = self.pool[p]
        kinds = ["ld1", "ld1", "ld2", "fill", "cyc", "dot"]
        if pool:
            kinds += ["st", "st", "un", "bin", "sc", "more"]
            if self.handles(p, ndim=2):
                kinds.append("st2")
        if self.couts[p]:
            kinds.append("ldc")
        if self.readable(p):
            kinds.append("lda")
        kinds += ["cg", "cm"]
        if self.pending_comp[p]:
            kinds.append("wait")
        k = d(st.sampled_from(kinds))
        if k in ("ld1", "ld2"):
            t = d(st.sampled_from(self.inputs()))
            if k == "ld1" or len(t.shape) == 1:
                off = d(st.integers(0, t.numel - 1))
                n = self.size(1, t.numel - off)
                pool.append(_H((n,), t.dtype, 1.0))
                return ("ld1", t.name, off, n)
            rows, cols = t.shape
            r0, c0 = d(st.integers(0, rows - 1)), d(st.integers(0, cols - 1))
            r, c = d(st.integers(1, rows - r0)), d(st.integers(1, cols - c0))
            pool.append(_H((r, c), t.dtype, 1.0))
            return ("ld2", t.name, r0, c0, r, c)
        if k == "ldc":
            name = d(st.sampled_from(self.couts[p]))
            t = next(x for x in self.tensors if x.name == name)
            pool.append(_H(t.shape, t.dtype, MAG_MAX))    # values unknown: no exp of them
            return ("ldc", name)
        if k == "st":
            i = d(st.integers(0, len(pool) - 1))
            h = pool[i]
            off = d(st.integers(0, 40))
            key = f"o{self.li}_{p}_{h.dtype}"
            self.arena[key] = max(self.arena.get(key, 0), off + math.prod(h.shape))
            return ("st", i, off)
        if k == "st2":
            i = d(st.sampled_from(self.handles(p, ndim=2)))
            h = pool[i]
            r0, c0 = d(st.integers(0, 5)), d(st.integers(0, 9))
            key = f"q{self.li}_{p}_{h.dtype}"
            need = self.arena2.setdefault(key, [0, 0])
            need[0], need[1] = max(need[0], r0 + h.shape[0]), max(need[1], c0 + h.shape[1])
            return ("st2", i, r0, c0)
        if k == "lda":
            name, size = d(st.sampled_from(self.readable(p)))
            dt = name.rsplit("_", 1)[1]
            off = d(st.integers(0, size - 1))
            n = d(st.integers(1, size - off))
            pool.append(_H((n,), dt, MAG_MAX))
            return ("lda", name, off, n)
        if k == "fill":
            kind = d(st.sampled_from(["zeros", "full", "arange"]))
            if kind == "arange":
                n = self.size(1, 300)
                dt = d(st.sampled_from(["i32", "f32"]))
                pool.append(_H((n,), dt, float(n)))
                return ("fill", "arange", (n,), dt, 0.0)
            shape = d(st.sampled_from([(self.size(1, 200),), (self.size(1, 24), self.size(1, 40))]))
            dt = d(st.sampled_from(DTYPES))
            v = d(st.sampled_from([0.0, 1.0, -0.5, 3.0]))
            pool.append(_H(shape, dt, abs(v)))
            return ("fill", kind, shape, dt, v)
        if k == "cyc":
            return ("cyc", d(st.integers(0, 300)))
        if k == "dot":
            dt = d(st.sampled_from(self.float_dtypes()))
            cands = self.inputs(dt)
            if not cands:
                return ("cyc", 1)
            ta, tb, M, K, N, oa, ob = self.gemm_operands(cands, 64, 48)
            acc_dt = ACC[dt]
            accs = [i for i, h in enumerate(pool) if h.shape == (M, N) and h.dtype == acc_dt
                    and h.mag < MAG_MAX / 2]
            acc = d(st.sampled_from([None, "zeros", *accs]))
            mag = K + (pool[acc].mag if isinstance(acc, int) else 0.0)
            pool += [_H((M, K), dt, 1.0), _H((K, N), dt, 1.0)]
            if acc == "zeros":
                pool.append(_H((M, N), acc_dt, 0.0))
            pool.append(_H((M, N), acc_dt, mag))
            return ("dot", ta.name, oa, tb.name, ob, M, K, N, acc)
        if k == "un":
            cand = self.handles(p, floats=True)
            if not cand:
                return ("cyc", 3)
            i = d(st.sampled_from(cand))
            h = pool[i]
            names = ["abs", "neg", "sigmoid", "cos", "sin", "sum", "max", "min", "softmax"]
            if h.mag <= 8:
                names.append("exp")
            if len(h.shape) == 2:
                names.append("trans")
            name = d(st.sampled_from(names))
            axis = None
            if name in ("sum", "max", "min", "softmax"):
                axis = d(st.sampled_from([None, *range(len(h.shape))] if name != "softmax"
                                         else list(range(len(h.shape)))))
            if name == "sum" and h.mag * math.prod(h.shape) > MAG_MAX:
                name, axis = "max", axis
            shape = h.shape
            if name in ("sum", "max", "min"):
                shape = tuple(1 if (axis is None or a == axis) else s for a, s in enumerate(shape))
            elif name == "trans":
                shape = shape[::-1]
            mag = {"sigmoid": 1.0, "cos": 1.0, "sin": 1.0, "softmax": 1.0,
                   "exp": math.exp(min(h.mag, 8.0)),
                   "sum": h.mag * math.prod(h.shape)}.get(name, h.mag)
            pool.append(_H(shape, h.dtype, mag))
            return ("un", i, name, axis)
        if k == "bin":
            cand = self.handles(p, floats=True)
            if not cand:
                return ("cyc", 4)
            i = d(st.sampled_from(cand))
            a = pool[i]
            js = []
            for j, b in enumerate(pool):
                if b.dtype != a.dtype:
                    continue
                try:
                    if tuple(np.broadcast_shapes(a.shape, b.shape)) == a.shape:
                        js.append(j)
                except ValueError:
                    pass
            j = d(st.sampled_from(js))
            name = d(st.sampled_from(["add", "sub", "mul", "maximum", "minimum"]))
            b = pool[j]
            mag = a.mag * b.mag if name == "mul" else a.mag + b.mag
            if mag > MAG_MAX:
                name, mag = "maximum", max(a.mag, b.mag)
            pool.append(_H(a.shape, a.dtype, mag))
            return ("bin", i, j, name)
        if k == "sc":
            cand = self.handles(p, floats=True)
            if not cand:
                return ("cyc", 5)
            i = d(st.sampled_from(cand))
            name = d(st.sampled_from(["mul", "add", "rsub"]))
            s = d(st.sampled_from([0.5, -1.0, 2.0, 0.25]))
            mag = pool[i].mag * abs(s) if name == "mul" else pool[i].mag + abs(s)
            if mag > MAG_MAX:
                name, s, mag = "mul", 0.5, pool[i].mag * 0.5
            pool.append(_H(pool[i].shape, pool[i].dtype, mag))
            return ("sc", i, name, s)
        if k == "more":        # comparisons, where, fma, clamp, casts, division
            cand = self.handles(p, floats=True)
            if not cand:
                return ("cyc", 8)
            i = d(st.sampled_from(cand))
            a = pool[i]
            same = [j for j, b in enumerate(pool) if b.dtype == a.dtype and b.shape == a.shape]
            conds = [j for j, b in enumerate(pool) if b.dtype == "bool" and _bcast(b.shape, a.shape)]
            names = ["gt", "lt", "clamp", "cast", "div"]
            if conds:
                names.append("where")
            if a.mag * a.mag + a.mag <= MAG_MAX:
                names.append("fma")
            name = d(st.sampled_from(names))
            if name in ("gt", "lt"):
                other = d(st.sampled_from([None, *same]))
                pool.append(_H(a.shape, "bool", 1.0))
                return ("more", name, i, other)
            if name == "where":
                c = d(st.sampled_from(conds))
                pool.append(_H(a.shape, a.dtype, max(a.mag, 0.5)))
                return ("more", name, i, c)
            if name == "fma":
                j, k2 = d(st.sampled_from(same)), d(st.sampled_from(same))
                pool.append(_H(a.shape, a.dtype, a.mag * pool[j].mag + pool[k2].mag))
                return ("more", name, i, (j, k2))
            if name == "cast":
                dt = d(st.sampled_from(["f32", "f16", "bf16", "i32"]))
                pool.append(_H(a.shape, dt, a.mag + 1))
                return ("more", name, i, dt)
            pool.append(_H(a.shape, a.dtype, 0.75 if name == "clamp" else a.mag / 2))
            return ("more", name, i, None)
        if k in ("cg", "cm"):
            dt = d(st.sampled_from(self.float_dtypes()))
            cands = self.inputs(dt)
            if not cands:
                return ("cyc", 6)
            wait_now = d(st.booleans())
            if k == "cm":
                t = d(st.sampled_from(cands))
                n = self.size(1, min(t.numel, 600))
                m = d(st.integers(1, max(1, t.numel // n)))
                if m * n > t.numel:
                    m = 1
                shape = (m, n) if d(st.booleans()) else (m * n,)
                off = d(st.integers(0, t.numel - m * n))
                pin = d(st.booleans())
                op_name = d(st.sampled_from(["abs", "sigmoid", "exp", "relu", "neg", "gelu"]))
                out = self.new_tensor("c", shape, dt, False)
                if pin:
                    pool.append(_H(shape, dt, 1.0))
            else:
                ta, tb, M, K, N, oa, ob = self.gemm_operands(cands, 130, 70)
                pin_a, pin_b = d(st.booleans()), d(st.booleans())
                epi = []
                for _ in range(d(st.integers(0, 2))):
                    e = d(st.sampled_from(["relu", "scale", "clamp", "sigmoid", "bias"]))
                    scope = d(st.sampled_from(["output_tile", "k_tile"]))
                    if e == "bias":
                        bc = self.inputs(dt, N)
                        if not bc:
                            continue
                        bt = d(st.sampled_from(bc))
                        epi.append(("bias", scope, bt.name, d(st.integers(0, bt.numel - N))))
                    else:
                        epi.append((e, scope))
                out = self.new_tensor("c", (M, N), dt, False)
                if pin_a:
                    pool.append(_H((M, K), dt, 1.0))
                if pin_b:
                    pool.append(_H((K, N), dt, 1.0))
            self.sync_only = False
            self.outputs.append(out)
            self.couts[p].append(out)
            if not wait_now:
                self.pending_comp[p] += 1
            if k == "cm":
                return ("cm", t.name, off, shape, pin, op_name, out, wait_now)
            return ("cg", ta.name, oa, M, K, tb.name, ob, N, pin_a, pin_b, tuple(epi), out,
                    wait_now)
        if k == "wait":
            self.pending_comp[p] = 0
            return ("wait",)
        raise AssertionError(k)

    def gemm_operands(self, cands: list, k_max: int, mn_max: int) -> tuple:
        """Operands of an ``M x K`` by ``K x N`` product read from two input tensors (flat, at
        drawn offsets): ``(ta, tb, M, K, N, oa, ob)``."""
        d = self.draw
        ta, tb = d(st.sampled_from(cands)), d(st.sampled_from(cands))
        K = d(st.integers(1, min(k_max, ta.numel, tb.numel)))
        M = d(st.integers(1, min(mn_max, ta.numel // K)))
        N = d(st.integers(1, min(mn_max, tb.numel // K)))
        oa = d(st.integers(0, ta.numel - M * K))
        ob = d(st.integers(0, tb.numel - K * N))
        return ta, tb, M, K, N, oa, ob

    def local_phase(self) -> tuple:
        per = []
        for p in range(self.n_prog):
            ops = tuple(self.local_op(p) for _ in range(self.draw(st.integers(0, 6))))
            self.pool[p] += self.later[p]          # deferred recv_async waits run after the phase
            self.later[p] = []
            per.append(ops)
        return ("local", tuple(per))

    def xchg_phase(self) -> tuple:
        d = self.draw
        mode = d(st.sampled_from(["sync", "async_now", "async_later", "recv_first"]))
        # messages per sender: at most the IPCQ slots of a channel in flight (a kernel that
        # sends more before its peer receives would deadlock on real hardware too)
        count = d(st.integers(1, 3))
        slots, slot_b = self.ipcq
        sends = []
        for p in range(self.n_prog):
            ok = [i for i, h in enumerate(self.pool[p])
                  if count * min(slots, -(-math.prod(h.shape) * ISZ[h.dtype] // slot_b)) <= slots]
            sends.append(d(st.sampled_from(ok)) if ok and d(st.integers(0, 3)) else None)
        if all(s is None for s in sends):
            return ("xchg", mode, tuple(sends), count)
        self.sync_only = False                     # IPCQ: several PEs talk
        n = self.n_prog
        got = [self.pool[(p - 1) % n][sends[(p - 1) % n]] if sends[(p - 1) % n] is not None
               else None for p in range(n)]
        for p in range(n):
            if got[p] is not None:
                for _ in range(count):
                    h = _H(got[p].shape, got[p].dtype, got[p].mag)
                    (self.later if mode == "async_later" else self.pool)[p].append(h)
        return ("xchg", mode, tuple(sends), count)

    def spec(self, grids: list[tuple[int, int]]) -> KernelSpec:
        d = self.draw
        for _ in range(d(st.integers(1, 3))):
            if d(st.booleans()):
                shape = (self.size(1, 2000),)
            else:
                shape = (self.size(1, 48), self.size(1, 96))
            dt = d(st.sampled_from(FLOATS if not self.tensors else DTYPES))
            self.outputs.append(self.new_tensor("in", shape, dt, True))   # read-only: unchanged
        launches = []
        for li, grid in enumerate(grids):
            self.start_launch(li, grid)
            if self.n_prog > 1:
                self.sync_only = False
            phases = []
            for _ in range(d(st.integers(1, 4))):
                if self.n_prog > 1 and any(self.pool) and d(st.booleans()):
                    phases.append(self.xchg_phase())
                phases.append(self.local_phase())
            launches.append((grid, tuple(phases)))
        for name, n in sorted(self.arena.items()):
            self.tensors.append(TSpec(name, (n,), name.rsplit("_", 1)[1], self.place(), False))
            self.outputs.append(name)
        for name, (r, c) in sorted(self.arena2.items()):
            self.tensors.append(TSpec(name, (r, c), name.rsplit("_", 1)[1], self.place(), False))
            self.outputs.append(name)
        return KernelSpec(self.topo, tuple(self.tensors), tuple(self.outputs), tuple(launches),
                          self.sync_only, self.overrides,
                          d(st.sampled_from([1, 2, 3, 7, 16, 50, 65_536])))


def _bcast(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    try:
        return tuple(np.broadcast_shapes(small, big)) == big
    except ValueError:
        return False


@st.composite
def kernels(draw) -> KernelSpec:
    topo_name = draw(st.sampled_from(TOPOS))
    t = topo(topo_name)
    n_pe, n_cube = t.pes_per_cube, t.n_sips * t.cubes_per_sip
    grid = st.sampled_from([(1, 1)] * 3 + [(2, 1)] * 2 + ([(2, 2), (3, 1), (8, 1), (4, 2)]
                                                      if n_cube > 1 and n_pe > 4 else []))
    grids = draw(st.lists(grid, min_size=1, max_size=2))
    overrides = draw(st.sampled_from(VARIANTS[:1] * 4 + VARIANTS[1:]))
    return _Drawer(draw, topo_name, overrides).spec(grids)


# ----------------------------------------------------------------------------- the kernel

def fuzz_kernel(tl, spec, li, names, *addrs):
    """Interpret launch ``li`` of ``spec`` for this program (``_Drawer`` made the same
    decisions in the same order)."""
    prog = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    grid, phases = spec.launches[li]
    base = dict(zip(names, addrs, strict=True))
    tens = {t.name: t for t in spec.tensors}
    pool: list = []
    later: list = []
    comps: list = []
    n = grid[0] * grid[1]

    def ptr(name, elem):
        return base[name] + elem * ISZ[tens[name].dtype]

    for ph in phases:
        if ph[0] == "xchg":
            _, mode, sends, count = ph
            src, frm = sends[prog], sends[(prog - 1) % n]
            if mode == "recv_first" and frm is not None:
                futs = [tl.recv_async("intra_W") for _ in range(count)]
            if src is not None:
                for _ in range(count):
                    tl.send("intra_E", pool[src])
            if frm is not None:
                for c in range(count):
                    if mode == "sync":
                        pool.append(tl.recv("intra_W"))
                    elif mode == "async_now":
                        pool.append(tl.wait(tl.recv_async("intra_W")))
                    elif mode == "async_later":
                        later.append(tl.recv_async("intra_W"))
                    else:
                        pool.append(tl.wait(futs[c]))
            continue
        for op in ph[1][prog]:
            k = op[0]
            if k == "ld1":
                _, t, off, cnt = op
                pool.append(tl.load(ptr(t, off), (cnt,), tens[t].dtype))
            elif k == "ld2":
                _, t, r0, c0, r, c = op
                cols = tens[t].shape[1]
                pool.append(tl.load(ptr(t, r0 * cols + c0), (r, c), tens[t].dtype,
                                    strides=(cols, 1)))
            elif k == "ldc":
                t = tens[op[1]]
                pool.append(tl.load(base[t.name], t.shape, t.dtype))
            elif k == "st":
                _, i, off = op
                h = pool[i]
                tl.store(ptr(f"o{li}_{prog}_{h.dtype}", off), h)
            elif k == "st2":
                _, i, r0, c0 = op
                h = pool[i]
                name = f"q{li}_{prog}_{h.dtype}"
                cols = tens[name].shape[1]
                tl.store(ptr(name, r0 * cols + c0), h, strides=(cols, 1))
            elif k == "lda":
                _, name, off, cnt = op
                pool.append(tl.load(ptr(name, off), (cnt,), tens[name].dtype))
            elif k == "fill":
                _, kind, shape, dt, v = op
                if kind == "zeros":
                    pool.append(tl.zeros(shape, dt))
                elif kind == "full":
                    pool.append(tl.full(shape, v, dt))
                else:
                    pool.append(tl.arange(0, shape[0], dt))
            elif k == "cyc":
                tl.cycles(op[1])
            elif k == "dot":
                _, ta, oa, tb, ob, M, K, N, acc = op
                a = tl.load(ptr(ta, oa), (M, K), tens[ta].dtype)
                b = tl.load(ptr(tb, ob), (K, N), tens[tb].dtype)
                pool += [a, b]
                if acc == "zeros":
                    acc_h = tl.zeros((M, N), ACC[tens[ta].dtype])
                    pool.append(acc_h)
                else:
                    acc_h = None if acc is None else pool[acc]
                pool.append(tl.dot(a, b, acc_h))
            elif k == "un":
                _, i, name, axis = op
                h = pool[i]
                if name == "neg":
                    r = -h
                elif name in ("sum", "max", "min", "softmax"):
                    r = getattr(tl, name)(h, axis=axis) if axis is not None or name != "softmax" \
                        else tl.softmax(h)
                else:
                    r = getattr(tl, name)(h)
                pool.append(r)
            elif k == "bin":
                _, i, j, name = op
                pool.append(getattr(tl, name)(pool[i], pool[j]))
            elif k == "sc":
                _, i, name, s = op
                h = pool[i]
                pool.append(h * s if name == "mul" else h + s if name == "add" else s - h)
            elif k == "more":
                _, name, i, x = op
                h = pool[i]
                if name == "gt":
                    r = h > (0.0 if x is None else pool[x])
                elif name == "lt":
                    r = h < (0.25 if x is None else pool[x])
                elif name == "where":
                    r = tl.where(pool[x], h, -1.0)
                elif name == "fma":
                    r = tl.fma(h, pool[x[0]], pool[x[1]])
                elif name == "cast":
                    r = h.to(x)
                elif name == "clamp":
                    r = tl.clamp(h, -0.75, 0.5)
                else:
                    r = h / 2.0
                pool.append(r)
            elif k == "cm":
                _, t, off, shape, pin, math_op, out, wait_now = op
                dt = tens[t].dtype
                if pin:
                    a = tl.load(ptr(t, off), shape, dt)
                    pool.append(a)
                else:
                    a = tl.ref(ptr(t, off), shape, dt)
                c = tl.composite(op="math", a=a, out_ptr=base[out], math_op=math_op)
                (tl.wait(c) if wait_now else comps.append(c))
            elif k == "cg":
                _, ta, oa, M, K, tb, ob, N, pin_a, pin_b, epi, out, wait_now = op
                dt = tens[ta].dtype
                a = (tl.load if pin_a else tl.ref)(ptr(ta, oa), (M, K), dt)
                b = (tl.load if pin_b else tl.ref)(ptr(tb, ob), (K, N), dt)
                if pin_a:
                    pool.append(a)
                if pin_b:
                    pool.append(b)
                ep = []
                for e in epi:
                    if e[0] == "bias":
                        ep.append({"op": "bias", "scope": e[1],
                                   "bias": tl.ref(ptr(e[2], e[3]), (N,), dt)})
                    elif e[0] == "scale":
                        ep.append({"op": "scale", "factor": 0.5, "scope": e[1]})
                    elif e[0] == "clamp":
                        ep.append({"op": "clamp", "min": -0.5, "max": 0.75, "scope": e[1]})
                    else:
                        ep.append({"op": e[0], "scope": e[1]})
                c = tl.composite(op="gemm", a=a, b=b, out_ptr=base[out], epilogue=ep)
                (tl.wait(c) if wait_now else comps.append(c))
            elif k == "wait":
                tl.wait()
                comps = []
            else:  # pragma: no cover
                raise AssertionError(k)
        pool += [tl.wait(f) for f in later]
        later = []
    if comps:
        tl.wait()


def _workload(spec: KernelSpec, refs: dict[str, np.ndarray] | None):
    def build(w, p):
        ts = {}
        for i, t in enumerate(spec.tensors):
            init = w.random(1000 + i) if t.init else "zeros"
            ts[t.name] = w.tensor(t.name, t.shape, t.dtype, init=init, pe=t.pe)
        names = tuple(ts)
        for li, (grid, _phases) in enumerate(spec.launches):
            n = grid[0] * grid[1]
            w.launch(fuzz_kernel, grid=grid, args=(spec, li, names, *ts.values()),
                     neighbors=ring(n) if n > 1 else None)
        for name in spec.outputs:
            want = None if refs is None else refs[name]
            w.output(ts[name], reference=(lambda v, name=name: v[name]) if want is None
                     else (lambda v, want=want: want))
    return types.SimpleNamespace(build=build, NAME="fuzz", PARAMS={})


# ----------------------------------------------------------------------------- the properties

STATS: dict[str, object] = {"examples": 0, "worst": (1.0, None), "exact": 0}


def _capture(spec: KernelSpec, d: Path):
    t = topo(spec.topo, spec.overrides)
    # placeholder references (the outputs are not known yet): a mismatch is expected
    first = kbtrace.capture(_workload(spec, None), t, out_dir=d / "trace0", allow_mismatch=True)
    golden = first.execute().outputs
    return kbtrace.capture(_workload(spec, golden), t, out_dir=d / "trace")


def _check_timing(run, fid: str) -> None:
    ot = run.op_timing().to_pydict()
    hops = run.hops_table().to_pydict()
    n = len(ot["op_id"])
    assert ot["op_id"] == list(range(n))
    ti, ts, te = (np.asarray(ot[c]) for c in ("t_issue_ns", "t_start_ns", "t_end_ns"))
    bad = np.flatnonzero((ti > ts + EXACT_NS) | (ts > te + EXACT_NS))
    assert not bad.size, (fid, "t_issue <= t_start <= t_end violated",
                          [{c: ot[c][i] for c in ot} for i in bad[:3]])
    hop_op = np.asarray(hops["op_id"], dtype=np.int64)
    enter, leave = np.asarray(hops["t_enter_ns"]), np.asarray(hops["t_leave_ns"])
    out = np.flatnonzero((enter < ti[hop_op] - EXACT_NS) | (leave > te[hop_op] + EXACT_NS)
                         | (leave < enter - EXACT_NS))
    assert not out.size, (fid, "hop row outside [t_issue, t_end] of its op",
                          [({c: hops[c][i] for c in hops}, ti[hop_op[i]], te[hop_op[i]])
                           for i in out[:3]])
    q = np.asarray(ot["queue_ns"])
    bad = np.flatnonzero((q < -EXACT_NS) | (q > te - ti + EXACT_NS))
    assert not bad.size, (fid, "op queue_ns outside [0, t_end - t_issue]",
                          [{c: ot[c][i] for c in ot} for i in bad[:3]])
    # hop = path order within the op: 0..k-1, each once
    order = np.lexsort((np.asarray(hops["hop"]), hop_op))
    ho, hh = hop_op[order], np.asarray(hops["hop"])[order]
    first = np.r_[True, ho[1:] != ho[:-1]]
    want = np.arange(len(ho)) - np.maximum.accumulate(np.where(first, np.arange(len(ho)), 0))
    assert np.array_equal(hh, want), (fid, "hop indices of an op are not 0..k-1")
    crit = np.bincount(hop_op, weights=np.asarray(hops["crit_ns"]), minlength=n)
    off = np.flatnonzero(np.abs(crit - (te - ti)) > 1e-6 * np.maximum(1.0, te))
    assert not off.size, (fid, "crit_ns does not sum to t_end - t_issue",
                          [(int(i), crit[i], te[i] - ti[i]) for i in off[:3]])


def _same_bytes(a: Path, b: Path) -> None:
    for f in ("op_timing.parquet", "hops.parquet"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f"{f} differs between {a} and {b}"


def check_kernel(spec: KernelSpec, d: Path) -> None:
    _check_kernel(spec, d)
    shutil.rmtree(d, ignore_errors=True)      # kept only when the example failed


def _check_kernel(spec: KernelSpec, d: Path) -> None:
    tr = _capture(spec, d)
    t = topo(spec.topo, spec.overrides)
    runs = {}
    for fid in ("fast", "flit"):
        r = kbtrace.replay(tr, t, ReplayOptions(fidelity=fid, out_dir=str(d / fid)))
        v = kbtrace.verify(r.run_dir)
        assert v.ok, v.text()
        _check_timing(r, fid)
        again = kbtrace.replay(tr, t, ReplayOptions(fidelity=fid, out_dir=str(d / f"{fid}2")))
        _same_bytes(r.run_dir, again.run_dir)
        # README (Python API): batching does not change results (nor the run id)
        small = kbtrace.replay(tr, t, ReplayOptions(fidelity=fid, out_dir=str(d / f"{fid}3"),
                                                    batch_rows=spec.batch_rows))
        assert small.run_id == r.run_id and small.makespan_ns == r.makespan_ns
        assert small.op_timing().equals(r.op_timing()), f"{fid}: op_timing depends on batch_rows"
        assert small.hops_table().equals(r.hops_table()), f"{fid}: hops depend on batch_rows"
        runs[fid] = r
    fast, flit = runs["fast"], runs["flit"]
    ratio = fast.makespan_ns / flit.makespan_ns if flit.makespan_ns else \
        (1.0 if not fast.makespan_ns else math.inf)
    off = abs(math.log(ratio)) if 0 < ratio < math.inf else math.inf
    if off < math.inf and currently_in_test_context():
        target(off, label="|log(fast/flit makespan)|")
    STATS["examples"] = int(STATS["examples"]) + 1
    if off > abs(math.log(STATS["worst"][0])):
        STATS["worst"] = (ratio, spec)
    ops = tr.ops().to_pydict()
    partial = any(k == "load" and nb > FLIT and nb % FLIT
                  for k, nb in zip(ops["kind"], ops["nbytes"], strict=True))
    if spec.sync_only and not ("partial_burst" in AVOID and partial):
        STATS["exact"] = int(STATS["exact"]) + 1
        _check_exact(t, ops, fast.op_timing().to_pydict(), flit.op_timing().to_pydict())
    assert abs(ratio - 1.0) <= MAKESPAN_TOL, (
        f"fast/flit makespan ratio {ratio:.4f}: fast {fast.makespan_ns} ns, flit "
        f"{flit.makespan_ns} ns")


def _check_exact(t, ops: dict, a: dict, b: dict) -> None:
    """fast == flit on a kernel whose every transfer is alone on its path (one PE, synchronous
    ops only), as README (Replay > Fidelity modes) claims, with its stated exception: an HBM
    write of three or more flits whose last flit is partial may differ by "under one flit
    time". Ops do not overlap, so each op's latency (t_end - t_issue) must agree exactly
    except for such a store, which may differ by up to one flit time at its route's
    bottleneck; without one every t_end must agree too."""
    tol = np.full(len(a["op_id"]), EXACT_NS)
    for i, (kind, nb) in enumerate(zip(ops["kind"], ops["nbytes"], strict=True)):
        if kind == "store" and nb > 2 * FLIT and nb % FLIT:
            dma = t.pe_node(PeCoord(ops["sip"][i], ops["cube"][i], ops["pe"][i]), "dma")
            mem = t.resolve(int(ops["dst_addr"][i]))
            if mem.kind == "hbm_ctrl":
                tol[i] = FLIT / t.route(dma.idx, mem.idx).bottleneck_gbps
    lat_a = np.asarray(a["t_end_ns"]) - np.asarray(a["t_issue_ns"])
    lat_b = np.asarray(b["t_end_ns"]) - np.asarray(b["t_issue_ns"])
    diff = np.abs(lat_a - lat_b)
    for i in np.flatnonzero(diff > tol)[:1]:
        raise AssertionError(
            f"single-PE sync-only kernel: fast and flit differ on op {i} ({a['kind'][i]}, "
            f"{a['nbytes'][i]} B): latency fast {float(lat_a[i])!r} vs flit {float(lat_b[i])!r} ns "
            f"(allowed {tol[i]:g} ns)")
    if (tol == EXACT_NS).all():
        diff = np.abs(np.asarray(a["t_end_ns"]) - np.asarray(b["t_end_ns"]))
        for i in np.flatnonzero(diff > EXACT_NS)[:1]:
            raise AssertionError(f"single-PE sync-only kernel: t_end of op {i} ({a['kind'][i]}) "
                                 f"fast {a['t_end_ns'][i]!r} vs flit {b['t_end_ns'][i]!r}")


_SETTINGS = settings(deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.filter_too_much])
#: CI: fixed examples, no shrinking (a failure is reported as drawn, within the time budget;
#: the slow variant shrinks)
_FAST = settings(_SETTINGS, max_examples=60, derandomize=True,
                 phases=(Phase.explicit, Phase.generate))


@_FAST
@given(spec=kernels())
def test_replay_fuzz(spec, tmp_path_factory):
    check_kernel(spec, tmp_path_factory.mktemp("fuzz"))


@pytest.mark.slow
def test_replay_fuzz_slow(tmp_path_factory):
    n = int(os.environ.get("KBTRACE_FUZZ_EXAMPLES", "300"))
    STATS.update(examples=0, worst=(1.0, None), exact=0)

    @settings(_SETTINGS, max_examples=n)
    @given(spec=kernels())
    def run(spec):
        check_kernel(spec, tmp_path_factory.mktemp("fuzz"))

    try:
        seed(int(os.environ.get("KBTRACE_FUZZ_SEED", "0")))(run)()
    finally:
        ratio, spec = STATS["worst"]
        print(f"\nreplay fuzz: {STATS['examples']} kernels replayed ({STATS['exact']} single-PE "
              f"sync-only checked exactly); worst fast/flit makespan ratio {ratio:.4f}"
              + (f" on\n{spec.describe()}" if spec is not None else ""))

"""Diff two runs (or baselines) op by op and gate CI on regressions.

Ops are aligned on (launch, program, seq, kind, name). The result lists added and
removed ops, the ops whose duration changed most, makespan, stage and utilisation
deltas. ``--fail-on`` rules set the verdict:

    RULE   := METRIC OP VALUE ['%']          OP in > < >= <=
    METRIC := makespan | stage.<stage> | util.<node|link>.<kind> | ops.added | ops.removed
              | op.max   (the op with the largest relative duration change, either way)

``VALUE%`` compares the relative change in percent ((new - base) / base * 100); a bare
VALUE compares the absolute change (ns, utilisation fraction or op count). A rule on
a metric absent from both runs is an error (typo protection).

``op.max`` is ONE matched op: the one whose duration changed most relative to its base
duration, slower or faster (ops of zero base duration have no relative change and are
skipped; ties: larger absolute change, then the op key). Its base / new / delta / % are that
op's, in the table, the JSON and the verdict alike; its rules compare the magnitude of that
op's change (``op.max>10%``: some op got more than 10% slower or faster; ``op.max>50``: that
op's duration changed by more than 50 ns).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from kbtrace import schema
from kbtrace.analysis.summary import OP_KEY, Summary, load_summary
from kbtrace.errors import AnalysisError

__all__ = ["diff", "DiffResult", "Rule", "parse_rule"]

_RULE = re.compile(r"^\s*([a-z_][a-z0-9_.]*)\s*(>=|<=|>|<)\s*(-?[0-9.]+(?:e-?[0-9]+)?)\s*(%?)\s*$")
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Rule:
    metric: str
    op: str
    value: float
    percent: bool
    text: str


def parse_rule(text: str) -> Rule:
    m = _RULE.match(text)
    if not m:
        raise AnalysisError(f"--fail-on {text!r}: expected METRIC>VALUE[%], e.g. makespan>2% "
                            "or stage.dma_read>5%")
    return Rule(m.group(1), m.group(2), float(m.group(3)), m.group(4) == "%", text.strip())


@dataclass(frozen=True, slots=True)
class Delta:
    metric: str
    base: float
    new: float

    @property
    def abs(self) -> float:
        return self.new - self.base

    @property
    def pct(self) -> float:
        if abs(self.base) < _EPS:
            return 0.0 if abs(self.new) < _EPS else math.inf
        return (self.new - self.base) / abs(self.base) * 100.0


@dataclass
class DiffResult:
    base: str
    new: str
    metrics: dict[str, Delta]
    added: pl.DataFrame
    removed: pl.DataFrame
    changed: pl.DataFrame          # per-op duration deltas, largest |delta| first
    n_matched: int
    violations: list[str] = field(default_factory=list)
    op_max: dict[str, Any] | None = None   # OP_KEY of the op behind metrics["op.max"]

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    @property
    def unchanged(self) -> bool:
        return (self.added.height == 0 and self.removed.height == 0
                and all(abs(d.abs) < _EPS for d in self.metrics.values())
                and (self.changed.height == 0 or _max_abs(self.changed["delta_ns"]) < _EPS))

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | str:
            return x if math.isfinite(x) else str(x)
        metrics: dict[str, dict[str, Any]] = {
            k: {"base": d.base, "new": d.new, "delta": d.abs, "pct": num(d.pct)}
            for k, d in self.metrics.items()}
        if "op.max" in metrics and self.op_max is not None:
            metrics["op.max"]["op"] = self.op_max
        return {
            "base": self.base, "new": self.new, "unchanged": self.unchanged, "failed": self.failed,
            "violations": self.violations, "n_matched": self.n_matched,
            "metrics": metrics,
            "added": self.added.to_dicts(), "removed": self.removed.to_dicts(),
            "top_changed": self.changed.head(20).to_dicts(),
        }

    def metrics_frame(self) -> pl.DataFrame:
        """One row per metric that changed (and makespan): metric, base, new, delta, pct."""
        rows = [(k, d) for k, d in self.metrics.items() if k == "makespan" or abs(d.abs) > _EPS]
        return pl.DataFrame({"metric": [k for k, _ in rows], "base": [d.base for _, d in rows],
                             "new": [d.new for _, d in rows], "delta": [d.abs for _, d in rows],
                             "pct": [d.pct for _, d in rows]},
                            schema={"metric": pl.String, "base": pl.Float64, "new": pl.Float64,
                                    "delta": pl.Float64, "pct": pl.Float64})

    def render(self, fmt: str = "text") -> str:
        """``text`` or ``md`` (verdict, metrics, largest changes), ``json`` (everything),
        ``csv`` (the metrics table)."""
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if fmt == "csv":
            from kbtrace.analysis.formats import render
            return render(self.metrics_frame(), "csv")
        md = fmt == "md"
        lines = [f"{'## ' if md else ''}kbtrace diff: {self.base} -> {self.new}", ""]
        verdict = ("REGRESSION: " + "; ".join(self.violations) if self.failed
                   else "no change" if self.unchanged else "changed, within thresholds")
        lines += [f"verdict: {verdict}",
                  f"ops: {self.n_matched} matched, {self.added.height} added, "
                  f"{self.removed.height} removed", ""]
        rows = [(k, d) for k, d in self.metrics.items() if k == "makespan" or abs(d.abs) > _EPS]
        if md:
            lines += ["| metric | base | new | delta | % |", "|---|---|---|---|---|"]
            lines += [f"| {k} | {d.base:.6g} | {d.new:.6g} | {d.abs:+.6g} | {d.pct:+.2f}% |" for k, d in rows]
        else:
            lines.append(f"{'metric':<28} {'base':>14} {'new':>14} {'delta':>14} {'%':>9}")
            lines += [f"{k:<28} {d.base:>14.6g} {d.new:>14.6g} {d.abs:>+14.6g} {d.pct:>+8.2f}%"
                      for k, d in rows]
        if self.op_max is not None and any(k == "op.max" for k, _ in rows):
            lines += ["", f"op.max is {_op_label(self.op_max)} (largest relative per-op change)"]
        if self.changed.height and _max_abs(self.changed["delta_ns"]) > _EPS:
            lines += ["", "largest per-op duration changes (ns):"]
            for r in self.changed.head(10).iter_rows(named=True):
                lines.append(f"  launch {r['launch']} program {r['program']} seq {r['seq']} "
                             f"{r['kind']}/{r['name']}: {r['dur_base_ns']:.6g} -> "
                             f"{r['dur_new_ns']:.6g} ({r['delta_ns']:+.6g})")
        for title, df in (("added", self.added), ("removed", self.removed)):
            if df.height:
                lines += ["", f"{title} ops (first 10 of {df.height}):"]
                lines += [f"  {r}" for r in df.head(10).iter_rows()]
        return "\n".join(lines) + "\n"


def _max_abs(s: pl.Series) -> float:
    v: Any = s.abs().max()
    return float(v)


def _metrics(b: Summary, n: Summary) -> dict[str, Delta]:
    out = {"makespan": Delta("makespan", b.makespan_ns, n.makespan_ns)}
    for s in sorted(set(b.stages) | set(n.stages)):
        out[f"stage.{s}"] = Delta(f"stage.{s}", b.stages.get(s, 0.0), n.stages.get(s, 0.0))
    for k in sorted(set(b.util) | set(n.util)):
        out[f"util.{k}"] = Delta(f"util.{k}", b.util.get(k, 0.0), n.util.get(k, 0.0))
    return out


def diff(base: Any, new: Any, fail_on: list[str] | tuple[str, ...] = ()) -> DiffResult:
    """Compare two runs/baselines (paths or Summary objects); apply ``fail_on`` rules."""
    rules = [parse_rule(r) for r in fail_on]
    b = base if isinstance(base, Summary) else load_summary(base)
    n = new if isinstance(new, Summary) else load_summary(new)
    key = list(OP_KEY)
    bo = b.ops.select(*key, (pl.col("t_end_ns") - pl.col("t_start_ns")).alias("dur_base_ns"))
    no = n.ops.select(*key, (pl.col("t_end_ns") - pl.col("t_start_ns")).alias("dur_new_ns"))
    bo = bo.with_columns(pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String))
    no = no.with_columns(pl.col("kind").cast(pl.String), pl.col("name").cast(pl.String))
    matched = bo.join(no, on=key, how="inner")
    changed = matched.with_columns((pl.col("dur_new_ns") - pl.col("dur_base_ns")).alias("delta_ns"))
    changed = changed.sort([pl.col("delta_ns").abs(), *key], descending=[True] + [False] * len(key))
    added = no.join(bo, on=key, how="anti").select(key).sort(key)
    removed = bo.join(no, on=key, how="anti").select(key).sort(key)
    metrics = _metrics(b, n)
    metrics["ops.added"] = Delta("ops.added", 0.0, float(added.height))
    metrics["ops.removed"] = Delta("ops.removed", 0.0, float(removed.height))
    op_max = _op_max(changed)
    if op_max is not None:
        metrics["op.max"] = Delta("op.max", op_max["dur_base_ns"], op_max["dur_new_ns"])
    res = DiffResult(str(getattr(b, "source", base)), str(getattr(n, "source", new)), metrics,
                     added, removed, changed, matched.height,
                     op_max=None if op_max is None else {k: op_max[k] for k in key})
    for r in rules:
        d = metrics.get(r.metric)
        if d is None:
            if r.metric == "op.max":       # no matched op with a duration: nothing changed
                d = Delta(r.metric, 0.0, 0.0)
            elif r.metric.startswith(("stage.", "util.")):
                d = Delta(r.metric, 0.0, 0.0)
                known = [k for k in metrics if k.startswith(r.metric.split(".")[0] + ".")]
                if r.metric.startswith("stage.") and r.metric[6:] not in _STAGES:
                    raise AnalysisError(f"--fail-on {r.text!r}: unknown metric; known: "
                                        f"{', '.join(known)}")
                if r.metric.startswith("util.") and r.metric not in _UTIL_METRICS:
                    raise AnalysisError(f"--fail-on {r.text!r}: unknown metric {r.metric!r}; use "
                                        "util.node.<node kind> or util.link.<link kind>, e.g. "
                                        "util.node.hbm_ctrl or util.link.router_mesh")
            else:
                raise AnalysisError(f"--fail-on {r.text!r}: unknown metric {r.metric!r}; use "
                                    "makespan, stage.<stage>, util.<node|link>.<kind>, ops.added, "
                                    "ops.removed or op.max")
        if r.metric == "op.max":      # the magnitude: a large speed-up counts too
            val = abs(d.pct) if r.percent else abs(d.abs)
        elif r.metric in ("ops.added", "ops.removed") and r.percent:
            val = d.new / max(1, b.ops.height) * 100.0
        else:
            val = d.pct if r.percent else d.abs
        hit = {">": val > r.value, "<": val < r.value, ">=": val >= r.value,
               "<=": val <= r.value}[r.op]
        if hit:
            unit = "%" if r.percent else ""
            shown = (d.pct if r.percent else d.abs) if r.metric == "op.max" else val
            what = f", {_op_label(res.op_max)}" if r.metric == "op.max" and res.op_max else ""
            res.violations.append(f"{r.metric} changed by {shown:+.4g}{unit} ({d.base:.6g} -> "
                                  f"{d.new:.6g}{what}), rule {r.text}")
    return res


def _op_max(changed: pl.DataFrame) -> dict[str, Any] | None:
    """The matched op with the largest |relative duration change| (base duration > 0);
    ties: larger |delta_ns|, then the op key. None when no op has a base duration."""
    key = list(OP_KEY)
    cand = changed.filter(pl.col("dur_base_ns") > 0)
    if cand.height == 0:
        return None
    cand = cand.with_columns((pl.col("delta_ns") / pl.col("dur_base_ns")).abs().alias("_rel"))
    cand = cand.sort([pl.col("_rel"), pl.col("delta_ns").abs(), *key],
                     descending=[True, True] + [False] * len(key))
    return cand.row(0, named=True)


def _op_label(op: dict[str, Any]) -> str:
    return (f"launch {op['launch']} program {op['program']} seq {op['seq']} "
            f"{op['kind']}/{op['name']}")


_STAGES = (*schema.BREAKDOWN_STAGES, "idle")
_UTIL_METRICS = frozenset([f"util.node.{k}" for k in schema.NODE_KINDS]
                          + [f"util.link.{k}" for k in schema.LINK_KINDS])

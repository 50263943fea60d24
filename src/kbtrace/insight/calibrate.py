"""Calibration: fit topology parameters to measured figures by least squares over replays.

A target file is a CSV with columns ``scenario,nbytes,measured_ns[,source]`` (one row per
figure; scenarios in ``scenarios``). ``calibrate`` replays every scenario on the topology
with the parameters ``fit`` scaled by free multipliers and lets
``scipy.optimize.least_squares`` (trust-region reflective, bounded, finite differences)
minimise the relative residuals ``predicted / measured - 1``. It reports every figure's
error before and after and writes the fitted topology: the base YAML with the fitted
values overlaid (``calibrated.yaml``), plus ``calibration.json`` and ``calibration.csv``.
A target set the model cannot meet is reported with its residuals (``Calibration.ok`` is
False when a figure stays more than ``tolerance`` off); nothing is hidden.

The shipped default target set (``targets/reference.csv``) holds the predecessor's PE DMA
figures: single-flow reads (local, farthest cube, other SIP) and hot-target reads (1, 2, 3
and all PEs reading PE0's slice) of 16 KiB (the size is inferred; see the CSV's sources).
"""

from __future__ import annotations

import csv
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kbtrace._io import atomic_dir, write_json
from kbtrace.errors import UsageError
from kbtrace.insight.resources import get_param
from kbtrace.insight.scenarios import check_scenario, predict

__all__ = ["calibrate", "Calibration", "load_targets", "REFERENCE_TARGETS", "DEFAULT_FIT",
           "figure_errors"]

REFERENCE_TARGETS = Path(__file__).with_name("targets") / "reference.csv"
#: Identifiable from the reference figures: set-up and per-router overheads (flat in size),
#: the HBM slice's bandwidth (the hot-target slope) and the UCIe endpoints (cross-cube).
#: ``A+B`` scales two keys by one factor: the 8 pseudo-channels x 32 GB/s equal the
#: controller's 256 GB/s router link, so either alone above the other only moves the first
#: burst, which a DMA set-up change mimics exactly (not identifiable); together they are.
DEFAULT_FIT = ("pe.dma.overhead_ns", "cube.mesh.router_overhead_ns",
               "cube.hbm.pc_bw_gbps+cube.hbm.router_bw_gbps", "sip.ucie.overhead_ns")
MARKER = "calibration.json"


@dataclass(frozen=True)
class Target:
    scenario: str
    nbytes: int
    measured_ns: float
    source: str = ""


@dataclass
class Calibration:
    """A finished fit: the parameters before and after and every figure's error."""
    targets: list[Target]
    fit: dict[str, tuple[float, float]]           # key -> (start value, fitted value)
    before_ns: list[float]
    after_ns: list[float]
    tolerance: float
    evaluations: int = 0
    wall_s: float = 0.0
    out_dir: Path | None = None
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def errors(self, which: str = "after") -> list[float]:
        pred = self.after_ns if which == "after" else self.before_ns
        return [p / t.measured_ns - 1.0 for p, t in zip(pred, self.targets, strict=True)]

    @property
    def ok(self) -> bool:
        return all(abs(e) <= self.tolerance for e in self.errors())

    def rms(self, which: str = "after") -> float:
        e = self.errors(which)
        return math.sqrt(sum(x * x for x in e) / len(e)) if e else 0.0

    def frame(self) -> Any:
        """One row per target figure: measured, before and after the fit, their errors in %
        (``--format csv|md|json``; the fitted parameters are in calibrated.yaml)."""
        import polars as pl
        return pl.DataFrame(
            [{"scenario": t.scenario, "nbytes": t.nbytes, "measured_ns": t.measured_ns,
              "before_ns": b, "before_error_pct": 100 * eb, "after_ns": a,
              "after_error_pct": 100 * ea, "within_tolerance": abs(ea) <= self.tolerance}
             for t, b, a, eb, ea in zip(self.targets, self.before_ns, self.after_ns,
                                        self.errors("before"), self.errors(), strict=True)],
            schema={"scenario": pl.String, "nbytes": pl.Int64, "measured_ns": pl.Float64,
                    "before_ns": pl.Float64, "before_error_pct": pl.Float64,
                    "after_ns": pl.Float64, "after_error_pct": pl.Float64,
                    "within_tolerance": pl.Boolean})

    def text(self) -> str:
        lines = ["| scenario | nbytes | measured ns | before ns | error | after ns | error |",
                 "|---|---|---|---|---|---|---|"]
        for t, b, a, eb, ea in zip(self.targets, self.before_ns, self.after_ns,
                                   self.errors("before"), self.errors(), strict=True):
            lines.append(f"| {t.scenario} | {t.nbytes} | {t.measured_ns:,.1f} | {b:,.1f} | "
                         f"{100 * eb:+.1f}% | {a:,.1f} | {100 * ea:+.1f}% |")
        lines.append(f"rms error {100 * self.rms('before'):.2f}% -> {100 * self.rms():.2f}% "
                     f"({self.evaluations} evaluations, {self.wall_s:.1f} s)")
        for k, (v0, v1) in self.fit.items():
            lines.append(f"  {k}: {v0:g} -> {v1:.4g} ({100 * (v1 / v0 - 1):+.1f}%)"
                         if v0 else f"  {k}: {v0:g} -> {v1:.4g}")
        bad = [t.scenario for t, e in zip(self.targets, self.errors(), strict=True)
               if abs(e) > self.tolerance]
        if bad:
            lines.append(f"the model cannot meet {len(bad)} figure(s) within "
                         f"{100 * self.tolerance:.0f}%: {', '.join(bad)} (residuals above)")
        return "\n".join(lines)


def load_targets(path: str | os.PathLike[str]) -> list[Target]:
    """Read a target CSV (``scenario,nbytes,measured_ns[,source]``); one line per error."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UsageError(f"{p}: no such target file; give a CSV with columns "
                         "scenario,nbytes,measured_ns[,source]") from None
    rows = list(csv.DictReader(line for line in text.splitlines()
                               if line.strip() and not line.lstrip().startswith("#")))
    if not rows or not {"scenario", "nbytes", "measured_ns"} <= set(rows[0]):
        raise UsageError(f"{p}: expected a header scenario,nbytes,measured_ns[,source] and at "
                         "least one row")
    out = []
    for i, r in enumerate(rows, 2):
        try:
            nb, ns = int(r["nbytes"]), float(r["measured_ns"])
        except (TypeError, ValueError):
            raise UsageError(f"{p}: row {i}: nbytes must be an integer and measured_ns a "
                             f"number (got {r.get('nbytes')!r}, {r.get('measured_ns')!r})") \
                from None
        if not (ns > 0 and math.isfinite(ns)):
            raise UsageError(f"{p}: row {i}: measured_ns {ns} must be > 0")
        out.append(Target(r["scenario"].strip(), nb, ns, (r.get("source") or "").strip()))
    return out


def figure_errors(topology: str | os.PathLike[str], targets: list[Target],
                  overrides: dict[str, Any] | None = None) -> list[float]:
    """Predicted ns of every target on a topology (no fit): the CI's calibration check."""
    from kbtrace.topology import compile_topology
    topo = compile_topology(topology, overrides=overrides)
    return predict(topo, [(t.scenario, t.nbytes) for t in targets])


def calibrate(targets: str | os.PathLike[str] | list[Target] | None = None, *,
              topology: str | os.PathLike[str] = "topologies/default.yaml",
              fit: list[str] | tuple[str, ...] | None = None,
              start: dict[str, Any] | None = None, tolerance: float = 0.10,
              max_evaluations: int = 60, out: str | os.PathLike[str] | None = None
              ) -> Calibration:
    """Fit ``fit`` (topology keys, ``A+B`` = two keys scaled by one factor; default
    ``DEFAULT_FIT``) so the scenarios' replays match
    ``targets`` (CSV path or list; default the shipped reference set). ``start``: overrides
    the fit starts from (e.g. perturbed values). ``out``: directory for calibrated.yaml,
    calibration.json and calibration.csv (nothing written when None)."""
    import numpy as np
    from scipy.optimize import least_squares

    from kbtrace.topology import compile_topology
    from kbtrace.topology._spec import apply_overrides

    t0 = time.perf_counter()
    tg = targets if isinstance(targets, list) else load_targets(targets or REFERENCE_TARGETS)
    groups = [[k.strip() for k in g.split("+") if k.strip()] for g in (fit or DEFAULT_FIT)]
    groups = [g for g in groups if g]
    if not groups:
        raise UsageError("calibrate --fit: give at least one parameter key")
    keys = [k for g in groups for k in g]
    if len(set(keys)) != len(keys):
        raise UsageError("calibrate --fit: a key is given twice; list each once")
    base_over = dict(start or {})
    topo0 = compile_topology(topology, overrides=base_over)
    for t in tg:
        check_scenario(t.scenario, topo0, f"calibrate: target {t.scenario}")
    x0 = []
    for k in keys:
        try:
            v = get_param(topo0.params, k)
        except AttributeError:
            raise UsageError(f"calibrate --fit {k}: not a topology parameter; use a YAML path "
                             "such as cube.hbm.pc_bw_gbps") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise UsageError(f"calibrate --fit {k}: its value {v!r} is not a positive number; "
                             "fit rates, clocks or overheads that are > 0")
        if isinstance(v, int):
            raise UsageError(f"calibrate --fit {k}: an integer parameter cannot be fitted "
                             "continuously; fit rates, clocks or overheads")
        x0.append(float(v))
    cases = [(t.scenario, t.nbytes) for t in tg]
    meas = np.array([t.measured_ns for t in tg])
    cache: dict[tuple[float, ...], list[float]] = {}

    group_of = [gi for gi, g in enumerate(groups) for _ in g]    # key -> its group

    def scale(m: np.ndarray) -> list[float]:
        return [float(m[gi]) for gi in group_of]

    def model(m: np.ndarray) -> list[float]:
        key = tuple(round(float(v), 12) for v in m)
        if key not in cache:
            ov = {**base_over, **{k: x * s for k, x, s in zip(keys, x0, scale(m), strict=True)}}
            cache[key] = predict(compile_topology(topology, overrides=ov), cases)
        return cache[key]

    before = model(np.ones(len(groups)))
    res = least_squares(lambda m: np.array(model(m)) / meas - 1.0, np.ones(len(groups)),
                        bounds=(0.05, 20.0), diff_step=1e-3, x_scale=1.0, method="trf",
                        max_nfev=max_evaluations)
    after = model(res.x)
    cal = Calibration(tg, {k: (x, x * s) for k, x, s in zip(keys, x0, scale(res.x),
                                                            strict=True)},
                      before, after, tolerance, evaluations=len(cache),
                      wall_s=time.perf_counter() - t0, message=str(res.message))
    if out is not None:
        raw = yaml.safe_load(Path(topology).read_text()) or {}
        fitted = {k: round(v1, 6) for k, (_v0, v1) in cal.fit.items()}
        raw = apply_overrides(apply_overrides(raw, base_over, str(topology)), fitted,
                              str(topology))
        raw["name"] = f"{raw.get('name', Path(topology).stem)}-calibrated"
        inputs = [topology] + ([targets] if isinstance(targets, (str, os.PathLike)) else [])
        with atomic_dir(out, "calibration", inputs) as stage:
            head = (f"# {topology} with parameters fitted by `kbtrace calibrate` to "
                    f"{len(tg)} figure(s):\n" + "".join(
                        f"#   {k}: {v0:g} -> {v1:.6g}\n" for k, (v0, v1) in cal.fit.items()))
            (stage / "calibrated.yaml").write_text(head + yaml.safe_dump(raw, sort_keys=False))
            with open(stage / "calibration.csv", "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["scenario", "nbytes", "measured_ns", "before_ns", "before_error",
                            "after_ns", "after_error", "source"])
                for t, b, a, eb, ea in zip(tg, before, after, cal.errors("before"),
                                           cal.errors(), strict=True):
                    w.writerow([t.scenario, t.nbytes, t.measured_ns, round(b, 3),
                                round(eb, 5), round(a, 3), round(ea, 5), t.source])
            write_json(stage / MARKER, {
                "topology": str(topology), "start": base_over,
                "fit": {k: {"start": v0, "fitted": v1} for k, (v0, v1) in cal.fit.items()},
                "rms_error_before": cal.rms("before"), "rms_error_after": cal.rms(),
                "tolerance": tolerance, "ok": cal.ok, "optimizer": cal.message})
        cal.out_dir = Path(out)
    return cal

"""The study framework: sweep -> frames -> tables -> figures -> page -> reference vs measured.

A study module (``kbtrace.studies.<name>``) defines ``run(ctx: StudyContext) -> Findings``:
it replays what it needs (``ctx.sweep(config)`` for a hive-partitioned ``replay.sweep``, or
``ctx.replay_rows`` for hand-built one-op traces), computes frames, draws figures with
``ctx.figure(name)`` paths, and lists every figure the reference gives as a ``Ref`` (the
reference value, kbtrace's, the ratio, and a note on any gap > 10 %) plus ``Check``s
(orderings and invariants that must hold).

``run_study`` writes, into ``OUT`` (default ``data/studies/<name>`` or ``<name>-quick``),
built beside it and swapped in whole (``_io.atomic_dir``)::

    sweep/ ...                 the study's sweep (hive Parquet: trace=/topology=/... dirs,
                               points.parquet, sweep.json), when it ran one
    tables/<name>.csv|.md      every table, plus reference.csv|md and checks.csv|md
    <figure>.png               the figures
    index.html, summary.md     one page: the figures, the tables, reference vs measured
    study.json                 study, topology, quick, kbtrace version, refs, checks

Calibration (``data/calibration/<name>[-quick].json``, committed): the measured value of
every ``Ref`` and its tolerance. ``calibration_drift`` compares a run against it; the CI
test runs each study ``--quick`` and fails when a value leaves its tolerance or a check
fails. ``record_calibration`` (``kbtrace study NAME --record``) rewrites the record.
Determinism: nothing written depends on wall time or on the order points finish in.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from kbtrace import __version__
from kbtrace._io import atomic_dir, write_json
from kbtrace._paths import REPO_ROOT, project_dir
from kbtrace.errors import KbtraceError, UsageError

__all__ = ["Ref", "Check", "Findings", "StudyContext", "StudyResult", "run_study", "scalar",
           "print_result", "calibration_drift", "record_calibration", "calibration_path"]


def scalar(v: Any) -> float:
    """A polars aggregate (``Series.max()`` and the like, typed as any Python literal) as a
    float, for comparisons and arithmetic."""
    return float(v)

GAP_NOTE = 0.10         # a |ratio - 1| above this needs a note (docs explain it)


@dataclass(frozen=True)
class Ref:
    """One figure the reference gives: ``reference`` (None: a value the reference only
    describes, e.g. an ordering) against ``measured``; ``tol``: relative drift allowed
    against the committed calibration record."""
    figure: str
    quantity: str
    unit: str
    reference: float | None
    measured: float
    tol: float = 0.02
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.reference in (None, 0):
            return None
        return self.measured / self.reference


@dataclass(frozen=True)
class Check:
    """An ordering or invariant. ``expected=False`` records a measured, documented deviation
    from the reference's rule: the study fails if the rule starts holding too (the docs and
    the record must then be updated), so the check can still fail either way."""
    name: str
    ok: bool
    detail: str
    expected: bool = True

    @property
    def as_expected(self) -> bool:
        return self.ok == self.expected

    @property
    def mark(self) -> str:
        if self.as_expected:
            return "[v] PASS" if self.ok else "[~] KNOWN DEVIATION"
        return "[x] FAIL" if self.expected else "[!] CHANGED (holds now; update the docs)"


@dataclass
class Findings:
    """What a study's ``run`` returns."""
    tables: dict[str, pl.DataFrame]
    figures: list[str]
    refs: list[Ref]
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sections: list[tuple[str, str | None, str | None]] = field(default_factory=list)


@dataclass
class StudyContext:
    name: str
    topology: Path
    quick: bool
    jobs: int
    out: Path                  # the staging directory (renamed to the output on success)

    def figure(self, name: str) -> Path:
        return self.out / f"{name}.png"

    def sweep(self, config: dict[str, Any], name: str = "sweep") -> tuple[pl.DataFrame, Path]:
        """Run a ``replay.sweep`` config into ``OUT/<name>``; (points frame, sweep dir).
        A failed point fails the study (its error names the point)."""
        from kbtrace.replay.sweep import run_sweep
        d = self.out / name
        res = run_sweep(config, d, jobs=self.jobs)
        if res.failed:
            f = res.failed[0]
            raise KbtraceError(f"study {self.name}: sweep point {f['point']} ({f['run_dir']}) "
                               f"failed: {f['error']}")
        pts = pl.from_arrow(res.points)
        assert isinstance(pts, pl.DataFrame)
        return pts, d


@dataclass
class StudyResult:
    name: str
    topology: str
    quick: bool
    out: Path
    findings: Findings
    drift: pl.DataFrame | None
    wall_s: float

    @property
    def ok(self) -> bool:
        bad_check = any(not c.as_expected for c in self.findings.checks)
        bad_drift = self.drift is not None and not self.drift["ok"].all()
        return not bad_check and not bad_drift

    def refs_frame(self) -> pl.DataFrame:
        return refs_frame(self.findings.refs)


def refs_frame(refs: list[Ref]) -> pl.DataFrame:
    return pl.DataFrame(
        {"figure": [r.figure for r in refs], "quantity": [r.quantity for r in refs],
         "unit": [r.unit for r in refs], "reference": [r.reference for r in refs],
         "kbtrace": [r.measured for r in refs], "ratio": [r.ratio for r in refs],
         "note": [r.note for r in refs]},
        schema={"figure": pl.Utf8, "quantity": pl.Utf8, "unit": pl.Utf8,
                "reference": pl.Float64, "kbtrace": pl.Float64, "ratio": pl.Float64,
                "note": pl.Utf8})


def _checks_frame(checks: list[Check]) -> pl.DataFrame:
    return pl.DataFrame({"check": [c.name for c in checks], "holds": [c.ok for c in checks],
                         "expected": [c.expected for c in checks],
                         "verdict": [c.mark for c in checks],
                         "detail": [c.detail for c in checks]},
                        schema={"check": pl.Utf8, "holds": pl.Boolean, "expected": pl.Boolean,
                                "verdict": pl.Utf8, "detail": pl.Utf8})


# --------------------------------------------------------------------------- calibration

def calibration_path(name: str, quick: bool) -> Path:
    return REPO_ROOT / "data" / "calibration" / f"{name}{'-quick' if quick else ''}.json"


def _key(r: Ref) -> str:
    return f"{r.figure} / {r.quantity}"


def calibration_drift(name: str, quick: bool, topology: str,
                      refs: list[Ref]) -> pl.DataFrame | None:
    """Each ``Ref`` against the committed record (None when there is none for this study,
    mode and topology): recorded, measured, drift, tolerance, ok. A figure the record has
    but the run lacks is a failure too."""
    path = calibration_path(name, quick)
    if not path.is_file():
        return None
    rec = json.loads(path.read_text())
    if rec.get("topology") != topology:
        return None
    recorded = rec.get("figures", {})
    rows: list[tuple[str, float | None, float | None, float | None, float, bool, str]] = []
    seen = set()
    for r in refs:
        k = _key(r)
        seen.add(k)
        old = recorded.get(k)
        if old is None:
            rows.append((k, None, r.measured, None, r.tol, False, "not in the record"))
            continue
        tol = float(old.get("tol", r.tol))
        base = float(old["measured"])
        drift = (r.measured - base) / base if base else (0.0 if r.measured == 0 else 1.0)
        rows.append((k, base, r.measured, drift, tol, abs(drift) <= tol, ""))
    for k in sorted(set(recorded) - seen):
        rows.append((k, float(recorded[k]["measured"]), None, None,
                     float(recorded[k].get("tol", 0)), False, "missing from this run"))
    return pl.DataFrame(rows, orient="row", schema={
        "figure": pl.Utf8, "recorded": pl.Float64, "measured": pl.Float64,
        "drift": pl.Float64, "tol": pl.Float64, "ok": pl.Boolean, "why": pl.Utf8})


def record_calibration(res: StudyResult) -> Path:
    """Write this run's figures as the committed calibration record of its study and mode."""
    path = calibration_path(res.name, res.quick)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"study": res.name, "quick": res.quick, "topology": res.topology,
                      "kbtrace_version": __version__,
                      "figures": {_key(r): {"measured": round(r.measured, 6), "tol": r.tol,
                                            "reference": r.reference}
                                  for r in res.findings.refs}})
    return path


# --------------------------------------------------------------------------- run + write

def run_study(name: str, topology: str | Path, *, quick: bool = False, jobs: int = 1,
              out: str | Path | None = None) -> StudyResult:
    """Run study ``name`` (see ``registry.STUDIES``) on ``topology``; write its directory."""
    from kbtrace.analysis.formats import write_frame
    from kbtrace.analysis.reporter import write_page
    from kbtrace.studies.registry import STUDIES, load_study
    from kbtrace.topology import compile_topology
    mod = load_study(name)
    if jobs < 1:
        raise UsageError(f"-j {jobs}: use 1 or more worker processes")
    topo = compile_topology(topology)
    dest = Path(out) if out else project_dir("data") / "studies" / (name + ("-quick" if quick
                                                                             else ""))
    t0 = time.perf_counter()
    with atomic_dir(dest, "study", inputs=[topology]) as stage:
        ctx = StudyContext(name, Path(topology), quick, jobs, stage)
        f = mod.run(ctx)
        tables = dict(f.tables)
        tables["reference"] = refs_frame(f.refs)
        tables["checks"] = _checks_frame(f.checks)
        drift = calibration_drift(name, quick, topo.params.name, f.refs)
        if drift is not None:
            tables["calibration"] = drift
        (stage / "tables").mkdir(exist_ok=True)
        for tname, df in tables.items():
            write_frame(df, "csv", stage / "tables" / f"{tname}.csv")
            write_frame(df, "md", stage / "tables" / f"{tname}.md")
        pngs = {Path(p).stem: stage / f"{p}.png" for p in f.figures}
        sections = list(f.sections) or [(n, None, n) for n in pngs]
        sections += [("Reference vs kbtrace", "reference", None), ("Checks", "checks", None)]
        if drift is not None:
            sections.append(("Against the committed calibration record", "calibration", None))
        spec = STUDIES[name]
        note = [f"{spec.description}. Reference: {spec.reference}. Topology "
                f"{topo.params.name}{', quick mode' if quick else ''}; kbtrace {__version__}.",
                *f.notes]
        write_page(stage, f"kbtrace study {name}", sections, tables, pngs, note=note,
                   max_rows=80)
        write_json(stage / "study.json", {
            "study": name, "topology": topo.params.name, "quick": quick,
            "kbtrace_version": __version__, "figures": sorted(pngs),
            "refs": refs_frame(f.refs).to_dicts(), "checks": _checks_frame(f.checks).to_dicts()})
    return StudyResult(name, topo.params.name, quick, dest, f, drift, time.perf_counter() - t0)


def print_result(res: StudyResult) -> int:
    """The CLI's report: reference vs kbtrace with the ratio, checks, calibration; exit code."""
    from kbtrace.analysis.formats import render
    refs = res.refs_frame().with_columns(pl.col("reference", "kbtrace").round(3),
                                         pl.col("ratio").round(3))
    print(f"study {res.name} on {res.topology}{' (quick)' if res.quick else ''}: "
          f"{res.wall_s:.1f} s")
    print("reference vs kbtrace (ratio = kbtrace / reference; gaps over 10% carry a note)")
    print(render(refs, "table"))
    for c in res.findings.checks:
        print(f"{c.mark} {c.name}: {c.detail}")
    if res.drift is None:
        print("calibration: no committed record for this study, mode and topology")
    else:
        bad = res.drift.filter(~pl.col("ok"))
        print(f"calibration: {res.drift.height - bad.height}/{res.drift.height} figures within "
              f"tolerance of {calibration_path(res.name, res.quick).relative_to(REPO_ROOT)}")
        for r in bad.iter_rows(named=True):
            print(f"[x] DRIFT {r['figure']}: recorded {r['recorded']}, measured {r['measured']}"
                  f" (tolerance {r['tol']:.0%}){' - ' + r['why'] if r['why'] else ''}")
    print(f"written to {res.out} (index.html, tables/, *.png, sweep/)")
    return 0 if res.ok else 1

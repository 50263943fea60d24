"""``kbtrace run``: the main job. capture -> replay -> verify -> report in one call.

Defaults (``capture/gemm.py`` on ``topologies/small.yaml``, fast fidelity) finish in a
few seconds. Relative workload/topology paths resolve against the current directory,
then against the repository root next to the installed package, so the command works
from a fresh clone without arguments.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbtrace._io import release_memory
from kbtrace._names import param_overrides, tag, variant
from kbtrace._paths import DEFAULT_TOPOLOGY, resolve
from kbtrace._progress import log

__all__ = ["run_workload", "RunSummary", "DEFAULT_WORKLOAD", "DEFAULT_TOPOLOGY",
           "capture_and_replay", "ATTRIBUTE_BUDGET_S"]

DEFAULT_WORKLOAD = "capture/gemm.py"
#: ``attribute="auto"`` runs the attribution when its replays are estimated under this
ATTRIBUTE_BUDGET_S = 3.0


@dataclass
class RunSummary:
    """What ``kbtrace run`` did and where everything went."""

    workload: str
    topology: str
    fidelity: str
    trace_dir: Path
    run_dir: Path
    n_ops: int = 0
    makespan_ns: float = 0.0
    hops: int = 0
    events: int = 0
    bottleneck: str = ""
    hotspot: str = ""
    roofline: str = ""
    helps_most: str = ""
    verify: Any = None
    report_dir: Path | None = None
    perfetto: Path | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verify is None or bool(self.verify.ok)

    #: the summary's parts in order; each is printed as soon as its stage ends
    STAGES = ("header", "capture", "replay", "report", "verify", "next")

    def lines(self, stage: str) -> list[str]:
        """The summary lines of ``stage`` (one of ``STAGES``)."""
        s = self.seconds
        if stage == "header":
            return [f"kbtrace run: {self.workload} on {self.topology} ({self.fidelity})"]
        if stage == "capture":
            return [f"  capture   {self.n_ops} ops{'':<14} {s.get('capture', 0):6.2f} s  -> "
                    f"{self.trace_dir}"]
        if stage == "replay":
            out = [f"  replay    makespan {self.makespan_ns / 1000:.3f} us ({self.makespan_ns:.1f} "
                   f"ns), {self.hops} hops, {self.events} events  {s.get('replay', 0):6.2f} s  -> "
                   f"{self.run_dir}", f"  bottleneck {self.bottleneck}"]
            if self.hotspot:
                out.append(f"  hot spot  {self.hotspot}")
            if self.roofline:
                out.append(f"  roofline  {self.roofline}")
            if self.helps_most:
                out.append(f"  helps most {self.helps_most}")
            return out
        if stage == "verify":
            if self.verify is None:
                return ["  verify    skipped (--no-verify)"]
            v = self.verify
            worst = max(v.tensors, key=lambda t: t.max_abs, default=None)
            detail = (f"{len(v.tensors)} outputs, worst {worst.tensor} ({worst.dtype}) max abs "
                      f"err {worst.max_abs:.3g}" if worst else "no outputs")
            out = [f"  verify    {'PASS' if v.ok else 'FAIL'} ({detail})  "
                   f"{s.get('verify', 0):6.2f} s"]
            if not v.ok:
                out += ["    " + ln for ln in v.text().splitlines()[1:]]
            return out
        if stage == "report":
            out = []
            if self.report_dir is not None:
                out.append(f"  report    {self.report_dir / 'index.html'}  "
                           f"{s.get('report', 0):6.2f} s")
            if self.perfetto is not None:
                out.append(f"  timeline  {self.perfetto} (open in https://ui.perfetto.dev)")
            return out
        if stage == "next":
            return [f"  next      kbtrace sql {self.run_dir} top_hotspots"]
        raise ValueError(f"unknown summary stage {stage!r}; one of {', '.join(self.STAGES)}")

    def text(self) -> str:
        return "\n".join(ln for st in self.STAGES for ln in self.lines(st))


def capture_and_replay(workload: Path, topology: Path, params: list[str] | dict[str, Any],
                       fidelity: str, trace_dir: Path, run_dir: Path) -> tuple[Any, Any]:
    """Capture ``workload`` into ``trace_dir`` and replay it into ``run_dir``."""
    from kbtrace.capture import capture
    from kbtrace.replay import ReplayOptions, replay

    trace = capture(workload, topology, params=params, out_dir=trace_dir)
    run = replay(trace_dir, topology, ReplayOptions(fidelity=fidelity, out_dir=str(run_dir)))
    return trace, run


def _headline(r: Any) -> tuple[str, str, str]:
    """The summary's bottleneck, hot-spot and roofline lines (``frames.headline``) of an
    open ``Run``."""
    from kbtrace.analysis.frames import headline

    h = headline(r)
    parts = []
    if h["top_stage"] is not None:
        parts.append(f"{h['top_stage']} = {h['top_stage_share']:.0%} of PE busy time")
    if h["crit_kind"] is not None:
        parts.append(f"critical path {h['crit_share']:.0%} in {h['crit_kind']} ops")
    hot = ""
    if h["hot_spot"] is not None:
        hot = (f"{h['hot_spot']} ({h['hot_spot_kind']}): {h['hot_spot_queue_ns'] / 1000:.2f} us of "
               f"queueing, {h['hot_spot_share']:.0%} of all queueing")
    roof = ""
    if h["gflops"] is not None:
        roof = f"{h['gflops']:,.0f} GFLOP/s on {h['n_gemm_pes']} PE(s)"
        if h["peak_gflops"] is not None:
            ai = (f"{h['intensity']:.2f} FLOP/B (ridge {h['ridge']:.2f})"
                  if h["intensity"] is not None else "no HBM traffic")
            roof += (f" = {h['gflops'] / h['peak_gflops']:.1%} of their {h['peak_gflops']:,.0f} "
                     f"peak; {ai}: {h['bound']}-bound, {h['attainment']:.1%} of the roof")
    return "; ".join(parts), hot, roof


def _helps_most(run_dir: Path, topo_path: Path, overrides: dict[str, Any], replay_s: float,
                auto: bool) -> str:
    """The headline's "helps most" line: the top class of a faster-only attribution,
    estimated by re-timing the recorded run (``method="whatif"``), not by 13 replays."""
    from kbtrace.insight import attribute  # thin hook: insight imports analysis

    est = 3 * replay_s      # preparing the run costs about one replay; the re-timings little
    if auto and est > ATTRIBUTE_BUDGET_S:
        return (f"not estimated (about {est:.0f} s); kbtrace attribute {run_dir} --estimate "
                "(or kbtrace run --attribute)")
    a = attribute(run_dir, reverse=False, topology=topo_path, overrides=overrides,
                  method="whatif")
    rows = a.table.to_pylist()
    if a.top is None:
        return f"no resource class 2x faster changes the makespan ({a.wall_s:.2f} s)"
    nxt = (f"; next {rows[1]['resource']} {rows[1]['faster_gain_pct']:.1f}%"
           if len(rows) > 1 and rows[1]["faster_gain_pct"] > 0 else "")
    how = f"{a.estimates} re-timed" + (f" + {a.replays} replayed" if a.replays else "")
    return (f"{rows[0]['resource']}: 2x faster saves ~{rows[0]['faster_gain_pct']:.1f}% of the "
            f"makespan{nxt}  ({how}, {a.wall_s:.2f} s; kbtrace attribute replays)")


def run_workload(workload: str | os.PathLike[str] | None = None, *,
                 topology: str | os.PathLike[str] | None = None,
                 params: list[str] | dict[str, Any] | None = None,
                 sets: list[str] | None = None, fidelity: str = "fast",
                 out: str | os.PathLike[str] = "data", verify_data: bool = True,
                 make_report: bool = True, attribute: bool | str = "auto",
                 hbm_pcs: bool = False, verify_alongside: bool | None = None,
                 progress: Callable[[Any], Any] | None = None,
                 on_stage: Callable[[str], Any] | None = None,
                 on_lines: Callable[[list[str]], Any] | None = None) -> RunSummary:
    """Capture, replay, verify and report one workload; return a ``RunSummary``.

    ``attribute``: name the resource class that, 2x faster, would shorten the run most
    (``kbtrace.insight.attribute`` with ``method="whatif"``: the run re-timed per class,
    classes it cannot price replayed); ``"auto"``: only when that is estimated (3x this
    replay's wall time) under ``ATTRIBUTE_BUDGET_S``.

    ``progress``: passed to ``replay`` (called with a ``Progress`` while it runs).
    ``on_stage(name)``: called as each stage (capture, replay, verify, report) starts;
    ``on_lines(lines)``: called with the summary's lines as soon as they are known (the
    header first, then each stage's as it ends: ``RunSummary.lines``).

    ``sets``: topology overrides (``["cube.hbm.pc_bw_gbps=16"]``) for both capture and
    replay; the run directory name carries them. ``hbm_pcs``: record what each HBM
    pseudo-channel served (``ReplayOptions.hbm_pcs``; the timeline then has a track per
    pseudo-channel).

    ``verify_alongside``: verify in a second process while the headline and report run
    (``kbtrace.analysis.alongside``: the same result, the run's wall time shorter by the
    shorter of the two); None (default): when the trace has ``ALONGSIDE_MIN_OPS`` ops or
    more and this process may use two cores or more."""
    from kbtrace._progress import verbosity
    from kbtrace.analysis.alongside import ALONGSIDE_MIN_OPS, VerifyAlongside, cores
    from kbtrace.capture import capture
    from kbtrace.capture.workload import load_workload, parse_params
    from kbtrace.replay import ReplayOptions, replay
    from kbtrace.topology import compile_topology
    from kbtrace.topology.cli import parse_sets

    wl = resolve(workload or DEFAULT_WORKLOAD, "workload")
    topo_path = resolve(topology or DEFAULT_TOPOLOGY, "topology")
    topo = compile_topology(topo_path, overrides=parse_sets(sets))
    mod = load_workload(wl)
    name = str(getattr(mod, "NAME", wl.stem))
    varied = param_overrides(getattr(mod, "PARAMS", {}),
                             parse_params(getattr(mod, "PARAMS", {}), params or []))
    out = Path(out)
    # the trace is specific to the topology it was placed on (as a sweep's traces/<wl>-<topo>),
    # and both names carry the non-default parameters and overrides (kbtrace._names): a run
    # of other inputs never replaces this one's trace or run
    topo_name = variant(topo_path.stem, tag(topo.overrides))
    trace_dir = out / "traces" / variant(name, tag(varied), topo_name)
    run_dir = out / "runs" / variant(name, tag(varied), topo_name, fidelity)
    summary = RunSummary(variant(name, tag(varied)), topo_name, fidelity, trace_dir, run_dir)

    def stage(name: str) -> None:
        if on_stage is not None:
            on_stage(name)

    def done(part: str) -> None:
        if part in summary.seconds:
            log.info(f"{part} took {summary.seconds[part]:.2f} s")
        if on_lines is not None:
            on_lines(summary.lines(part))

    done("header")
    stage("capture")
    t = time.perf_counter()
    # a mismatch is verify's to report (first diverging op, exit 1), not capture's
    trace = capture(wl, topo, params=params or [], out_dir=trace_dir, allow_mismatch=True)
    summary.n_ops = trace.n_ops
    summary.seconds["capture"] = time.perf_counter() - t
    del trace
    done("capture")
    release_memory()        # each stage starts from what is live, not from the last one's peak
    stage("replay")
    t = time.perf_counter()
    rr = replay(trace_dir, topo, ReplayOptions(fidelity=fidelity, out_dir=str(run_dir),
                                               hbm_pcs=hbm_pcs), progress=progress)
    summary.makespan_ns, summary.hops, summary.events = rr.makespan_ns, rr.hops, rr.events
    summary.seconds["replay"] = time.perf_counter() - t
    release_memory()        # what replay freed, before the analysis' own peak (issue 22)
    if verify_alongside is None:
        verify_alongside = summary.n_ops >= ALONGSIDE_MIN_OPS and cores() >= 2
    along = None
    if verify_data and verify_alongside:
        try:
            along = VerifyAlongside(run_dir, verbosity())
            log.info(f"verify alongside the headline and report: process {along.pid}")
        except OSError as exc:      # no interpreter to start (embedded): verify inline
            log.info(f"verify alongside: cannot start {exc.filename or 'python'} "
                     f"({exc.strerror or exc}); verifying after the report")
    try:
        _analyse(summary, run_dir, topo_path, sets, rr, attribute, make_report, verify_data,
                 along, stage, done)
    finally:
        if along is not None:
            along.cancel()      # (collected already, unless something failed first)
    done("next")
    return summary


def _analyse(summary: RunSummary, run_dir: Path, topo_path: Path, sets: list[str] | None,
             rr: Any, attribute: bool | str, make_report: bool, verify_data: bool,
             along: Any, stage: Callable[[str], None], done: Callable[[str], None]) -> None:
    """``run_workload`` after the replay: attribution, headline, report, verify (``along``:
    verify already running in its own process, collected here)."""
    from kbtrace.analysis.perfetto import export_perfetto
    from kbtrace.analysis.reporter import report
    from kbtrace.analysis.run import open_run
    from kbtrace.analysis.verifier import verify
    from kbtrace.topology.cli import parse_sets

    if attribute:      # before the report, which then shows the attribution too
        stage("attribute")
        t = time.perf_counter()
        summary.helps_most = _helps_most(run_dir, topo_path, parse_sets(sets), rr.wall_s,
                                         attribute == "auto")
        summary.seconds["attribute"] = time.perf_counter() - t
    # one open run serves the headline and the report: the views both read (stage totals,
    # critical path, utilisation, ...) are materialised once, not once per reader
    t = time.perf_counter()
    with open_run(run_dir) as r:
        if make_report:
            r.materialize()
        summary.bottleneck, summary.hotspot, summary.roofline = _headline(r)
        summary.seconds["headline"] = time.perf_counter() - t
        done("replay")
        if make_report:
            stage("report")
            t = time.perf_counter()
            summary.report_dir = report(r)
            release_memory()    # what the report freed, before the timeline's own peak
            summary.perfetto = summary.report_dir / "timeline.perfetto.json"
            export_perfetto(r, summary.perfetto)
            summary.seconds["report"] = time.perf_counter() - t
    done("report")
    release_memory()
    if along is not None:       # its own time, not the wait for what is left of it
        stage("verify")
        summary.verify, summary.seconds["verify"] = along.result()
    elif verify_data:
        stage("verify")
        t = time.perf_counter()
        summary.verify = verify(run_dir)
        summary.seconds["verify"] = time.perf_counter() - t
        release_memory()
    done("verify")

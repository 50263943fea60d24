"""Progress bars on a terminal and diagnostics through ``logging``: what every command shows
on stderr while it works.

* ``setup_logging(verbosity)``: the ``kbtrace`` logger writes ``kbtrace: warning: ...``
  (notes, warnings; errors are the CLI's one line) to stderr; ``-q`` (verbosity -1) keeps
  errors only, ``-v`` adds info (the command's and each ``run`` stage's wall time, topology cache
  hits and misses), ``-vv`` debug (each analysis view materialised, with its time). Library code
  logs through ``logging.getLogger("kbtrace...")`` and never prints to stderr.
* ``progress(enabled)``: a context manager yielding ``Bars``. On a terminal, rich's
  progress display (bars with counts, elapsed time; removed when done so the summary lines
  stay). ``enabled=True`` on a non-terminal (``--progress`` through a pipe) writes one plain
  line per task at most once a second and at the end (``replay: 20/20 ops (100%), t = ...``),
  for logs; ``False`` shows nothing. ``None`` means: a terminal, and not ``-q``.
* ``threads_paused()``: the displays' refresh threads stopped for a block (sweeps fork their
  worker processes inside it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["log", "setup_logging", "verbosity", "progress", "Bars", "Task", "quiet",
           "replay_task", "NOTE", "threads_paused"]

#: ``extra=`` of a log record shown as ``kbtrace: note: ...`` (a warning-level remark)
NOTE = {"label": "note"}

log = logging.getLogger("kbtrace")
_STATE = {"verbosity": 0}
#: the rich displays showing now (each refreshes from a thread of its own)
_LIVE: list[Any] = []


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        label = getattr(record, "label", None)      # log.warning(..., extra={"label": "note"})
        if label:
            return f"kbtrace: {label}: {record.getMessage()}"
        level = {"WARNING": "warning", "ERROR": "error", "CRITICAL": "error",
                 "INFO": "info", "DEBUG": "debug"}.get(record.levelname, record.levelname)
        return f"kbtrace: {level}: {record.getMessage()}"


def setup_logging(verbosity: int = 0, stream: TextIO | None = None) -> None:
    """Route the ``kbtrace`` logger to ``stream`` (stderr) at the level ``verbosity`` selects
    (-1 errors, 0 warnings, 1 info, 2 debug); replaces an earlier call's handler."""
    _STATE["verbosity"] = verbosity
    for h in list(log.handlers):
        if getattr(h, "_kbtrace", False):
            log.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Format())
    handler._kbtrace = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel({-1: logging.ERROR, 0: logging.WARNING, 1: logging.INFO}.get(
        max(-1, min(verbosity, 2)), logging.DEBUG))
    log.propagate = False


def verbosity() -> int:
    """The level ``setup_logging`` was last given (0 when it was not called)."""
    return _STATE["verbosity"]


def quiet() -> bool:
    """``-q`` was given."""
    return _STATE["verbosity"] < 0


class Task:
    """One progress task: ``update(completed, total=None, info="")``; ``done()`` at the end."""

    def update(self, completed: float, total: float | None = None, info: str = "") -> None:
        pass

    def done(self) -> None:
        pass


class _RichTask(Task):
    def __init__(self, bars: Any, tid: Any) -> None:
        self.bars, self.tid = bars, tid

    def update(self, completed: float, total: float | None = None, info: str = "") -> None:
        kw: dict[str, Any] = {"completed": completed, "info": info}
        if total is not None:
            kw["total"] = total
        self.bars.update(self.tid, **kw)

    def done(self) -> None:
        self.bars.remove_task(self.tid)


class _LineTask(Task):
    """Plain lines for a non-terminal: at most one a second, and the final state."""

    def __init__(self, stream: TextIO, desc: str, total: float | None, unit: str) -> None:
        self.stream, self.desc, self.total, self.unit = stream, desc, total, unit
        self.t0, self.last, self.state = time.perf_counter(), -1.0, (0.0, "")

    def _write(self) -> None:
        done, info = self.state
        tot = self.total
        pct = f" ({100 * done / tot:.0f}%)" if tot else ""
        count = f"{done:,.0f}/{tot:,.0f} {self.unit}{pct}" if tot else f"{done:,.0f} {self.unit}"
        self.stream.write(f"{self.desc}: {count}" + (f", {info}" if info else "") + "\n")
        self.stream.flush()

    def update(self, completed: float, total: float | None = None, info: str = "") -> None:
        if total is not None:
            self.total = total
        self.state = (completed, info)
        now = time.perf_counter() - self.t0
        if now - self.last >= 1.0:
            self.last = now
            self._write()

    def done(self) -> None:
        self._write()


class Bars:
    """Tasks on one display (see the module docstring); ``add`` starts a task."""

    def __init__(self, mode: str, stream: TextIO, rich_progress: Any = None) -> None:
        self.mode, self.stream, self.rich = mode, stream, rich_progress

    def add(self, desc: str, total: float | None = None, unit: str = "") -> Task:
        if self.mode == "rich":
            return _RichTask(self.rich, self.rich.add_task(desc, total=total, info=""))
        if self.mode == "lines" and (total is not None or unit):   # spinners: a terminal only
            return _LineTask(self.stream, desc, total, unit)
        return Task()


def replay_task(bars: Bars, desc: str = "replay") -> Any:
    """A ``replay(progress=...)`` callback showing a replay's ``Progress`` as task ``desc``."""
    task = bars.add(desc, unit="ops")

    def update(p: Any) -> None:
        task.update(p.ops_done, p.ops, f"t = {p.sim_ns:,.1f} ns, {p.events:,} events, "
                                        f"{p.wall_s:.1f} s")
        if p.ops_done == p.ops:
            task.done()
    return update


@contextmanager
def progress(enabled: bool | None = None, stream: TextIO | None = None) -> Iterator[Bars]:
    """``Bars`` for the duration of the block (see the module docstring)."""
    stream = stream or sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    on = (tty and not quiet()) if enabled is None else enabled
    if not on:
        yield Bars("off", stream)
        return
    if not tty:
        yield Bars("lines", stream)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                    console=Console(file=stream), transient=True)
    with bars:
        _LIVE.append(bars)
        try:
            yield Bars("rich", stream, bars)
        finally:
            _LIVE.remove(bars)


@contextmanager
def threads_paused() -> Iterator[None]:
    """The rich displays' refresh threads stopped for the block, then restarted (the display
    is redrawn): what forks worker processes runs with no thread of ours mid-write."""
    paused = list(_LIVE)
    for bars in paused:
        thread = getattr(bars.live, "_refresh_thread", None)
        bars.stop()                     # (asks the thread to end; joined here)
        if thread is not None:
            thread.join()
    try:
        yield
    finally:
        for bars in paused:
            bars.start()

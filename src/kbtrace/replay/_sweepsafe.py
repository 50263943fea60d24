"""What keeps a sweep consistent when traces change under it or processes die.

* **Pinned traces.** ``pin_traces`` reads each trace's identity (``_io.trace_hash``, the
  digest replay records in run.json ``trace.hash``) once, when the sweep starts; every
  point checks the trace before it replays and the run's recorded hash after, so a trace
  re-captured while the sweep runs fails the points it would have mixed in (it never
  yields a silent "speed-up" from another trace).
* **Point directories** are kbtrace ``run`` outputs: a point that replayed gets its
  ``point.json`` inside its run; a failed point's directory is swapped in whole with only
  its ``point.json`` (so an interrupted re-run leaves each point either as it was or new).
* **Workers only when they pay.** ``execute`` starts worker processes (``Pool``, lazily,
  shared with the sweep's captures) only when the pending points' traces hold at least
  ``MIN_PARALLEL_OPS`` ops (a flit op counts ``FLIT_OP_COST``; ``MIN_PARALLEL_OPS_FORK``
  where workers are forked): below that, a worker's start-up costs more than the points.
  Workers are forked where this process runs no other thread (``start_method``: up in
  ~0.03 s with kbtrace imported), else spawned (~0.35 s to import kbtrace). ``-j N`` is this process and N - 1
  workers: this process never waits for a worker to start (a worker gets a job only once
  it is up) and works through the jobs itself meanwhile, largest first. A job may wait on
  others (``Pool.run``'s ``after``: a point on its trace's capture); it is handed out once
  they have ended. Workers start only
  on cores no process is using at the start (``free_cores``: the machine's CPU counters
  over 0.1 s): where every core is busy a second process gains no CPU and would make
  ``-j N`` slower than ``-j 1`` by its start-up.
* **Workers die with the sweep.** Worker processes ask the kernel for SIGKILL when their
  parent dies (Linux ``PR_SET_PDEATHSIG``) and also poll their parent, so killing the sweep
  leaves no workers running.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import json
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import Any

from kbtrace import _hugepages
from kbtrace._io import atomic_dir, read_json_object, trace_hash, write_json
from kbtrace._owned import owner
from kbtrace.errors import SweepError

__all__ = ["pin_traces", "check_pinned", "write_point", "worker_init", "execute", "Pool",
           "MIN_PARALLEL_OPS", "MIN_PARALLEL_OPS_FORK", "FLIT_OP_COST", "start_method"]

_PR_SET_PDEATHSIG = 1
#: below this many ops (all pending points' traces), worker start-up costs more than it
#: saves: points then run in this process whatever ``jobs`` says
MIN_PARALLEL_OPS = 20_000
#: the same where workers are forked (``start_method``: ~0.03 s each, not ~0.35 s)
MIN_PARALLEL_OPS_FORK = 5_000
FLIT_OP_COST = 10               # a flit-mode op costs ~10 fast-mode ops (docs/replay.md)


def _trace_digest(trace_dir: str | os.PathLike[str]) -> str:
    d = Path(trace_dir)
    meta = read_json_object(d / "trace.json", "re-capture the workload")
    return trace_hash(meta, d)


def pin_traces(trace_dirs: Iterable[str]) -> dict[str, str]:
    """trace dir -> its identity now (read once per trace)."""
    return {d: _trace_digest(d) for d in dict.fromkeys(trace_dirs)}


def check_pinned(job: dict[str, Any], run_json: Path | None = None) -> None:
    """Refuse a point whose trace is no longer the one pinned when the sweep started
    (``run_json``: check what the finished replay recorded instead of the trace on disk)."""
    want = job.get("trace_hash")
    if not want:
        return
    got: str | None
    if run_json is None:
        got = _trace_digest(job["trace_dir"])
    else:
        tr = read_json_object(run_json, "re-run the sweep").get("trace")
        got = tr.get("hash") if isinstance(tr, dict) else None
    if got != want:
        raise SweepError(f"{job['trace_dir']}: the trace changed while the sweep ran (digest "
                         f"{want} at start, {got} now); re-run the sweep once the trace is "
                         f"stable")


def write_point(out: Path, doc: dict[str, Any]) -> None:
    """Write a point's ``point.json``: into its run when the replay wrote one, else as a
    point directory holding only ``point.json`` (swapped in whole)."""
    if owner(out) == "run" and (out / "run.json").is_file():
        write_json(out / "point.json", doc)
        return
    with atomic_dir(out, "run") as stage:
        write_json(stage / "point.json", doc)


def _watch_parent(ppid: int) -> None:
    while True:
        if os.getppid() != ppid:
            os._exit(1)
        time.sleep(0.5)


def worker_init(ppid: int, huge_pages: bool = False) -> None:
    """ProcessPool initializer: die with the parent (``ppid``); pymalloc's arenas on huge pages
    if the parent's are (``huge_pages``: the ``kbtrace`` command's, ``kbtrace._hugepages``; a
    forked worker has them already, a spawned one installs them)."""
    if huge_pages:
        from kbtrace._hugepages import install
        install()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != ppid:          # the parent died before the request took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(ppid,), daemon=True,
                     name="kbtrace-parent-watch").start()


#: how long ``free_cores`` watches the machine (its CPU time counters tick every 10 ms)
FREE_CORES_WINDOW_S = 0.1


def _busy_jiffy_s() -> float | None:
    """CPU seconds every process on the machine has used since boot (``/proc/stat``'s first
    line: all but idle and iowait), or None where there is no such file."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def free_cores(window_s: float = FREE_CORES_WINDOW_S) -> int:
    """Cores left for workers beside this process: the cores, less this process, less what
    the others use now (their CPU seconds over ``window_s``, from ``/proc/stat`` less this
    process's, per second of wall time), rounded. On a machine whose cores are all busy, a
    second process of the same session gains no CPU (Linux shares it between sessions,
    ``sched_autogroup``) and only adds its start-up.

    It measures the machine now, not the 1-minute load average it read before: that average
    lags, so for a minute after a busy spell (a sweep just ended, the previous ``-j 1`` run
    of a benchmark) it kept ``-j 2`` serial on an idle machine. Where ``/proc/stat`` is
    missing, the load average (which counts this process) is still what it reads."""
    cores = os.cpu_count() or 1
    b0, c0, t0 = _busy_jiffy_s(), time.process_time(), time.perf_counter()
    if b0 is not None:
        time.sleep(window_s)
        b1, c1, t1 = _busy_jiffy_s(), time.process_time(), time.perf_counter()
        if b1 is not None and t1 > t0:
            others = max(0.0, (b1 - b0) - (c1 - c0)) / (t1 - t0)
            return int(cores - others - 1 + 0.5)
    try:
        load = os.getloadavg()[0]
    except OSError:
        return cores
    return int(cores - load + 0.5)


def _ready() -> int:
    """A worker's first call: import what points and captures need; its return says the
    worker is up (only then does it get real work)."""
    import kbtrace.capture
    import kbtrace.replay.engine  # noqa: F401
    return os.getpid()


def start_method() -> str:
    """``fork`` where the platform has it and this process runs no other Python thread (a
    forked worker is up at once, with kbtrace imported; a fork beside a running thread could
    copy a lock that thread holds), else ``spawn`` (a fresh interpreter: ~0.35 s to import
    kbtrace before its first job)."""
    import multiprocessing
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return "fork"
    return "spawn"


class Pool:
    """This process plus ``n_jobs - 1`` worker processes that die with it, started on first use
    (forked where ``start_method()`` allows, with any progress display's thread paused) and
    shared by the captures and the points (``run``).

    This process works too: it takes the next job whenever it is free, so ``-j 2`` starts one
    worker, not two, and never waits for one to start: a worker gets a job only once it has
    started and imported kbtrace (``_ready``), then one job at a time, the next as it returns
    (largest first, as this process). When this process finds no job left, it waits only
    for the jobs workers are running. ``LOCAL = False`` (tests) leaves every job to workers."""

    LOCAL = True

    def __init__(self, n_jobs: int, spare_cores_only: bool = True) -> None:
        self.n_jobs = n_jobs
        #: start no more workers than ``free_cores()`` when they start (none: all jobs here)
        self.spare_cores_only = spare_cores_only
        self._declined = False
        self._ex: Any = None
        self._ready: list[Any] = []
        self._lock = threading.Lock()
        self._halted = False
        #: how the workers were started (``start_method()``), once they are
        self.start_method: str | None = None

    @property
    def started(self) -> bool:
        return self._ex is not None

    def start(self) -> None:
        """Start the workers (idempotent); they announce themselves through ``_ready``."""
        if self._ex is None and not self._declined:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            n = self.n_jobs - 1 if self.LOCAL else self.n_jobs
            if self.LOCAL and self.spare_cores_only:
                free = free_cores()
                if free < n:            # said, not silent: the user asked for more
                    logging.getLogger("kbtrace.sweep").warning(
                        f"-j {self.n_jobs}: {max(free, 0)} worker process(es) beside this one, "
                        f"not {n}: other processes leave {max(free, 0)} of "
                        f"{os.cpu_count() or 1} cores free", extra={"label": "note"})
                n = min(n, free)
                if n <= 0:              # every core is busy: a worker would only add its
                    self._declined = True   # start-up to this process's share of them
                    return
            from kbtrace._progress import threads_paused
            with threads_paused():      # (the executor forks its workers on the first submit)
                self.start_method = start_method()
                self._ex = ProcessPoolExecutor(
                    max_workers=max(1, n), initializer=worker_init,
                    initargs=(os.getpid(), _hugepages.installed()),
                    mp_context=multiprocessing.get_context(self.start_method))
                self._ready = [self.submit(_ready) for _ in range(max(1, n))]

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.start()
        if self._ex is None:
            raise SweepError("internal: no worker processes (every core was busy); run the "
                             "job in this process")
        return self._ex.submit(fn, *args)

    def run(self, fn: Callable[..., Any], args: list[Any],
            done: Callable[[int, bool, Any], None],
            after: Sequence[Sequence[int]] | None = None,
            rank: Callable[[int], Any] | None = None) -> set[int]:
        """``fn(a)`` for every ``a`` in ``args``, here and in the workers; ``done(i, ok, result
        or exception)`` is called in this thread as each ends (an exception ``fn`` raises
        here is passed on as a worker's is). Returns the indices of the jobs this process ran.

        Job ``i`` starts only once the jobs ``after[i]`` have ended and their ``done`` has
        returned (so ``done`` may prepare it); a job after one that failed is not run
        (``done(i, False, SweepError)``). Of the jobs ready, a free process takes the one
        of least ``rank(i)`` (default ``i``: list order), ranked when it becomes ready.
        ``halt()`` (from ``done``) hands out no further job: ``run`` returns once the
        running ones have ended."""
        self.start()
        n = len(args)
        rank = rank or (lambda i: i)
        waits = {i: set(a) for i, a in enumerate(after or ()) if a}
        users: dict[int, list[int]] = {}
        for i, deps in waits.items():
            for d in deps:
                users.setdefault(d, []).append(i)
        ready = [(rank(i), i) for i in range(n) if i not in waits]
        heapq.heapify(ready)
        idle: list[Any] = []            # worker slots that found nothing ready
        results: queue.SimpleQueue[tuple[int, bool, Any]] = queue.SimpleQueue()
        busy = [0]
        here: set[int] = set()
        lock = self._lock
        self._halted = False

        def finished(f: Any, i: int) -> None:
            if f.cancelled():
                results.put((i, False, SweepError("a sweep job was cancelled")))
                return
            exc = f.exception()
            results.put((i, exc is None, f.result() if exc is None else exc))
            feed(f)

        def feed(f: Any) -> None:
            """A worker slot is free (its probe or its job returned): give it the next job."""
            if f.cancelled() or isinstance(f.exception(), BrokenExecutor):
                results.put((-1, False, None))        # wakes the wait below: no worker here
                return
            with lock:
                if not ready or self._halted:
                    if waits and not self._halted:
                        idle.append(f)              # fed when a job becomes ready
                    return
                i = heapq.heappop(ready)[1]
                busy[0] += 1
            try:
                self.submit(fn, args[i]).add_done_callback(lambda g: finished(g, i))
            except Exception as e:  # (shut down or broken meanwhile)
                results.put((i, False, e))

        def settle(i: int, ok: bool, res: Any) -> None:
            """``done``, then release the jobs waiting on ``i`` (or drop them if it failed)."""
            done(i, ok, res)
            gone = [(i, ok)]
            while gone:
                j, j_ok = gone.pop()
                for u in users.pop(j, ()):
                    with lock:
                        deps = waits.get(u)
                        if deps is None:
                            continue
                        deps.discard(j)
                        if j_ok and not deps:
                            del waits[u]
                            heapq.heappush(ready, (rank(u), u))
                        elif not j_ok:
                            del waits[u]
                    if not j_ok:
                        done(u, False, SweepError(f"sweep job {u} not run: job {j}, which "
                                                  "it needs, failed"))
                        gone.append((u, False))
            with lock:
                slots = [idle.pop() for _ in range(min(len(idle), len(ready)))]
            for f in slots:
                feed(f)

        for r in self._ready:
            r.add_done_callback(feed)
        while True:
            with lock:
                i = heapq.heappop(ready)[1] if ready and self.LOCAL and not self._halted else -1
                if i < 0 and busy[0] == 0 and (self._halted or not ready or self._down()):
                    break
                if i >= 0:
                    busy[0] += 1            # (settled below with the others)
            if i < 0:                       # nothing to do here now: wait for a worker
                item = results.get()
            else:
                here.add(i)
                try:
                    item = (i, True, fn(args[i]))
                except Exception as e:  # reported to the caller, as a worker's exception is
                    item = (i, False, e)
            while True:
                if item[0] >= 0:
                    with lock:
                        busy[0] -= 1
                    settle(*item)
                if results.empty():
                    break
                item = results.get()
        while ready and not self._halted:   # no worker could take these
            i = heapq.heappop(ready)[1]
            here.add(i)
            try:
                settle(i, True, fn(args[i]))
            except Exception as e:
                settle(i, False, e)
        for i in sorted(waits) if not self._halted else ():     # (``after`` had a cycle)
            done(i, False, SweepError(f"sweep job {i} not run: it waits on itself"))
        return here

    def halt(self) -> None:
        """``run`` hands out no further job (called from its ``done``)."""
        with self._lock:
            self._halted = True

    def _down(self) -> bool:
        """Whether no worker can take a job (every probe failed)."""
        return all(r.done() and (r.cancelled() or r.exception() is not None)
                   for r in self._ready)

    def close(self) -> None:
        """Stop the workers without waiting for one still starting (it had no job)."""
        if self._ex is not None:
            procs = list((getattr(self._ex, "_processes", None) or {}).values())
            self._ex.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                with contextlib.suppress(Exception):
                    p.terminate()
                    p.join(5)
            self._ex = None


_TRACE_OPS: dict[tuple[str, int], int] = {}


def work(job: dict[str, Any]) -> int:
    """A point's expected cost in fast-mode ops: its trace's ``n_ops`` (x ``FLIT_OP_COST``
    in flit mode); 0 when trace.json cannot tell (read once per trace.json version)."""
    meta = Path(str(job.get("trace_dir", ""))) / "trace.json"
    try:
        key = (str(meta), meta.stat().st_mtime_ns)
    except OSError:
        return 0                        # (not captured yet)
    n = _TRACE_OPS.get(key)
    if n is None:
        try:
            n = int(json.loads(meta.read_text()).get("n_ops") or 0)
        except (OSError, ValueError, TypeError, AttributeError):
            n = 0
        _TRACE_OPS[key] = n
    return n * (FLIT_OP_COST if job.get("fidelity") == "flit" else 1)


def execute(fn: Callable[[dict[str, Any]], dict[str, Any]], jobs: list[dict[str, Any]],
            pool: Pool | int | None, executor: str,
            done: Callable[[int, dict[str, Any]], None],
            took: Sequence[float] | None = None,
            size: Callable[[dict[str, Any]], float] | None = None) -> tuple[list[int], set[int]]:
    """Run ``fn`` on every job: as Ray tasks, in worker processes, or in this process;
    ``done(index, result)`` as each finishes. ``pool``: a ``Pool`` (its workers are used when
    started already or when the jobs' work is at least ``MIN_PARALLEL_OPS``; largest first:
    by ``took``, each job's CPU seconds in an earlier run, if given, else by ``size(job)``,
    a predicted cost, asked only when the work is that large, else by ``work``), or a
    number of workers to use whatever the work (1: this process). Returns the jobs' indices
    in the order workers would take them (largest first) and those run here."""
    owned = isinstance(pool, int)
    workers: Pool | None = ((Pool(pool, spare_cores_only=False) if pool > 1 else None)
                            if isinstance(pool, int) else pool)
    try:
        return _run_jobs(fn, jobs, workers, owned, executor, done, took, size)
    finally:
        if owned and workers is not None:
            workers.close()


def _run_jobs(fn: Callable[[dict[str, Any]], dict[str, Any]], jobs: list[dict[str, Any]],
              pool: Pool | None, forced: bool, executor: str,
              done: Callable[[int, dict[str, Any]], None],
              took: Sequence[float] | None = None,
              size: Callable[[dict[str, Any]], float] | None = None) -> tuple[list[int], set[int]]:
    if executor == "ray":
        try:
            import ray
        except ImportError:
            raise SweepError("--executor ray: ray is not installed; pip install 'kbtrace[ray]' "
                             "(or use --executor local)") from None
        if not ray.is_initialized():
            ray.init()
        task = ray.remote(fn)
        refs = {task.remote(j): i for i, j in enumerate(jobs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for r in ready:
                done(refs[r], ray.get(r))
        return list(range(len(jobs))), set()
    cost = [work(j) for j in jobs]
    least = MIN_PARALLEL_OPS_FORK if start_method() == "fork" else MIN_PARALLEL_OPS
    big = sum(cost) >= least
    parallel = pool is not None and len(jobs) > 1 and (forced or pool.started or big)
    # (a predicted size only where it may matter: -j 1 orders its jobs the same, for the
    # record, once they are as large as -j N would run in parallel)
    sizes = took or ([size(j) for j in jobs] if size is not None and (parallel or big) else cost)
    order = sorted(range(len(jobs)), key=lambda i: (-sizes[i], i))     # largest first
    if not parallel:
        for i, j in enumerate(jobs):
            done(i, fn(j))
        return order, set(range(len(jobs)))

    def settle(k: int, ok: bool, res: Any) -> None:
        if not ok:
            raise res
        done(order[k], res)

    assert pool is not None
    here = pool.run(fn, [jobs[i] for i in order], settle)
    return order, {order[k] for k in here}

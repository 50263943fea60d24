"""Verification alongside: ``kbtrace run``'s verify in a second process while the headline
and the report run in this one.

After the replay, verify (re-executing the trace in replay order) and the headline + report
(DuckDB over the run's files) read the same finished run and share nothing else; each keeps
one core busy. On a machine with two or more cores ``run_workload`` starts verify here
(``VerifyAlongside``) as soon as the replay has written the run, and collects its result
where it would otherwise have run it: the run's wall time falls by the shorter of the two,
its CPU time does not change (plus the second interpreter's start, ~0.5 s).

The child is ``python -m kbtrace.analysis.alongside RUN_DIR OUT VERBOSITY PARENT_PID``, not a
``multiprocessing`` worker: those re-import the caller's ``__main__``, which re-runs a user's
script that calls ``run_workload`` without an ``if __name__ == "__main__"`` guard. On Linux
it is sent SIGTERM if the parent dies first (``prctl(PR_SET_PDEATHSIG)``). It
inherits stderr (its log lines and warnings show as verify's would) and writes one pickle to
``OUT`` (in a directory ``tempfile.mkdtemp`` made for it, removed after): ``("ok",
VerifyResult, seconds)``, or ``("error", exception, seconds)`` for an
exception verify raised, re-raised here as it would have been inline. A child that ends
without writing it (killed, out of memory) is one ``AnalysisError`` with its exit status.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kbtrace.errors import AnalysisError

__all__ = ["VerifyAlongside", "ALONGSIDE_MIN_OPS", "cores"]

#: ``run_workload``'s automatic choice verifies alongside from this many ops on: below it,
#: verify takes about as long as the second interpreter's start (~0.5 s)
ALONGSIDE_MIN_OPS = 50_000


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):       # (not Linux)
        return os.cpu_count() or 1


class VerifyAlongside:
    """``verify(run_dir)`` running in a child process from construction on; ``result()``
    waits for it, ``cancel()`` stops it. Either removes the child's result directory."""

    def __init__(self, run_dir: str | os.PathLike[str], verbosity: int = 0) -> None:
        self.run_dir = Path(run_dir)
        # a directory of its own (0700): nobody else can plant the result or its partial file
        self._dir = Path(tempfile.mkdtemp(prefix="kbtrace-verify-"))
        self._out = self._dir / "result.pickle"
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [sys.executable, "-m", "kbtrace.analysis.alongside", str(self.run_dir),
                 str(self._out), str(verbosity), str(os.getpid())], stdin=subprocess.DEVNULL)
        except OSError:
            self._remove()
            raise
        self.pid = self._proc.pid

    def result(self) -> tuple[Any, float]:
        """``(VerifyResult, seconds verify took in the child)``; what verify raised, raised."""
        proc = self._proc
        if proc is None:
            raise AnalysisError("verify alongside: already collected or cancelled")
        try:
            rc = proc.wait()
            got = self._out.read_bytes() if self._out.is_file() else b""
        except BaseException:
            self.cancel()
            raise
        self._proc = None
        self._remove()
        if not got:
            raise AnalysisError(f"verify of {self.run_dir} ended without a result (exit status "
                                f"{rc}: killed, or out of memory?); run `kbtrace verify "
                                f"{self.run_dir}` to verify it alone")
        kind, value, seconds = pickle.loads(got)
        if kind == "error":
            raise value
        return value, seconds

    def cancel(self) -> None:
        """Stop the child (if it still runs) and remove its result directory."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._remove()

    def _remove(self) -> None:
        """Remove the result's directory (made by this object, with whatever the child left)."""
        shutil.rmtree(self._dir, ignore_errors=True)


def _die_with_parent() -> None:
    """Linux: have the kernel send this process SIGTERM when its parent dies (killed before
    it could cancel this one), so no orphan keeps verifying a run nobody waits for."""
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):                   # (not Linux, no libc)
        pass


def _child(run_dir: str, out: str, verbosity: int) -> None:
    """The child's work: verify ``run_dir``, the outcome pickled into ``out`` (whole:
    ``_io.atomic_path``)."""
    from kbtrace._io import atomic_path
    from kbtrace._progress import setup_logging
    from kbtrace.analysis.verifier import verify

    setup_logging(verbosity)
    t = time.perf_counter()
    outcome: tuple[str, Any, float]
    try:
        outcome = ("ok", verify(run_dir), time.perf_counter() - t)
    except Exception as exc:        # (re-raised in the parent, as inline)
        outcome = ("error", exc, time.perf_counter() - t)
    try:
        data = pickle.dumps(outcome)
    except Exception as exc:        # an exception that does not pickle: its message
        data = pickle.dumps(("error", AnalysisError(f"verify failed: {outcome[1]!r} ({exc})"),
                             outcome[2]))
    with atomic_path(out) as tmp:
        tmp.write_bytes(data)


if __name__ == "__main__":
    try:
        _die_with_parent()
        if os.getppid() != int(sys.argv[4]):    # (the parent died before that)
            sys.exit(1)
        from kbtrace._hugepages import install
        install()                   # as the kbtrace command does
        _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    except KeyboardInterrupt:       # (Ctrl-C reaches the whole process group: the parent
        sys.exit(130)               # reports it; no second traceback from here)

"""One exception hierarchy for every user-facing failure.

Every error a user can cause (bad YAML, unknown node id, a kernel that overflows
TCM, a trace that does not fit a topology, a schema version mismatch, ...) is a
``KbtraceError`` subclass carrying one actionable line: *what* went wrong,
*where* (file, YAML path, kernel/program/line, node id) and *how to fix it*.
The CLI prints ``str(err)`` and exits non-zero; it never shows a traceback for
these. Internal bugs stay ordinary exceptions (and do show a traceback).
"""

from __future__ import annotations

__all__ = [
    "KbtraceError",
    "TopologyError",
    "AddressError",
    "RoutingError",
    "CaptureError",
    "DeadlockError",
    "SanitizerError",
    "ReplayError",
    "InvariantError",
    "SweepError",
    "SweepPointsFailed",
    "SchemaError",
    "AnalysisError",
    "VerifyError",
    "UsageError",
    "OutputError",
    "shorten",
    "MAX_MESSAGE_CHARS",
]

#: longest error line the CLI prints; the middle of a longer one is elided
MAX_MESSAGE_CHARS = 1000


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` on one line and at most about ``limit`` characters: the head and the tail
    (where the fix is) kept, the middle replaced by ``...[N characters]...``. A value a user
    wrote (a list expanded from YAML aliases, a huge number) never floods a terminal."""
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    return f"{text[:head]}...[{len(text) - head - tail:,} characters]...{text[-tail:]}"


class KbtraceError(Exception):
    """Base class of every error kbtrace reports to a user (its message ``shorten``-ed)."""

    exit_code: int = 2

    def __init__(self, *args: object) -> None:
        if len(args) == 1 and isinstance(args[0], str):
            args = (shorten(args[0]),)
        super().__init__(*args)


class TopologyError(KbtraceError):
    """A topology YAML is malformed or inconsistent (raised by compile_topology)."""


class AddressError(KbtraceError):
    """A physical address is malformed (MBZ bits, reserved kind) or out of capacity."""


class RoutingError(KbtraceError):
    """No route exists between two nodes, or a node id is unknown."""


class CaptureError(KbtraceError):
    """A kernel or host program misbehaved during capture."""


class DeadlockError(CaptureError):
    """Every program is blocked; the message lists each program's blocking call."""


class SanitizerError(CaptureError):
    """A sanitizer caught an illegal access (TCM overflow, unallocated address, ...)."""


class ReplayError(KbtraceError):
    """A trace cannot be replayed on a topology (placement mismatch, bad option, ...)."""


class InvariantError(ReplayError):
    """A physical invariant was violated during replay (a model bug, not a user error)."""


class SweepError(ReplayError):
    """A sweep config or directory is invalid (nothing was run)."""


class SweepPointsFailed(SweepError):
    """Points of a sweep failed; the others ran and every output was kept (exit 1)."""

    exit_code = 1


class SchemaError(KbtraceError):
    """A Parquet/JSON artefact does not match the schema this kbtrace version reads."""


class AnalysisError(KbtraceError):
    """A query, report, diff or export could not be produced."""


class VerifyError(AnalysisError):
    """Phase-2 numeric verification found a mismatch (or could not run)."""

    exit_code = 1


class UsageError(KbtraceError):
    """A command's path argument names nothing: no such path and no catalog entry of that name."""


class OutputError(KbtraceError):
    """An output cannot be written where asked (not a directory, no permission, no space), or
    writing it would replace a directory kbtrace did not write."""

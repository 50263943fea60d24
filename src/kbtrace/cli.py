"""`kbtrace` entry point: argument parsing only; every subcommand calls the library.

Each stage owns its subcommands in ``kbtrace.<stage>.cli`` (a ``register(sub)``
function adding parsers whose ``func(args) -> int`` does the work). A
``KbtraceError`` becomes one line on stderr (long values elided, ``errors.shorten``) and
a non-zero exit code; ``--traceback`` adds the whole chain (e.g. the exception a workload
raised). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from kbtrace import __version__
from kbtrace._progress import log, setup_logging
from kbtrace.errors import KbtraceError, shorten

__all__ = ["main", "build_parser"]

#: Modules contributing subcommands, in help order. A stage not yet present is skipped.
_STAGE_CLIS = (
    "kbtrace.topology.cli",
    "kbtrace.capture.cli",
    "kbtrace.replay.cli",
    "kbtrace.analysis.cli",
    "kbtrace.insight.cli",
    "kbtrace.studies.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kbtrace",
        description="Trace-driven performance model for a multi-die AI accelerator: "
                    "capture kernels into Arrow op traces, replay them with SimPy against "
                    "any topology, analyse time and numbers with DuckDB/polars.",
    )
    parser.add_argument("--version", action="version", version=f"kbtrace {__version__}")
    parser.add_argument("--traceback", action="store_true",
                        help="on an error, print the whole Python traceback after the one-line "
                             "message (e.g. of an exception raised inside a workload)")
    _add_verbosity(parser, 0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in _STAGE_CLIS:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                continue
            raise
        mod.register(sub)
    for leaf in _leaves(parser):      # -q / -v before or after the subcommand
        _add_verbosity(leaf, argparse.SUPPRESS)
        leaf.set_defaults(command_path=leaf.prog.removeprefix(parser.prog).strip())
    return parser


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """Warnings as one ``kbtrace: warning: ...`` line (no source file and line of the
    warnings.warn call, which is kbtrace's code, not the user's)."""
    print(f"kbtrace: warning: {shorten(str(message))}", file=file or sys.stderr)


def _add_verbosity(p: argparse.ArgumentParser, default: object) -> None:
    p.add_argument("-q", "--quiet", action="count", default=default,
                   help="only errors on stderr: no progress, notes or warnings")
    p.add_argument("-v", "--verbose", action="count", default=default,
                   help="more on stderr: -v the command's wall time, each `run` stage's, "
                        "topology cache hits and misses; -vv also each analysis view "
                        "materialised, with its time")


def _leaves(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [p]
    return [leaf for s in subs for c in dict.fromkeys(s.choices.values()) for leaf in _leaves(c)]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kbtrace`` command. Run as the program (no ``argv``: the console script, ``python
    -m kbtrace``), it first puts pymalloc's arenas on huge pages (``kbtrace._hugepages``;
    ``KBTRACE_HUGE_PAGES=0``: not); ``main([...])`` from Python leaves the allocator alone."""
    huge = None
    if argv is None:
        from kbtrace._hugepages import install
        huge = install()
    argv = list(sys.argv[1:] if argv is None else argv)
    show_tb = "--traceback" in argv     # known even when parsing fails
    parser = build_parser()
    saved = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        args = parser.parse_args(argv)   # path arguments resolve here (kbtrace._paths)
        setup_logging(getattr(args, "verbose", 0) - getattr(args, "quiet", 0))
        if huge is not None:
            from kbtrace._hugepages import malloc_status
            log.debug(f"pymalloc's arenas on huge pages: {huge}")
            log.debug(f"glibc's malloc keeps freed blocks mapped: {malloc_status()}")
        if not getattr(args, "func", None):
            parser.print_help()
            return 0 if args.command is None else 2
        t0 = time.perf_counter()
        rc = int(args.func(args) or 0)
        log.info(f"{getattr(args, 'command_path', args.command)} took "
                 f"{time.perf_counter() - t0:.2f} s (exit {rc})")
        return rc
    except KbtraceError as err:
        print(f"kbtrace: error: {shorten(str(err))}", file=sys.stderr)
        if show_tb:
            traceback.print_exception(err, file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("kbtrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (`kbtrace topo show ... | head`): not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:
        # the file system refused something kbtrace's own checks did not foresee (a path
        # vanished, a disk filled up): still one line, not a traceback
        where = f"{err.filename}: " if err.filename else ""
        print(f"kbtrace: error: {where}{err.strerror or err}; check the path, its permissions "
              f"and free space", file=sys.stderr)
        if show_tb:
            traceback.print_exception(err, file=sys.stderr)
        return 2
    finally:
        warnings.showwarning = saved


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

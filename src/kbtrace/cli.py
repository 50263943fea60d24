"""`kbtrace` entry point: argument parsing only; every subcommand calls the library.

Each stage owns its subcommands in ``kbtrace.<stage>.cli`` (a ``register(sub)``
function adding parsers whose ``func(args) -> int`` does the work). A
``KbtraceError`` becomes one line on stderr and a non-zero exit code; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from kbtrace import __version__
from kbtrace.errors import KbtraceError

__all__ = ["main", "build_parser"]

#: Modules contributing subcommands, in help order. A stage not yet present is skipped.
_STAGE_CLIS = (
    "kbtrace.topology.cli",
    "kbtrace.capture.cli",
    "kbtrace.replay.cli",
    "kbtrace.analysis.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kbtrace",
        description="Trace-driven performance model for a multi-die AI accelerator: "
                    "capture kernels into Arrow op traces, replay them with SimPy against "
                    "any topology, analyse time and numbers with DuckDB/polars.",
    )
    parser.add_argument("--version", action="version", version=f"kbtrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in _STAGE_CLIS:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name == mod_name:
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)   # path arguments resolve here (kbtrace._paths)
        if not getattr(args, "func", None):
            parser.print_help()
            return 0 if args.command is None else 2
        return int(args.func(args) or 0)
    except KbtraceError as err:
        print(f"kbtrace: error: {err}", file=sys.stderr)
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
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

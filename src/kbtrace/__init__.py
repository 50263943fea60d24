"""kbtrace: a trace-driven performance model for a multi-die AI accelerator.

Pipeline (each arrow a library function first, a CLI subcommand second)::

    capture/<workload>.py --capture--> trace dir  (ops.parquet, memory.parquet, trace.json)
    topologies/<hw>.yaml  --compile--> Topology   (+ nodes/links tables, cached by hash)
    trace + topology      --replay---> run dir    (op_timing.parquet, hops.parquet, run.json)
    run (+ trace)         --analyse--> SQL views, report, verify, diff, Perfetto export

Public names are re-exported here lazily so ``import kbtrace`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "compile_topology": "kbtrace.topology",
    "Topology": "kbtrace.topology",
    "capture": "kbtrace.capture",
    "replay": "kbtrace.replay",
    "open_run": "kbtrace.analysis",
    "verify": "kbtrace.analysis",
    "diff": "kbtrace.analysis",
    "report": "kbtrace.analysis",
    "KbtraceError": "kbtrace.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __dir__() -> list[str]:
    """The module's attributes and the lazily imported public names (``dir(kbtrace)``,
    tab completion)."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'kbtrace' has no attribute {name!r}")
    if mod == f"kbtrace.{name}":  # a callable stage package (see kbtrace._callable)
        return importlib.import_module(mod)
    return getattr(importlib.import_module(mod), name)

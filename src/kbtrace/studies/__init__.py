"""Evaluation: the project catalog, the transfer probe and the predecessor's milestone studies.

Role
    Judge the modelled hardware the way the predecessor's users did (ADR-0010, 0043, 0044,
    0049, 0054, 0057): single transfers against their lower bound (``probe``), and studies
    that sweep a workload family and compare kbtrace's figures with the reference's.

Inputs / outputs
    topology                  ->  ProbeResult (frames: cases, size sweep, invariants, hops)
    study name + topology     ->  study dir: sweep (hive Parquet), tables (CSV/MD), PNG
                                  figures, index.html, reference-vs-measured table
    catalogs (capture/, ...)  ->  one frame per kind (``catalog``, ``kbtrace list``)

Phases (a study)
    sweep (replay.sweep or single replays) -> frames -> tables -> figures -> page ->
    reference vs measured (ratio, tolerance, orderings) -> calibration check against
    the committed record in ``data/calibration/``.

Imports are one-way: this package uses topology, capture, replay and analysis; nothing
there imports it (the CLI registers its subcommands).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"catalog": "kbtrace.studies.catalog", "run_probe": "kbtrace.studies.probe",
            "ProbeResult": "kbtrace.studies.probe"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    # lazy, so building the CLI parser does not import polars
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'kbtrace.studies' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)

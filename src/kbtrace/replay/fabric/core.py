"""Which fast-mode core runs: the compiled one (Cython) or the pure-Python reference.

``booking.py``, ``fifo.py``, ``ledger.py``, ``fair.py``, ``enters.py``, ``heads.py``, ``bodies.py``, ``pull.py``,
``routes.py``, ``fast.py`` and ``replay/hbm.py`` are the reference: readable, and what runs where
nothing was compiled. ``pip install -e .`` compiles copies of them (``_booking_c``, ``_fifo_c``,
``_ledger_c``, ``_fair_c``, ``_enters_c``, ``_heads_c``, ``_bodies_c``, ``_pull_c``, ``_routes_c``, ``_fast_c``,
``_hbm_c``; ``setup.py``) where a C compiler exists. ``hbm_controller()``, ``row_buffers()`` and ``seg_kernels()`` give fast mode the
compiled ``HbmController``, the recorder's compiled row buffers (``replay/rowbuf.py``) and its
compiled batch sorts and busy-window sweep (``replay/segsort.py``) with the rest of the core,
and ``environment()`` its SimPy environment on a typed event queue (``replay/eventq.py``;
flit mode, the reference, keeps the ``.py`` ones, numpy and SimPy's own heap). Both give byte-identical outputs
(``tests/test_replay_core.py``). ``fast_fabric()`` returns the compiled ``FastFabric``
when it is built from the current sources, else the reference one, warning once per
process why (``PurePythonCore``, a ``RuntimeWarning``) when stderr is a terminal (a
person is watching; pipes, logs and tests get the same outputs and no noise): not built,
built from older sources (rebuild: ``pip install -e .``), or switched off with
``KBTRACE_PURE_PYTHON=1``.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import warnings
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["fast_fabric", "hbm_controller", "row_buffers", "seg_kernels", "pe_model", "op_core",
           "environment", "status", "source_digest", "PurePythonCore", "PURE_ENV", "CORE"]

PURE_ENV = "KBTRACE_PURE_PYTHON"
_PKG = Path(__file__).resolve().parent
#: compiled module -> its reference source (setup.py reads this list and ``source_digest``
#: from this file: keep its top-level imports to the standard library)
CORE = {"kbtrace.replay.fabric._eventq_c": _PKG.parent / "eventq.py",
        "kbtrace.replay.fabric._events_c": _PKG / "events.py",
        "kbtrace.replay.fabric._booking_c": _PKG / "booking.py",
        "kbtrace.replay.fabric._fair_c": _PKG / "fair.py",
        "kbtrace.replay.fabric._ledger_c": _PKG / "ledger.py",
        "kbtrace.replay.fabric._fifo_c": _PKG / "fifo.py",
        "kbtrace.replay.fabric._fast_c": _PKG / "fast.py",
        "kbtrace.replay.fabric._heads_c": _PKG / "heads.py",
        "kbtrace.replay.fabric._bodies_c": _PKG / "bodies.py",
        "kbtrace.replay.fabric._pull_c": _PKG / "pull.py",
        "kbtrace.replay.fabric._enters_c": _PKG / "enters.py",
        "kbtrace.replay.fabric._routes_c": _PKG / "routes.py",
        "kbtrace.replay.fabric._hbm_c": _PKG.parent / "hbm.py",
        "kbtrace.replay.fabric._rowbuf_c": _PKG.parent / "rowbuf.py",
        "kbtrace.replay.fabric._segsort_c": _PKG.parent / "segsort.py",
        "kbtrace.replay.fabric._stations_c": _PKG.parent / "stations.py",
        "kbtrace.replay.fabric._cpu_c": _PKG.parent / "cpu.py",
        "kbtrace.replay.fabric._opcore_c": _PKG.parent / "opcore.py"}


def source_digest(ref: Path) -> str:
    """SHA-256 of a reference source and its ``.pxd`` if it has one (its types), as
    ``setup.py`` records it in the twin (``SOURCE_SHA256``)."""
    pxd = ref.with_suffix(".pxd")
    return hashlib.sha256(ref.read_bytes() + (pxd.read_bytes() if pxd.is_file() else b"")).hexdigest()


class PurePythonCore(RuntimeWarning):
    """Fast mode runs its pure-Python core (slower; results are identical)."""


@cache
def status() -> tuple[type, str]:
    """``(FastFabric class, "compiled" or why the pure-Python core runs)``."""
    from kbtrace.replay.fabric.fast import FastFabric

    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return FastFabric, f"switched off ({PURE_ENV}={os.environ[PURE_ENV]})"
    mods = {}
    for name, ref in CORE.items():
        try:
            mod = importlib.import_module(name)
        except ImportError:
            return FastFabric, "not built (pip install -e . compiles it with a C compiler)"
        if not str(getattr(mod, "__file__", "")).endswith(tuple(_ext_suffixes())):
            return FastFabric, f"{name} is not an extension module; rebuild with pip install -e ."
        if getattr(mod, "SOURCE_SHA256", None) != source_digest(ref):
            pxd = ref.with_suffix(".pxd")
            return FastFabric, (f"built from an older {ref.name}"
                                f"{f' or {pxd.name}' if pxd.is_file() else ''}; rebuild with "
                                "pip install -e .")
        mods[name] = mod
    return mods["kbtrace.replay.fabric._fast_c"].FastFabric, "compiled"


def _ext_suffixes() -> list[str]:
    from importlib.machinery import EXTENSION_SUFFIXES
    return EXTENSION_SUFFIXES


_warned = False


def _tty() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def fast_fabric() -> type:
    """The ``FastFabric`` class to use (see the module docstring); warns once if pure."""
    global _warned
    cls, why = status()
    if why != "compiled" and not _warned and _tty():
        _warned = True
        warnings.warn(f"kbtrace: fast replay runs its pure-Python core ({why}); results are "
                      "identical, only slower", PurePythonCore, stacklevel=3)
    return cls


def hbm_controller() -> type:
    """The ``HbmController`` class of fast mode: the compiled one with the compiled core
    (``status``), else ``hbm.py``'s."""
    if status()[1] == "compiled":
        return importlib.import_module("kbtrace.replay.fabric._hbm_c").HbmController
    from kbtrace.replay.hbm import HbmController
    return HbmController


def row_buffers() -> tuple[type, type, type]:
    """The recorder's buffer classes of fast mode (``HopRows``, ``CompactRows``, ``DoneRows``):
    the compiled ones with the compiled core (``status``), else ``rowbuf.py``'s."""
    if status()[1] == "compiled":
        mod = importlib.import_module("kbtrace.replay.fabric._rowbuf_c")
    else:
        from kbtrace.replay import rowbuf as mod
    return mod.HopRows, mod.CompactRows, mod.DoneRows


def seg_kernels() -> Any:
    """The recorder's compiled batch sorts and busy-window sweep (``replay/segsort.py``'s
    compiled twin) with the compiled core (``status``), else None: the recorder and the busy
    check then run their numpy passes (``segsort`` run interpreted would be far slower)."""
    if status()[1] == "compiled":
        return importlib.import_module("kbtrace.replay.fabric._segsort_c")
    return None


def pe_model() -> tuple[Any, type]:
    """Fast mode's PE model: the module of its stations and servers (``replay/stations.py``)
    and PE_CPU's class (``replay/cpu.py``): their compiled twins (typed by ``stations.pxd`` /
    ``cpu.pxd``) with the compiled core (``status``), else the ``.py`` ones (what flit mode
    always runs)."""
    if status()[1] == "compiled":
        return (importlib.import_module("kbtrace.replay.fabric._stations_c"),
                importlib.import_module("kbtrace.replay.fabric._cpu_c").Cpu)
    from kbtrace.replay import cpu, stations
    return stations, cpu.Cpu


def op_core() -> type:
    """Fast mode's ``OpCore`` (``replay/opcore.py``: plans, issues, completions, HBM reads):
    its compiled twin (typed by ``opcore.pxd``, called by the compiled PE model) with the
    compiled core (``status``), else the ``.py`` one (what flit mode always runs)."""
    if status()[1] == "compiled":
        return importlib.import_module("kbtrace.replay.fabric._opcore_c").OpCore
    from kbtrace.replay.opcore import OpCore
    return OpCore


def environment() -> Any:
    """Fast mode's SimPy environment: ``eventq.Env`` (its event queue typed) compiled with the
    compiled core (``status``), else SimPy's own (``eventq.plain_env``: what flit mode always
    runs; ``eventq`` run interpreted would be slower than ``heapq``)."""
    if status()[1] == "compiled":
        return importlib.import_module("kbtrace.replay.fabric._eventq_c").Env()
    from kbtrace.replay.eventq import plain_env
    return plain_env()

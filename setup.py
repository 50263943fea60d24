"""Build hook: fast mode's replay core compiled with Cython, when it can be (issue 22), and
the huge-page arena allocator ``kbtrace._hugearena`` (``src/kbtrace/_hugearena.c``).

Everything else about the package is in ``pyproject.toml``. The compiled core is optional:
``pip install -e .`` compiles it where a C compiler and the Python headers exist, and
kbtrace runs the same code as pure Python where it is not built (saying so once; see
``kbtrace.replay.fabric.core``).

The reference sources stay the readable ``.py`` files (``replay/eventq.py``, ``replay/fabric/events.py``, ``booking.py``,
``fifo.py``, ``ledger.py``, ``fair.py``, ``enters.py``, ``heads.py``, ``bodies.py``, ``pull.py``, ``routes.py``, ``fast.py``, ``replay/hbm.py``,
``rowbuf.py``, ``segsort.py``, ``stations.py``, ``cpu.py``, ``opcore.py``); Cython compiles copies
of them under other module names (``_eventq_c``, ``_events_c``, ``_booking_c``, ``_fifo_c``, ``_ledger_c``, ``_fair_c``, ``_heads_c``,
``_bodies_c``, ``_pull_c``, ``_enters_c``, ``_routes_c``, ``_fast_c``, ``_hbm_c``, ``_rowbuf_c``, ``_segsort_c``, ``_stations_c``,
``_cpu_c``, ``_opcore_c``,
all in ``replay/fabric/``), generated into ``build/kbtrace-core/`` with the imports between
them pointed at the compiled twins, the types of their ``.pxd`` files (Cython's pure-Python mode: an augmenting ``.pxd`` beside the
``.py``), and the SHA-256 of the reference source and its ``.pxd`` appended (``SOURCE_SHA256``),
so a compiled module older than either is recognised and not used.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
GEN = Path("build") / "kbtrace-core"              # relative: setuptools wants relative sources
#: the compiled core's modules (compiled module -> its reference source under src/) and how a
#: twin's sources are digested, from the module that checks them at run time
#: (``kbtrace.replay.fabric.core``: it imports only the standard library at its top, so it runs
#: here, before the package can be imported)
_CORE_PY = runpy.run_path(str(ROOT / "src" / "kbtrace" / "replay" / "fabric" / "core.py"))
CORE = {mod: ref.relative_to(ROOT / "src").as_posix() for mod, ref in _CORE_PY["CORE"].items()}
_source_digest = _CORE_PY["source_digest"]
#: processes for Cython's translation and the C compiles (both are one process per module)
_JOBS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
TWINS = {"kbtrace.replay.fabric.events": "kbtrace.replay.fabric._events_c",
         "kbtrace.replay.fabric.booking": "kbtrace.replay.fabric._booking_c",
         "kbtrace.replay.fabric.fair": "kbtrace.replay.fabric._fair_c",
         "kbtrace.replay.fabric.ledger": "kbtrace.replay.fabric._ledger_c",
         "kbtrace.replay.fabric.fifo": "kbtrace.replay.fabric._fifo_c",
         "kbtrace.replay.fabric.heads": "kbtrace.replay.fabric._heads_c",
         "kbtrace.replay.fabric.bodies": "kbtrace.replay.fabric._bodies_c",
         "kbtrace.replay.fabric.pull": "kbtrace.replay.fabric._pull_c",
         "kbtrace.replay.fabric.enters": "kbtrace.replay.fabric._enters_c",
         "kbtrace.replay.fabric.routes": "kbtrace.replay.fabric._routes_c",
         "kbtrace.replay.stations": "kbtrace.replay.fabric._stations_c"}


def _generate() -> list[Extension]:
    exts = []
    for mod, rel in CORE.items():
        ref = ROOT / "src" / rel
        raw = ref.read_bytes()
        text = raw.decode()
        for a, b in TWINS.items():
            text = text.replace(f"from {a} import", f"from {b} import")
        text += f'\n\nSOURCE_SHA256 = "{_source_digest(ref)}"\n'
        out = ROOT / GEN / (mod.replace(".", "/") + ".py")
        out.parent.mkdir(parents=True, exist_ok=True)
        for d in (out.parent, out.parent.parent, out.parent.parent.parent):   # package dirs,
            (d / "__init__.py").touch()              # so Cython names the module in full
        if not out.is_file() or out.read_text() != text:
            out.write_text(text)
        pxd = ref.with_suffix(".pxd")
        if pxd.is_file():
            shutil.copyfile(pxd, out.with_suffix(".pxd"))
        elif out.with_suffix(".pxd").is_file():
            out.with_suffix(".pxd").unlink()
        # no fused multiply-add: C doubles then round exactly as Python floats do
        exts.append(Extension(mod, [str(GEN / (mod.replace(".", "/") + ".py"))], optional=True,
                              extra_compile_args=["-ffp-contract=off"]))
    return exts


def _ext_modules() -> list[Extension]:
    """The compiled core's extensions; none (the pure-Python core) without Cython or when
    Cython fails on the sources (the build goes on; the C compilation is optional too)."""
    try:
        from Cython.Build import cythonize
        from Cython.Compiler.Errors import CompileError
    except ImportError:
        return []
    try:
        # types come from the .pxd only (the .py annotations are for readers and checkers)
        return cythonize(_generate(), language_level=3, quiet=True, nthreads=_JOBS,
                         compiler_directives={"binding": False, "annotation_typing": False})
    except CompileError as exc:
        print(f"kbtrace: compiled replay core not built (Cython: {exc}); pure Python it is")
        return []


def _hugearena() -> list[Extension]:
    """``kbtrace._hugearena`` (pymalloc's arenas on transparent huge pages, installed by the
    ``kbtrace`` command: ``kbtrace._hugepages``): plain C, Linux only, optional like the core
    (not built: the command runs on pymalloc's default arenas)."""
    if not sys.platform.startswith("linux"):
        return []
    return [Extension("kbtrace._hugearena", ["src/kbtrace/_hugearena.c"], optional=True)]


setup(ext_modules=_ext_modules() + _hugearena(), options={"build_ext": {"parallel": _JOBS}})

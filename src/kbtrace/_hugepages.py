"""pymalloc's arenas on transparent huge pages, and glibc's malloc keeping what it frees, for
the processes kbtrace owns (issue 22).

``install()`` switches CPython's small-object allocator to arenas carved from 2 MiB-aligned
chunks madvised ``MADV_HUGEPAGE`` (the C extension ``kbtrace._hugearena``, built by
``pip install -e .`` where a C compiler exists, Linux only). The replay's objects then sit
on 2 MiB pages: fewer TLB misses, the same results (byte-identical outputs).

It changes the whole process's allocator and can not be undone, so only the ``kbtrace``
command calls it (``kbtrace.cli.main()`` run as the program, and ``python -m kbtrace``) and
the sweep workers of a process that did; ``import kbtrace`` and the library calls leave a
notebook's allocator as it is. ``KBTRACE_HUGE_PAGES=0`` keeps the default arenas; so does a
kernel whose transparent huge pages are ``never``, and a build without the extension.

``install()`` also asks glibc's malloc (``mallopt``) to serve blocks up to ``KEEP_BYTES`` from
its heap instead of a fresh mapping each, and to give the heap's free top back to the kernel
only past ``KEEP_BYTES``: numpy's column buffers, freed and allocated again batch after
batch, then reuse pages already mapped instead of faulting in fresh zeroed ones (a 100 k-op
fast replay: 49 k page faults -> 36 k, 0.48-0.61 -> 0.36-0.38 s of system time; the peak RSS
the same). ``KBTRACE_MALLOC_KEEP=0`` leaves malloc as it is; elsewhere than glibc it is
``"not supported"`` (``malloc_status()``).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
from typing import Any

__all__ = ["ENV", "MALLOC_ENV", "install", "installed", "malloc_status", "status", "thp_mode"]

#: the environment switch: "0" keeps pymalloc's default arenas
ENV = "KBTRACE_HUGE_PAGES"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"

_status: str | None = None     # install()'s answer, once asked

#: the environment switch: "0" leaves glibc's malloc options as they are
MALLOC_ENV = "KBTRACE_MALLOC_KEEP"
#: blocks up to this size from the heap; its free top kept up to this size
KEEP_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # glibc's malloc.h
_malloc: str | None = None     # what install() did to malloc, once asked


def thp_mode(path: str | None = None) -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise`` or ``never``: the
    bracketed word of ``path``, default ``THP_ENABLED``), or None where there is no such file
    (not Linux)."""
    try:
        with open(path or THP_ENABLED) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def install() -> str:
    """Put pymalloc's arenas on huge pages in this process, unless switched off; the outcome,
    as a short phrase: ``"installed"``, or why not (``"off (KBTRACE_HUGE_PAGES=0)"``, ``"off
    (transparent huge pages: never)"``, ``"not built"``, ``"not supported"``). Asked again,
    the first answer (the switch is read once)."""
    global _status, _malloc
    if _malloc is None:
        _malloc = _keep_freed()
    if _status is None:
        _status = _install()
    return _status


def _keep_freed() -> str:
    if os.environ.get(MALLOC_ENV, "1").strip() == "0":
        return f"off ({MALLOC_ENV}=0)"
    if not sys.platform.startswith("linux"):
        return "not supported"
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "not supported"
    ok = mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) and mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES)
    return "kept" if ok else "not supported"


def malloc_status() -> str:
    """What ``install()`` did to glibc's malloc in this process: ``"kept"`` (freed blocks up to
    ``KEEP_BYTES`` stay mapped), ``"off (KBTRACE_MALLOC_KEEP=0)"``, ``"not supported"``, or
    ``"not asked"``."""
    return _malloc or "not asked"


def _install() -> str:
    if os.environ.get(ENV, "1").strip() == "0":
        return f"off ({ENV}=0)"
    mode = thp_mode()
    if mode is None or mode == "never":
        return f"off (transparent huge pages: {mode or 'none'})"
    ext = _extension()
    if ext is None:
        return "not built"
    return "installed" if ext.install() else "not supported"


def _extension() -> Any:
    """``kbtrace._hugearena``, or None where it is not built."""
    try:
        return importlib.import_module("kbtrace._hugearena")
    except ImportError:
        return None


def installed() -> bool:
    """Whether this process's arenas are on huge pages (``install()`` succeeded here, or in
    the process this one was forked from)."""
    ext = _extension()
    return ext is not None and bool(ext.stats()["installed"])


def status() -> str:
    """``install()``'s answer in this process, or ``"not installed"`` if it was not asked
    (then ``installed()`` may still say a parent it was forked from installed it)."""
    return _status or ("installed (inherited)" if installed() else "not installed")

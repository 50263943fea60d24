"""pymalloc's arenas on transparent huge pages, for the processes kbtrace owns (issue 22).

``install()`` switches CPython's small-object allocator to arenas carved from 2 MiB-aligned
chunks madvised ``MADV_HUGEPAGE`` (the C extension ``kbtrace._hugearena``, built by
``pip install -e .`` where a C compiler exists, Linux only). The replay's objects then sit
on 2 MiB pages: fewer TLB misses, the same results (byte-identical outputs).

It changes the whole process's allocator and can not be undone, so only the ``kbtrace``
command calls it (``kbtrace.cli.main()`` run as the program, and ``python -m kbtrace``) and
the sweep workers of a process that did; ``import kbtrace`` and the library calls leave a
notebook's allocator as it is. ``KBTRACE_HUGE_PAGES=0`` keeps the default arenas; so does a
kernel whose transparent huge pages are ``never``, and a build without the extension.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["ENV", "install", "installed", "status", "thp_mode"]

#: the environment switch: "0" keeps pymalloc's default arenas
ENV = "KBTRACE_HUGE_PAGES"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"

_status: str | None = None     # install()'s answer, once asked


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
    global _status
    if _status is None:
        _status = _install()
    return _status


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

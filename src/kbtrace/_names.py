"""Default names of traces and runs: what was varied is in the name, so two different
captures or replays never share a directory.

A name is its parts joined by ``-``::

    <workload>[-<params>]-<topology>[-<overrides>]-<fidelity>     (a run)
    <workload>[-<params>][-<topology>[-<overrides>]]             (a trace)

``<params>`` are the workload parameters that differ from the workload's ``PARAMS``
defaults, ``<overrides>`` the topology ``--set`` values, each rendered by ``tag``:
``KEY_VALUE`` items sorted by key and joined by ``-`` (``M_1024``,
``cube.hbm.pc_bw_gbps_16``). A value holding anything but letters, digits, ``.`` and
``+`` (a ``-``, ``_``, ``/``, a space), a key holding anything but letters, digits, ``.``
and ``_``, or a tag longer than ``MAX_TAG`` characters is replaced by ``h`` and the first
10 hex digits of the sha256 of the items (``h3f9a0c12de``): the readable form is
unambiguous (a key runs to its last ``_``; items split at ``-``), the hashed one unique in
practice. Defaults leave the names as they were: ``gemm-small-fast``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["tag", "param_overrides", "variant", "MAX_TAG"]

MAX_TAG = 64
_KEY = re.compile(r"^[A-Za-z0-9._]+$")
_VALUE = re.compile(r"^[A-Za-z0-9.+]+$")


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def tag(items: Mapping[str, Any] | None) -> str:
    """``{"M": 1024, "dtype": "bf16"}`` -> ``"M_1024-dtype_bf16"`` ('' when empty); a hash
    when an item would not be readable unambiguously (see the module docstring)."""
    if not items:
        return ""
    pairs = sorted((str(k), _text(v)) for k, v in items.items())
    readable = "-".join(f"{k}_{v}" for k, v in pairs)
    if (len(readable) <= MAX_TAG and all(_KEY.match(k) for k, _ in pairs)
            and all(_VALUE.match(v) for _, v in pairs)):
        return readable
    digest = hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()
    return "h" + digest[:10]


def param_overrides(defaults: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``params`` whose value differs from ``defaults`` (sorted by key)."""
    return {k: params[k] for k in sorted(params)
            if k not in defaults or params[k] != defaults[k]}


def variant(*parts: str) -> str:
    """Join the non-empty ``parts`` with ``-``."""
    return "-".join(p for p in parts if p)

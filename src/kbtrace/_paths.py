"""What a path argument names: the path as given, or a short name from a project catalog.

Every command takes paths; where a path does not exist, a bare name is looked up in
the catalog of its kind, first under the current directory, then under the
repository root next to the installed package (so a fresh clone works from anywhere):

===============  ====================================  ===================================
kind             catalog (NAME ->)                     example
===============  ====================================  ===================================
``workload``     ``capture/NAME.py``                   ``kbtrace run softmax``
``topology``     ``topologies/NAME.yaml``              ``--topology default``
``trace``        ``data/traces/NAME``                  ``kbtrace replay gemm -t small``
``run``          ``data/runs/NAME``, ``data/sweeps/``  ``kbtrace report gemm-small-fast``
                 ``NAME``, ``data/baselines/NAME``
``sweep``        ``replay/NAME.yaml``                  ``kbtrace sweep hbm_bandwidth``
===============  ====================================  ===================================

A name that resolves nowhere is a ``UsageError`` listing what the catalogs hold
(with the closest match first), so a typo costs one glance. Library functions take
paths; the CLI's arguments and ``kbtrace.run_workload`` go through ``resolve``.
"""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path

from kbtrace.errors import UsageError

__all__ = ["REPO_ROOT", "CATALOGS", "DEFAULT_TOPOLOGY", "resolve", "catalog_names", "project_dir",
           "arg", "add_topology"]

#: the checkout this package was installed from (an editable install); holds capture/ etc.
REPO_ROOT = Path(__file__).resolve().parents[2]

#: kind -> ((directory, suffix), ...) searched in order
CATALOGS: dict[str, tuple[tuple[str, str], ...]] = {
    "workload": (("capture", ".py"),),
    "topology": (("topologies", ".yaml"),),
    "trace": (("data/traces", ""),),
    "run": (("data/runs", ""), ("data/sweeps", ""), ("data/baselines", "")),
    "sweep": (("replay", ".yaml"),),
}

#: the topology every command uses unless told otherwise
DEFAULT_TOPOLOGY = "topologies/small.yaml"


#: what an existing path must be to be taken as that kind (else the catalog is searched:
#: a ./gemm folder in the current directory does not hide the gemm workload)
_SHAPE = {"workload": Path.is_file, "topology": Path.is_file, "sweep": Path.is_file,
          "trace": Path.is_dir}


def _roots() -> list[Path]:
    cwd = Path.cwd()
    return [cwd] if cwd.resolve() == REPO_ROOT else [cwd, REPO_ROOT]


def project_dir(rel: str) -> Path:
    """The project directory ``rel`` (e.g. ``capture``) under the current directory if it
    is there, else under the repository."""
    local = Path(rel)
    return local if local.is_dir() else REPO_ROOT / rel


def _entry_ok(p: Path, suffix: str) -> bool:
    return p.is_file() if suffix else p.is_dir()


def catalog_names(kind: str) -> list[str]:
    """Names the catalogs of ``kind`` hold (under the current directory and the repository)."""
    names: dict[str, None] = {}
    for root in _roots():
        for d, suffix in CATALOGS[kind]:
            base = root / d
            if not base.is_dir():
                continue
            for p in sorted(base.iterdir()):
                if p.name.startswith(("_", ".")) or not _entry_ok(p, suffix):
                    continue
                if suffix and p.suffix != suffix:
                    continue
                names[p.name[:-len(suffix)] if suffix else p.name] = None
    return list(names)


def resolve(p: str | os.PathLike[str], kind: str) -> Path:
    """``p`` if it exists; else relative to the repository root; else the catalog entry
    its bare name selects. Raises ``UsageError`` naming what exists."""
    cand = Path(p)
    shadow = None
    if cand.exists():
        if kind not in _SHAPE or _SHAPE[kind](cand):
            return cand
        shadow = cand        # e.g. a ./gemm folder where the gemm workload was meant
    if not cand.is_absolute() and (REPO_ROOT / cand).exists() and (
            kind not in _SHAPE or _SHAPE[kind](REPO_ROOT / cand)):
        return REPO_ROOT / cand
    name = str(p)
    bare = len(cand.parts) == 1 and not cand.is_absolute()
    if bare:
        for root in _roots():
            for d, suffix in CATALOGS[kind]:
                hit = root / d / (name if name.endswith(suffix) or not suffix else name + suffix)
                if _entry_ok(hit, suffix):
                    return hit
    if shadow is not None:
        want = "a file" if _SHAPE[kind] is Path.is_file else "a directory"
        got = ("a directory" if shadow.is_dir() else "a file" if shadow.is_file()
               else "not a regular file")
        raise UsageError(f"{kind} {name!r}: {shadow} is {got} (a {kind} is {want}) and no "
                         f"{kind} of that name is in the catalog; pass the path of the {kind}")
    known = catalog_names(kind)
    close = difflib.get_close_matches(name if bare else cand.stem, known, n=1)
    where = " or ".join(str(r) for r in _roots())
    dirs = ", ".join(f"{d}/" for d, _s in CATALOGS[kind])
    hint = (f"did you mean {close[0]!r}? " if close else "") + (
        f"known: {', '.join(known)}" if known else f"none in {dirs}")
    raise UsageError(f"{kind} {name!r}: no such path, and no {kind} of that name in {dirs} "
                     f"under {where}; {hint}")


def arg(kind: str):
    """An argparse ``type=`` resolving a path argument of ``kind`` (see ``resolve``)."""
    def convert(value: str) -> Path:
        return resolve(value, kind)
    convert.__name__ = kind            # argparse names the type in its own messages
    return convert


def add_topology(p: argparse.ArgumentParser, *, required: bool = False,
                 overrides: bool = False) -> None:
    """The ``--topology/-t`` option every command shares (a path or a name in topologies/);
    ``overrides``: also ``--set KEY=VALUE`` (repeatable) for its parameters."""
    p.add_argument("--topology", "-t", required=required, metavar="PATH", type=arg("topology"),
                   default=None if required else DEFAULT_TOPOLOGY,
                   help="topology YAML or its name in topologies/, e.g. default"
                        + ("" if required else f" (default {DEFAULT_TOPOLOGY})"))
    if overrides:
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a topology parameter by its YAML path, e.g. "
                            "--set cube.hbm.pc_bw_gbps=16 (repeatable)")

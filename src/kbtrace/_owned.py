"""What kbtrace may replace, and what it must never touch.

Every output kbtrace writes goes through three checks (called by ``kbtrace._io``'s
``atomic_dir``, ``claim_dir`` and ``atomic_path``; nothing else replaces files):

1. **Ownership.** A directory is kbtrace's only when it carries kbtrace's own marker: a
   small regular file ``.kbtrace`` whose content kbtrace wrote (``kbtrace-output v1
   kind=run``), not merely a file name anyone may have (a folder holding a Perfetto
   ``trace.json`` is not a trace). A directory output may replace nothing but an earlier
   output of the same kind, an empty directory or nothing; a trace never replaces a run.
2. **Inputs.** An output may not be, contain or lie inside an input of the same command
   (``replay RUN/tr -o RUN``, ``export perfetto RUN -o RUN/run.json``, ``report -o RUN``).
   Each command names its inputs; comparisons are on resolved paths, so a symlink or a
   ``..`` does not hide an input, and a hard link to an input counts as that input.
3. **Single files.** A file output never replaces a symbolic link, a directory, a device
   node, a FIFO or a socket (it is refused, not followed).

Every refusal is an ``OutputError``: one line naming the path, why, and what to do.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from kbtrace.errors import OutputError

__all__ = ["MARKER", "KINDS", "marker_text", "owner", "write_marker", "check_dir_output",
           "check_file_output", "check_inputs", "input_paths"]

#: the ownership marker's file name, inside every directory kbtrace writes
MARKER = ".kbtrace"
#: kinds of kbtrace output directories
KINDS = ("trace", "run", "report", "sweep", "baseline", "study", "attribution", "calibration")
_MARKER_MAX_BYTES = 64
_MARKER_RE = re.compile(r"\Akbtrace-output v1 kind=([a-z]+)\n\Z")


def marker_text(kind: str) -> str:
    """The marker's whole content for a ``kind`` directory."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    return f"kbtrace-output v1 kind={kind}\n"


def write_marker(directory: Path, kind: str) -> None:
    """Mark ``directory`` as a kbtrace ``kind`` output."""
    (directory / MARKER).write_text(marker_text(kind))


def owner(directory: str | os.PathLike[str]) -> str | None:
    """The kind of kbtrace output ``directory`` is (its marker's kind), or None when it
    carries no valid marker (a symlinked, oversized or foreign ``.kbtrace`` is no marker)."""
    m = Path(directory) / MARKER
    try:
        st = os.lstat(m)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MARKER_MAX_BYTES:
            return None
        match = _MARKER_RE.match(m.read_text(encoding="ascii"))
    except (OSError, UnicodeDecodeError):
        return None
    return match.group(1) if match and match.group(1) in KINDS else None


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def input_paths(paths: Iterable[str | os.PathLike[str] | None]) -> tuple[Path, ...]:
    """Resolved input paths (None and missing entries dropped), for ``check_inputs``."""
    out = []
    for p in paths:
        if p is None:
            continue
        try:
            out.append(Path(p).resolve())
        except OSError:
            continue
    return tuple(out)


def check_inputs(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str] | None],
                 *, directory: bool) -> None:
    """Refuse an output that is, contains (a ``directory`` output) or lies inside one of
    ``inputs`` (files or directories the same command reads)."""
    o = Path(out)
    res = o.resolve()
    for inp in input_paths(inputs):
        same = res == inp
        if not same and res.exists() and inp.exists():
            try:
                same = os.path.samefile(res, inp)
            except OSError:
                same = False
        if same:
            raise OutputError(f"{o}: is an input of this command ({inp}); writing there would "
                              f"destroy it; choose another output path (-o)")
        if directory and inp.is_relative_to(res):
            raise OutputError(f"{o}: contains {inp}, an input of this command, which the "
                              f"output would replace; choose another output directory (-o)")
        if inp.is_dir() and res.is_relative_to(inp):
            raise OutputError(f"{o}: lies inside {inp}, an input of this command; write "
                              f"outputs beside inputs, not into them (choose another -o)")


def _existing(p: Path, what: str) -> os.stat_result | None:
    """``p``'s own status (None when absent or unreadable: the write itself reports that);
    a symbolic link is refused, never followed."""
    try:
        st = os.lstat(p)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{p}: is a symbolic link, which kbtrace does not replace or "
                          f"follow; give the real {what} or another output path (-o)")
    return st


def check_file_output(path: str | os.PathLike[str],
                      inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """A single-file output may replace only a regular file that is not an input."""
    p = Path(path)
    st = _existing(p, "path")
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"cannot write {p}: it is a directory; give a file path (-o)")
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{p}: is a {_file_kind(st.st_mode)}, not a regular file; "
                              f"kbtrace writes only regular files; choose another output path (-o)")
    check_inputs(p, inputs, directory=False)


def check_dir_output(path: str | os.PathLike[str], kind: str,
                     inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
    """Refuse to write a ``kind`` directory at ``path`` over anything but an earlier
    ``kind`` output (``owner(path) == kind``) or an empty directory; see module doc."""
    p = Path(path)
    st = _existing(p, "directory")
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise OutputError(f"{p}: exists and is a {_file_kind(st.st_mode)}, not a "
                              f"directory; choose another output directory (-o)")
        found = owner(p)
        if found is not None and found != kind:
            raise OutputError(f"{p}: is a kbtrace {found} directory, not a {kind}; kbtrace "
                              f"does not replace one kind of output with another; choose "
                              f"another output directory (-o)")
        if found is None and _non_empty(p):
            raise OutputError(f"{p}: exists and was not written by kbtrace (no kbtrace "
                              f"marker {MARKER}), and kbtrace replaces only its own outputs; "
                              f"choose another output directory (-o) or empty it")
    check_inputs(p, inputs, directory=True)


def _non_empty(p: Path) -> bool:
    try:
        with os.scandir(p) as it:
            return any(True for _ in it)
    except OSError:
        return True

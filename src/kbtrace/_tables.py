"""Tables as every command prints them: ``--format`` text (aligned columns), csv, md, json.

One renderer for every table kbtrace prints (``kbtrace sql``, ``verify``, ``diff``,
``sweep``, ``topo route``, the report's markdown), so the formats mean the same everywhere:
text right-aligns numbers, md escapes ``|`` and line breaks, json is an array of row
objects (NaN and infinities as null). polars only in annotations: every command imports
this module to build its parser.
"""

from __future__ import annotations

import argparse
import io
import json
import math
from typing import TYPE_CHECKING

from kbtrace.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

__all__ = ["TABLE_FORMATS", "add_format", "add_json_alias", "render", "render_strings",
           "md_cell", "deprecated_json"]

#: how every command that prints a table can print it (``--format``)
TABLE_FORMATS = ("text", "csv", "md", "json")
_ALIASES = {"table": "text"}          # the name ``kbtrace sql`` used before ``text``


def _format(value: str) -> str:
    return _ALIASES.get(value, value)


def add_format(p: argparse.ArgumentParser, formats: tuple[str, ...] = TABLE_FORMATS,
               what: str = "the table") -> None:
    """The ``--format/-f`` option of every command that prints a table (default text)."""
    p.add_argument("--format", "-f", choices=formats, default="text", type=_format,
                   help=f"how to print {what}: {', '.join(formats)} (default text)")


class _JsonAlias(argparse.Action):
    """``--json``, the spelling ``kbtrace list`` and ``probe`` had before ``--format``: sets
    ``--format json`` and marks the namespace (``deprecated_json``)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="deprecated: --format json")

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        ns.format = "json"
        ns.deprecated_json = True


def add_json_alias(p: argparse.ArgumentParser) -> None:
    """``--json`` as a deprecated alias of ``--format json`` (after ``add_format``)."""
    p.add_argument("--json", action=_JsonAlias, dest="deprecated_json", default=False)


def deprecated_json(args: argparse.Namespace) -> None:
    """The note a command gives when ``--json`` was used (once, through logging)."""
    if getattr(args, "deprecated_json", False):
        from kbtrace._progress import NOTE, log
        log.warning("--json is deprecated and will go; use --format json", extra=NOTE)


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _json_value(v: object) -> object:
    """NaN and infinities are no JSON numbers: null (as the CSV leaves them empty)."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def md_cell(text: str) -> str:
    """A Markdown table cell: ``|`` escaped, line breaks as ``<br>`` (either would end the
    cell or the row)."""
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>")
            .replace("\n", "<br>"))


def render(df: pl.DataFrame, fmt: str) -> str:
    """Text rendering of a frame: 'text' (aligned columns; 'table' is the same), 'csv',
    'md' (cells escaped by ``md_cell``) or 'json' (an array of row objects)."""
    fmt = _format(fmt)
    if fmt == "csv":
        buf = io.StringIO()
        df.write_csv(buf)
        return buf.getvalue()
    if fmt == "json":
        rows_js = [{k: _json_value(v) for k, v in r.items()} for r in df.to_dicts()]
        return json.dumps(rows_js, indent=1, default=str) + "\n"
    if fmt not in ("md", "text"):
        raise UsageError(f"unknown format {fmt!r}; use one of {', '.join(TABLE_FORMATS)}")
    return _lines(list(df.columns), [[_cell(v) for v in r] for r in df.iter_rows()],
                  [df.dtypes[i].is_numeric() for i in range(df.width)], fmt)


def _lines(head: list[str], rows: list[list[str]], num: list[bool], fmt: str) -> str:
    """'md' or 'text' (numeric columns, ``num``, right-aligned) of cells already rendered."""
    if fmt == "md":
        out = ["| " + " | ".join(md_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
        return "\n".join(out) + "\n"
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w)
                         for c, w, n in zip(cells, widths, num, strict=True)).rstrip()
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out) + "\n"


def render_strings(cols: dict[str, list[str]], fmt: str) -> str:
    """``render`` of a table of string columns: text and md without importing polars (a
    command that has none loaded, e.g. ``kbtrace sweep``, skips its ~0.1 s import); csv and
    json through ``render``."""
    if _format(fmt) not in ("md", "text"):
        import polars as pl
        return render(pl.DataFrame(cols, schema={k: pl.String for k in cols}), fmt)
    head = list(cols)
    rows = [list(r) for r in zip(*cols.values(), strict=True)]
    return _lines(head, rows, [False] * len(head), _format(fmt))



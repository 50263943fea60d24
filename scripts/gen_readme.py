"""Regenerate the generated sections of README.md from the code and docs/.

README.md is the user's manual. Parts of it have a single source elsewhere
and are copied in between markers:

* ``<!-- BEGIN:include docs/<stage>.md -->`` … ``<!-- END:include docs/<stage>.md -->``:
  a stage's manual page (headings demoted one level);
* ``<!-- BEGIN:schemas -->`` … ``<!-- END:schemas -->``: every table of
  ``kbtrace.schema``;
* ``<!-- BEGIN:cli-help -->`` … ``<!-- END:cli-help -->``: ``kbtrace --help``;
* ``<!-- BEGIN:contents -->`` … ``<!-- END:contents -->``: the README's ``##`` and ``###``
  headings (after the other blocks are filled in) as links, with GitHub's anchors.

``tests/test_readme.py`` fails when README.md is stale; run
``python scripts/gen_readme.py`` to refresh it. It first refreshes the SQL view catalogue
of docs/analysis.md (``<!-- catalogue:begin -->`` … ``<!-- catalogue:end -->``, from the
``.sql`` headers; ``tests/test_analysis_sql.py`` checks it), so the README copy is current too.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"(<!-- BEGIN:(?P<name>[^>]+?) -->\n).*?(<!-- END:(?P=name) -->)", re.S)
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")     # a Markdown link: its text kept


def _schemas() -> str:
    from kbtrace import schema

    parts = []
    for name, sch in schema.TABLES.items():
        doc = (sch.metadata or {}).get(b"doc", b"").decode()
        parts.append(f"#### `{name}`\n\n{doc}\n\n{schema.schema_markdown(sch)}\n")
    return "\n".join(parts)


def _cli_help() -> str:
    from kbtrace.cli import build_parser

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        build_parser().print_help()
    text = re.sub(r"^usage: \S+", "usage: kbtrace", buf.getvalue())
    return f"```\n{text.rstrip()}\n```\n"


def _include(rel: str) -> str:
    text = (ROOT / rel).read_text()
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        out.append("#" + line if (line.startswith("#") and not fenced) else line)
    return "\n".join(out).rstrip() + "\n"


def _anchor(title: str, seen: dict[str, int]) -> str:
    """GitHub's heading anchor: markup dropped, lower case, punctuation but ``-`` and ``_``
    dropped, spaces to ``-``; the n-th repeat of an anchor gets ``-n``."""
    text = _LINK.sub(r"\1", title).replace("`", "").lower()
    slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
    n = seen.get(slug, 0)
    seen[slug] = n + 1
    return slug if n == 0 else f"{slug}-{n}"


def _contents(text: str) -> str:
    """Links to the ``##`` sections, their ``###`` subsections nested, from ``text``."""
    out, seen, fenced = [], {}, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"(#{1,6}) (.+?)\s*$", line)
        if m is None:
            continue
        level, title = len(m.group(1)), m.group(2)
        slug = _anchor(title, seen)
        if level in (2, 3) and title != "Contents":
            label = _LINK.sub(r"\1", title)
            out.append(f"{'  ' * (level - 2)}- [{label}](#{slug})")
    return "\n".join(out) + "\n"


def block(name: str) -> str:
    if name == "schemas":
        return _schemas()
    if name == "cli-help":
        return _cli_help()
    if name.startswith("include "):
        return _include(name.split(" ", 1)[1])
    raise SystemExit(f"README.md: unknown generated block {name!r}")


def render(text: str) -> str:
    """``text`` with every block filled in; the contents last, from the filled text."""
    def fill(m: re.Match[str], toc: str | None = None) -> str:
        name = m.group("name")
        if name == "contents":
            return m.group(0) if toc is None else m.group(1) + toc + m.group(3)
        return m.group(1) + block(name) + m.group(3) if toc is None else m.group(0)

    filled = _BLOCK.sub(fill, text)
    toc = _contents(filled)
    return _BLOCK.sub(lambda m: fill(m, toc), filled)


def _catalogue(check: bool) -> bool:
    """Refresh the SQL view catalogue in docs/analysis.md; True if it was current."""
    from kbtrace.analysis.sqllib import catalogue_markdown

    doc = ROOT / "docs" / "analysis.md"
    text = doc.read_text()
    head, rest = text.split("<!-- catalogue:begin -->\n", 1)
    _, tail = rest.split("<!-- catalogue:end -->", 1)
    new = f"{head}<!-- catalogue:begin -->\n{catalogue_markdown()}<!-- catalogue:end -->{tail}"
    if new != text and not check:
        doc.write_text(new)
    return new == text


def main() -> int:
    current = _catalogue("--check" in sys.argv)
    readme = ROOT / "README.md"
    old = readme.read_text()
    new = render(old)
    if "--check" in sys.argv:
        if new != old or not current:
            print("README.md is stale; run: python scripts/gen_readme.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())

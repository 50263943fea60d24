"""The one way kbtrace reads YAML a user wrote (topologies, sweep configs, ``--set`` values).

On top of ``yaml.safe_load`` it enforces, before anything is built from the document:

* **bounded input**: a file is read through ``read_text``: at most ``MAX_YAML_BYTES``
  (``topo show /dev/zero`` stops there instead of reading for ever), decoded as UTF-8 (a
  binary or Latin-1 file is one error naming the byte offset, line and column);
* **bounded structure**: at most ``MAX_DEPTH`` levels of nesting and ``MAX_NODES`` nodes
  *after alias expansion* (a 300-byte file of nested ``*aliases`` would otherwise expand
  to millions of values and a message the size of the expansion);
* **unique keys**: a mapping that repeats a key is an error (PyYAML keeps the last one);
* **YAML 1.2 numbers**: ``1e3`` and ``-2E-5`` are floats, as in YAML 1.2 and JSON (PyYAML,
  a YAML 1.1 parser, reads them as strings).

Every refusal is a ``YamlProblem`` whose ``message()`` is one line (callers put the file in
front and raise their own ``KbtraceError`` subclass).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["YamlProblem", "DuplicateKey", "load_unique", "read_text", "problem",
           "MAX_YAML_BYTES", "MAX_DEPTH", "MAX_NODES"]

_MERGE_TAG = "tag:yaml.org,2002:merge"
#: largest YAML file read (the bundled topologies are ~1-3 KB, sweep configs smaller)
MAX_YAML_BYTES = 1 << 20
#: deepest nesting of mappings / lists (topologies nest 4 levels)
MAX_DEPTH = 32
#: most nodes of a document with every alias expanded
MAX_NODES = 100_000


class YamlProblem(Exception):
    """A YAML document kbtrace refuses; ``message()`` says why and how to fix it."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def message(self) -> str:
        return self.text


class DuplicateKey(YamlProblem):
    """A mapping repeats a key: its YAML path and the positions of both occurrences."""

    def __init__(self, path: str, mark: yaml.Mark, first: yaml.Mark) -> None:
        self.path = path
        if mark.line == first.line:  # a flow mapping on one line: the columns tell them apart
            self.at = f"line {mark.line + 1}, column {mark.column + 1}"
            self.first = f"column {first.column + 1}"
        else:
            self.at, self.first = f"line {mark.line + 1}", f"line {first.line + 1}"
        super().__init__(f"{self.path}: duplicate key at {self.at} (first set at {self.first}); "
                         "keep only one of them")


def problem(exc: yaml.YAMLError) -> str:
    """The short reason of a YAML error (no multi-line context)."""
    return getattr(exc, "problem", None) or str(exc).splitlines()[0]


def read_text(path: str | os.PathLike[str], limit: int = MAX_YAML_BYTES) -> str:
    """A YAML file's text: ``OSError`` as ``open`` raises it (callers word "no such file"
    themselves); a file over ``limit`` bytes (or an endless device) or one that is not
    UTF-8 is a ``YamlProblem``."""
    with open(Path(path), "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise YamlProblem(f"larger than {limit >> 10} KiB (or not a regular file); a YAML "
                          "config is a few KB: check that the path names the right file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise YamlProblem(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}, "
                          f"column {col}); save the file as UTF-8 (a binary file is not a "
                          "YAML config)") from None


class _Loader(yaml.SafeLoader):
    """SafeLoader reading YAML 1.2 exponent floats without a dot (``1e3``) as numbers."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _check(node: yaml.Node, path: str, depth: int, sizes: dict[int, int]) -> int:
    """Walk the composed node tree (each distinct node once): raise ``DuplicateKey`` for
    the first mapping that repeats a key and ``YamlProblem`` past ``MAX_DEPTH``; return the
    node's size with aliases expanded (``sizes`` memoises shared nodes)."""
    got = sizes.get(id(node))
    if got is not None:
        return got
    if depth > MAX_DEPTH:
        raise YamlProblem(f"{path or 'top level'}: nested more than {MAX_DEPTH} levels deep "
                          f"(line {node.start_mark.line + 1}); flatten the document")
    sizes[id(node)] = 1         # a recursive alias (&a [*a]) counts once, then stops
    size = 1
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], yaml.Mark] = {}
        for k, v in node.value:
            label = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            sub = f"{path}.{label}" if path else label
            if isinstance(k, yaml.ScalarNode) and k.tag != _MERGE_TAG:
                ident = (k.tag, k.value)
                if ident in first:
                    raise DuplicateKey(sub, k.start_mark, first[ident])
                first[ident] = k.start_mark
            size += _check(k, sub, depth + 1, sizes) + _check(v, sub, depth + 1, sizes)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            size += _check(v, f"{path}[{i}]", depth + 1, sizes)
    if size > MAX_NODES:
        raise YamlProblem(f"{path or 'top level'}: expands to more than {MAX_NODES:,} values "
                          f"(aliases *name repeat what &name holds); write the values out or "
                          "use fewer aliases")
    sizes[id(node)] = size
    return size


def load_unique(text: str) -> Any:
    """Parse one YAML document (see the module docstring); ``yaml.YAMLError`` for malformed
    text, ``YamlProblem`` (``DuplicateKey``) for a document kbtrace refuses."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlProblem(f"nested more than {MAX_DEPTH} levels deep; flatten the "
                              "document") from None
        if node is None:
            return None
        _check(node, "", 0, {})
        return loader.construct_document(node)
    finally:
        loader.dispose()

"""YAML loading that refuses repeated mapping keys (PyYAML keeps the last one silently).

Used for every YAML file a user writes (topologies, sweep configs) and ``--set`` values:
a key given twice is almost always an edit that forgot the first one.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["DuplicateKey", "load_unique", "problem"]

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(Exception):
    """A mapping repeats a key: its YAML path and the positions of both occurrences."""

    def __init__(self, path: str, mark: yaml.Mark, first: yaml.Mark) -> None:
        super().__init__(path)
        self.path = path
        if mark.line == first.line:  # a flow mapping on one line: the columns tell them apart
            self.at = f"line {mark.line + 1}, column {mark.column + 1}"
            self.first = f"column {first.column + 1}"
        else:
            self.at, self.first = f"line {mark.line + 1}", f"line {first.line + 1}"

    def message(self) -> str:
        """What is wrong and how to fix it (callers put the file in front)."""
        return (f"{self.path}: duplicate key at {self.at} (first set at {self.first}); keep "
                "only one of them")


def problem(exc: yaml.YAMLError) -> str:
    """The short reason of a YAML error (no multi-line context)."""
    return getattr(exc, "problem", None) or str(exc).splitlines()[0]


def _check_unique(node: yaml.Node, path: str, seen: set[int]) -> None:
    """Raise ``DuplicateKey`` for the first mapping (in document order) that repeats a key.

    Runs on the composed node tree (aliases are visited once), before construction, so it
    costs a walk over the nodes: YAML's own load keeps the last of two equal keys silently."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], yaml.Mark] = {}
        for k, v in node.value:
            if k.tag == _MERGE_TAG:
                continue
            label = str(k.value) if isinstance(k, yaml.ScalarNode) else "?"
            sub = f"{path}.{label}" if path else label
            if isinstance(k, yaml.ScalarNode):
                ident = (k.tag, k.value)
                if ident in first:
                    raise DuplicateKey(sub, k.start_mark, first[ident])
                first[ident] = k.start_mark
            _check_unique(v, sub, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _check_unique(v, f"{path}[{i}]", seen)


def load_unique(text: str) -> Any:
    """``yaml.safe_load`` that raises ``DuplicateKey`` instead of keeping the last of two
    equal mapping keys (same parser and constructor, so same values and YAML errors)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_unique(node, "", set())
        return loader.construct_document(node)
    finally:
        loader.dispose()

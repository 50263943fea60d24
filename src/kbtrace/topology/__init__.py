"""Topology stage: hardware YAML -> validated, compiled, frozen ``Topology``.

Role: the single description of the hardware every other stage reads.
Inputs: ``topologies/<hw>.yaml`` (+ dotted-key overrides, e.g.
``{"cube.mesh.link_bw_gbps": 128}``). Outputs: a ``Topology`` (nodes, directed
links, deterministic cached routes with analytical lower bounds, physical
address resolution) and the Arrow ``nodes``/``links`` tables (``schema.NODES``
/ ``schema.LINKS``).

Phases of ``compile_topology``: read -> override -> validate (``_spec``, every
user error is a one-line ``TopologyError``) -> build graph (``_build``) ->
freeze; the result is cached on disk by content hash. Routing (``_route``) is
XY in cube meshes, explicit UCIe crossings between cubes, IO-chiplet and
tray-switch paths; addresses (``address``) follow ADR-0001 rev 2 (51 bits).
"""

from __future__ import annotations

from kbtrace.topology import address
from kbtrace.topology._build import PE_COMPONENTS
from kbtrace.topology.model import Link, Node, PeCoord, Route
from kbtrace.topology.params import TopologyParams, iter_params
from kbtrace.topology.topology import CACHE_STATS, Topology, cache_dir, compile_topology

__all__ = [
    "compile_topology", "Topology", "TopologyParams", "Node", "Link", "PeCoord", "Route",
    "PE_COMPONENTS", "CACHE_STATS", "cache_dir", "address", "iter_params",
    "yaml_reference_markdown",
]


def yaml_reference_markdown() -> str:
    """The topology YAML reference (every key, default, unit, meaning) as a markdown table."""
    lines = ["| YAML key (= `--set` key) | default | unit | meaning |", "|---|---|---|---|"]
    for path, default, unit, doc in iter_params():
        if isinstance(default, tuple) and default and not isinstance(default[0], (int, tuple)):
            shown = f"{len(default)} entry" + ("" if len(default) == 1 else "s")
        elif isinstance(default, tuple):
            shown = str([list(x) if isinstance(x, tuple) else x for x in default]).replace(" ", "")
        else:
            shown = str(default)
        lines.append(f"| `{path}` | `{shown}` | {unit} | {doc} |")
    return "\n".join(lines)

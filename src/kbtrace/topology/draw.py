"""PNG drawings of a compiled topology (matplotlib, Agg backend).

``draw_sip``: the cube grid of one SIP with UCIe seams and the IO chiplet(s)
with their links to shoreline cubes. ``draw_cube``: one cube's router mesh with
the HBM zone, PEs, HBM controller slices, SRAM, M_CPU and the UCIe ports.
Both are derived only from the compiled nodes/links (ADR-0006 D3).
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from kbtrace._io import atomic_path  # noqa: E402
from kbtrace.errors import TopologyError  # noqa: E402
from kbtrace.topology.topology import Topology  # noqa: E402

__all__ = ["draw_sip", "draw_cube"]

_META = {"Software": None}   # no matplotlib version in the PNG: byte-stable output


def _save(fig: plt.Figure, path: Path, source: str | None = None) -> Path:
    with atomic_path(path, (source,)) as tmp:
        fig.savefig(tmp, format="png", dpi=110, metadata=_META)
    plt.close(fig)
    return path


def draw_sip(topo: Topology, out_dir: str | os.PathLike[str], sip: int = 0) -> Path:
    """Draw SIP ``sip``: cubes, UCIe seams, IO chiplets; returns the PNG path."""
    if not 0 <= sip < topo.n_sips:
        raise TopologyError(f"--sip {sip}: topology has SIPs 0..{topo.n_sips - 1}")
    p = topo.params
    w, pitch = p.sip.cube_mesh_w, p.sip.cube_pitch_mm
    size = pitch * 0.7
    fig, ax = plt.subplots(figsize=(2 + 1.6 * w, 2 + 1.6 * p.sip.cube_mesh_h))
    for c in range(topo.cubes_per_sip):
        x, y = (c % w) * pitch, (c // w) * pitch
        ax.add_patch(Rectangle((x - size / 2, y - size / 2), size, size, fc="#dfe9f5", ec="#2b4c7e"))
        ax.text(x, y, f"cube{c}\n{topo.pes_per_cube} PEs", ha="center", va="center", fontsize=8)
    nodes = topo.nodes
    for ln in topo.links:
        a, b = nodes[ln.src], nodes[ln.dst]
        if a.sip != sip or ln.src > ln.dst:
            continue
        if ln.kind == "ucie_mesh":
            xs, ys = _cube_xy(topo, a.cube, b.cube)
            dx, dy = (size / 2 if xs[1] > xs[0] else 0.0), (size / 2 if ys[1] > ys[0] else 0.0)
            ax.plot([xs[0] + dx, xs[1] - dx], [ys[0] + dy, ys[1] - dy], color="#c0392b", lw=4)
        elif ln.kind == "io_to_cube":
            io, cube = (a, b) if a.kind == "io_ucie" else (b, a)
            assert cube.cube is not None
            cx, cy = (cube.cube % w) * pitch, (cube.cube // w) * pitch
            ex, ey = cube.x_mm - (p.cube.mesh.cols - 1) * p.cube.mesh.pitch_mm / 2, \
                cube.y_mm - (p.cube.mesh.rows - 1) * p.cube.mesh.pitch_mm / 2
            norm = max(abs(ex), abs(ey)) or 1.0
            ax.plot([cx + ex / norm * pitch * 0.5, cx + ex / norm * size / 2],
                    [cy + ey / norm * pitch * 0.5, cy + ey / norm * size / 2],
                    color="#8e44ad", lw=2, ls="--")
    for i, io in enumerate(p.sip.io_chiplets):
        n = topo.nodes[topo._g.io_noc[(sip, i)]]
        shore = topo._g.io_shore[i]
        xs = [(c % w) * pitch for c in shore]
        ys = [(c // w) * pitch for c in shore]
        if io.side in "WE":
            x0, x1, y0, y1 = n.x_mm - size / 3, n.x_mm + size / 3, min(ys) - size / 2, max(ys) + size / 2
        else:
            x0, x1, y0, y1 = min(xs) - size / 2, max(xs) + size / 2, n.y_mm - size / 3, n.y_mm + size / 3
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fc="#efe3f7", ec="#8e44ad"))
        io_id = n.id.split(".")[1]
        ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"{io_id}\nPCIe EP\nio_noc\nIO_CPU", ha="center",
                va="center", fontsize=7)
    ax.plot([], [], color="#c0392b", lw=3, label=f"UCIe seam ({p.sip.ucie.connections} x "
                                                   f"{p.sip.ucie.conn_bw_gbps:g} GB/s)")
    ax.plot([], [], color="#8e44ad", ls="--", label="IO chiplet UCIe")
    ax.legend(loc="upper right", fontsize=7, bbox_to_anchor=(1.0, 1.12))
    ax.set_title(f"{p.name}: sip{sip} ({topo.cubes_per_sip} cubes, {topo.n_io_chiplets} IO chiplet(s))",
                 fontsize=10)
    ax.set_aspect("equal")
    ax.invert_yaxis()
    ax.axis("off")
    ax.autoscale_view()
    return _save(fig, Path(out_dir) / f"sip_view__{p.name}.png", topo.source)


def _cube_xy(topo: Topology, a: int | None, b: int | None) -> tuple[list[float], list[float]]:
    w, pitch = topo.params.sip.cube_mesh_w, topo.params.sip.cube_pitch_mm
    assert a is not None and b is not None
    return [(a % w) * pitch, (b % w) * pitch], [(a // w) * pitch, (b // w) * pitch]


_STYLE = {
    "router": ("s", "#2b4c7e", 60), "hbm_ctrl": ("D", "#d35400", 45), "sram": ("o", "#16a085", 140),
    "m_cpu": ("o", "#8e44ad", 140), "ucie": ("h", "#c0392b", 220), "ucie_conn": (".", "#c0392b", 40),
    "dma": ("^", "#27ae60", 40),
}


def draw_cube(topo: Topology, out_dir: str | os.PathLike[str], sip: int = 0, cube: int = 0) -> Path:
    """Draw one cube's router mesh and attachments; returns the PNG path."""
    if not (0 <= sip < topo.n_sips and 0 <= cube < topo.cubes_per_sip):
        raise TopologyError(f"--sip {sip} --cube {cube}: topology has SIPs 0..{topo.n_sips - 1}, "
                            f"cubes 0..{topo.cubes_per_sip - 1}")
    p = topo.params
    mesh = p.cube.mesh
    pitch = mesh.pitch_mm
    fig, ax = plt.subplots(figsize=(8, 8))
    zone = mesh.hbm_zone
    if zone:
        r0, r1 = min(z[0] for z in zone), max(z[0] for z in zone)
        c0, c1 = min(z[1] for z in zone), max(z[1] for z in zone)
        ax.add_patch(Rectangle(((c0 - 0.4) * pitch, (r0 - 0.4) * pitch), (c1 - c0 + 0.8) * pitch,
                               (r1 - r0 + 0.8) * pitch, fc="#fdebd0", ec="#d35400", ls="--"))
        ax.text((c0 + c1) / 2 * pitch, (r0 + r1) / 2 * pitch, "HBM zone", ha="center", va="center")
    nodes = [n for n in topo.nodes if n.sip == sip and n.cube == cube]
    idxs = {n.idx for n in nodes}
    for ln in topo.links:
        if ln.src in idxs and ln.dst in idxs and ln.src < ln.dst and ln.kind != "pe_internal":
            a, b = topo.nodes[ln.src], topo.nodes[ln.dst]
            lw = 2.0 if ln.kind == "router_mesh" else 0.8
            ax.plot([a.x_mm, b.x_mm], [a.y_mm, b.y_mm], color="#7f8c8d", lw=lw, zorder=1)
    for n in nodes:
        if n.kind in _STYLE:
            marker, color, size = _STYLE[n.kind]
            ax.scatter([n.x_mm], [n.y_mm], marker=marker, c=color, s=size, zorder=3)
        if n.kind == "router":
            ax.text(n.x_mm, n.y_mm - 0.25 * pitch, n.id.rsplit(".", 1)[1], ha="center", fontsize=6)
        elif n.kind in ("sram", "m_cpu", "ucie"):
            ax.text(n.x_mm, n.y_mm + 0.3 * pitch, n.id.rsplit(".", 1)[1].upper(), ha="center", fontsize=7)
        elif n.kind == "dma":
            ax.text(n.x_mm, n.y_mm + 0.25 * pitch, f"PE{n.pe}", ha="center", fontsize=7, color="#1e8449")
        elif n.kind == "hbm_ctrl":
            ax.text(n.x_mm, n.y_mm + 0.22 * pitch, f"hbm.pe{n.pe}", ha="center", fontsize=6, color="#a04000")
    ax.set_title(f"{p.name}: sip{sip}.cube{cube} - {mesh.rows}x{mesh.cols} router mesh, "
                 f"{topo.pes_per_cube} PEs (DMA ▲, HBM slice ◆), SRAM, M_CPU, UCIe N/S/E/W", fontsize=9)
    ax.set_aspect("equal")
    ax.invert_yaxis()
    ax.axis("off")
    return _save(fig, Path(out_dir) / f"cube_view__{p.name}.png", topo.source)

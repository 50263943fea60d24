"""What both fidelity modes share: ``Transfer`` (one payload movement) and the ``Fabric`` base
(routes, per-link / per-node constants, control messages). Bare events (``after``) are in
``events``."""

from __future__ import annotations

from typing import Any

import simpy

from kbtrace.replay.hbm import HbmController
from kbtrace.replay.recorder import Recorder

__all__ = ["Fabric", "Transfer"]


class Transfer:
    """One payload movement (per-transfer state; hop timestamps per path position)."""
    __slots__ = ("op_id", "tile", "nodes", "links", "nbytes", "n", "addr", "hbm", "done",
                 "enter", "queue", "leave", "got", "last", "hput", "fab")

    def __init__(self, fab: Fabric, op_id: int, tile: int, nodes: tuple[int, ...],
                 links: tuple[int, ...], nbytes: int, addr: int, hbm: HbmController | None) -> None:
        self.fab = fab
        self.op_id = op_id
        self.tile = tile
        self.nodes = nodes
        self.links = links
        self.nbytes = nbytes
        self.n = max(1, -(-nbytes // fab.flit_bytes))
        self.addr = addr
        self.hbm = hbm
        self.done = fab.env.event()
        L = len(links)
        self.enter = [0.0] * (L + 1)
        self.queue = [0.0] * (L + 1)
        self.leave = [0.0] * L
        self.got = 0
        self.last = 0.0
        self.hput = 0.0

    def finish(self, t: float) -> None:
        fab = self.fab
        rec = fab.rec
        op, tile, nb = self.op_id, self.tile, self.nbytes
        nodes, links = self.nodes, self.links
        for j, li in enumerate(links):
            bw = fab.link_bw[li]
            rec.hop(op, tile, fab.link_stage[li], nodes[j], li, self.enter[j], self.leave[j],
                    nb / bw if bw > 0 else 0.0, self.queue[j], nb)
        dst = nodes[-1]
        hbm = self.hbm
        busy = nb / (hbm.bw * hbm.n_pcs) if hbm is not None else 0.0
        rec.hop(op, tile, fab.term_stage[dst], dst, -1, self.enter[-1], t, busy,
                self.queue[-1], nb)
        self.done.succeed(t)


class Fabric:
    """Shared part of both modes: routes, per-link/per-node constants, control messages."""

    fidelity = "?"
    ROUTES_MAX = 1 << 14   # cached (source, destination) pairs; emptied when full

    def __init__(self, env: simpy.Environment, topo: Any, rec: Recorder,
                 hbm: dict[int, HbmController]) -> None:
        self.env = env
        self.topo = topo
        self.rec = rec
        self.hbm = hbm
        self.flit_bytes = int(topo.params.cube.hbm.burst_bytes)
        self.link_bw = [float(lk.bw_gbps) for lk in topo.links]
        self.link_prop = [float(lk.latency_ns) for lk in topo.links]
        self.link_stage = ["pcie" if lk.kind == "pcie" else "fabric" for lk in topo.links]
        self.node_ov = [float(nd.overhead_ns) for nd in topo.nodes]
        kinds = self.node_kind = [nd.kind for nd in topo.nodes]
        self.term_stage = ["hbm" if k == "hbm_ctrl" else "sram" if k == "sram"
                           else "pcie" if k in ("host", "pcie_ep") else "fabric" for k in kinds]
        self._routes: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._cmd: dict[tuple[int, int], float] = {}

    def route(self, src: int, dst: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            if len(self._routes) >= self.ROUTES_MAX:
                self._routes.clear()
            rt = self.topo.route(src, dst)
            r = self._routes[key] = (tuple(rt.nodes), tuple(rt.links))
        return r

    def command_ns(self, src: int, dst: int) -> float:
        """Latency of a control message: propagation + overheads of every node but the source."""
        key = (src, dst)
        lat = self._cmd.get(key)
        if lat is None:
            nodes, links = self.route(src, dst)
            lat = sum(self.link_prop[li] for li in links) + sum(self.node_ov[n] for n in nodes[1:])
            if len(self._cmd) >= self.ROUTES_MAX:
                self._cmd.clear()
            self._cmd[key] = lat
        return lat

    def command(self, op_id: int, tile: int, src: int, dst: int) -> simpy.Event:
        lat = self.command_ns(src, dst)
        now = self.env.now
        self.rec.hop(op_id, tile, "fabric", src, -1, now, now + lat, 0.0, 0.0, 0)
        return self.env.timeout(lat)

    def send(self, op_id: int, tile: int, src: int, dst: int, nbytes: int, addr: int = 0,
             ready: list[float] | None = None, **fast: Any) -> simpy.Event:
        """Move ``nbytes`` from node ``src`` to node ``dst``; flits ready now or at ``ready``.
        ``fast``: what only fast mode's send takes (``span``, ``shape``, ``group``, ``at``,
        ``ack``); the engine passes them to the fast fabric only."""
        nodes, links = self.route(src, dst)
        x = Transfer(self, op_id, tile, nodes, links, nbytes, addr, self.hbm.get(dst))
        if not links:
            t = max(ready) if ready else self.env.now
            x.enter[0] = self.env.now
            self.env.timeout(t - self.env.now).callbacks.append(lambda _e: x.finish(t))
            return x.done
        self._start(x, ready)
        return x.done

    def _start(self, x: Transfer, ready: list[float] | None) -> None:  # pragma: no cover
        raise NotImplementedError


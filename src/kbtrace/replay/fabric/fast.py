"""Fast mode: closed-form wormhole timing per transfer, booked in stretches (``FastFabric``).
Routes, their free-path closed forms and the walk along them are in ``routes`` (``_Route``,
``_Plan``, ``book_route``); the reservation arithmetic is in ``booking``."""

from __future__ import annotations

from typing import Any

import simpy

from kbtrace.replay.fabric.base import Fabric
from kbtrace.replay.fabric.bodies import router_inputs
from kbtrace.replay.fabric.booking import Spans, Steps, serve
from kbtrace.replay.fabric.events import _Ev
from kbtrace.replay.fabric.fair import Flow, expand
from kbtrace.replay.fabric.heads import commit_later, head_at, relink
from kbtrace.replay.fabric.ledger import FabState, Recs, Slots
from kbtrace.replay.fabric.pull import pull_behind
from kbtrace.replay.fabric.routes import _Plan, _Route, complete, hop_seq, send
from kbtrace.replay.hbm import Bursts, HbmController
from kbtrace.replay.recorder import STAGE_CODE, Recorder

__all__ = ["FastFabric", "_Route", "_Plan"]


class FastFabric(Fabric, FabState):
    """Closed-form wormhole timing per transfer with per-link / per-node reservations.

    Each node keeps its future busy intervals for its per-transaction overhead (``node_iv``,
    a ``booking.Spans``: ``[s0, e0, s1, e1, ...]``), each link its booked bandwidth share as
    a step function (``link_steps``, a ``booking.Steps``: breakpoints and the share from each
    on; ``take_rate``). A transfer started later but arriving earlier is not queued behind a
    booking that lies in the future: it takes a node's gaps (``serve``: preemptive
    resume, gaps of any length) and a link's spare bandwidth (``fit_rate``: while its
    share fits, it crosses as if alone; else it gets what is left, moment by moment). An
    HBM write's pseudo-channel commits run when its head arrives (``heads.commit_later``); its
    bursts booked ahead give way to requests that arrive before them
    (``HbmController.write_stream``).

    Booking walks the route in stretches. On a stretch the closed form of
    ``_Plan`` holds while each resource is free from the moment the head reaches
    it (a node: a gap that holds its overhead; a link: enough bandwidth to spare all
    along the occupancy): one tight pass books them, and the stretch's hop rows go to the recorder as one compact
    record (expanded later with numpy). The first transfer to reach a stretch
    computes the plan's offsets as it goes instead (``routes.walk``: the same arithmetic,
    rows recorded explicitly, nothing kept); the plan is built for the second. At
    the first resource that is not free,
    that hop is booked by the sequential recursion (``_hop``: ``serve`` and
    ``fit_rate``, queueing recorded), and the walk goes on from the next hop with the
    closed form from there. The result equals booking every hop sequentially (up to
    floating-point rounding).
    Intervals ending at or before ``now`` can never block a reservation (heads
    are never earlier than ``now``); they are pruned every ``routes.PRUNE_EVERY``
    transfers and before each gap search.

    The route cache (``_Route`` and its plans per (source, destination, bytes)) is bounded:
    ``held`` counts the hops of its routes plus the resources and rows of its plans, and when
    it reaches ``HELD_MAX`` a new route first empties it (``evict``: the recorder
    flushes, which expands every pending compact record, then forgets the plans). So memory
    does not grow with the number of distinct routes a trace uses (all-to-all traffic on a
    256-PE topology has 65,280 pairs per size).
    """

    fidelity = "fast"
    HELD_MAX = 1 << 17    # ~35 MiB of routes and plans (~280 B per counted item on default.yaml)

    def __init__(self, env: simpy.Environment, topo: Any, rec: Recorder,
                 hbm: dict[int, HbmController], fair: bool = True) -> None:
        super().__init__(env, topo, rec, hbm)
        #: serve streams that meet on a link together (``fair``); False: ``fast-fcfs``, a
        #: booking never moves once made
        self.fair = fair
        self.fidelity = "fast" if fair else "fast-fcfs"
        self.link_steps: list[Steps] = [Steps() for _ in topo.links]   # booked shares
        self.node_iv: list[Spans] = [Spans() for _ in topo.nodes]       # [s0, e0, s1, ...]
        self.routes_nb: dict[tuple[int, ...], _Route] = {}
        self._hops: dict[tuple[int, int, bool, int], tuple[tuple, float]] = {}
        self.link_src = [lk.src for lk in topo.links]
        self.link_stage_code = [STAGE_CODE[s] for s in self.link_stage]
        self.sends = 0
        for h in hbm.values():
            h.pc_iv = [[] for _ in range(h.n_pcs)]
        self.held = 0
        self.evictions = 0
        #: the flows' bookings per link (``fair.incumbents``), flows named by slot
        self.flow_slots = Slots()
        self.link_flows: list[Recs] = [Recs(self.flow_slots) for _ in topo.links]
        self._f: Flow | None = None         # the flow being booked, if it is one
        #: per link, the single flits of flows booked there (start -> (flow, hop, arrival)):
        #: a flit arriving before one goes first and the flow moves (``heads.serve_flit``)
        self.link_own: list[dict[float, tuple[Flow, int, float]]] = [{} for _ in topo.links]
        self.push_depth = 0
        #: per mesh router, the links into it: the streams whose flits still arrive after
        #: their head there are among their bookings (``bodies.hold_bodies``)
        self.body_in = router_inputs(self, topo)
        self.head_at = head_at              # (``fair._push`` moves a flow's head through it)
        self.relink = relink                # (and a single flit's link booking)
        self.pull_behind = pull_behind      # (``heads.head_at``: credits queued behind a head)

    def hop_of(self, li: int, nb: int, first: bool, shape: int = 0) -> tuple[tuple, float]:
        """``(_Route.hops entry, busy ns)`` of ``nb`` bytes over link ``li`` (``first``: the
        route's first link, whose source node charges no overhead; ``shape``: where a short
        last flit travels, see ``FastFabric.send``); memoised, since routes share links (at
        most ``ROUTES_MAX`` entries, emptied when full)."""
        key = (li, nb, first, shape)
        hit = self._hops.get(key)
        if hit is not None:
            return hit
        if len(self._hops) >= self.ROUTES_MAX:
            self._hops.clear()
        fb = self.flit_bytes
        n = max(1, -(-nb // fb))
        last = nb - (n - 1) * fb if nb > 0 else 0
        head = fb if n > 1 else last
        if n > 1 and shape:                 # the short flit leads (1) or is in the middle (2)
            head, last = (last, fb) if shape == 1 else (fb, fb)
        src = self.link_src[li]
        ov = 0.0 if first else self.node_ov[src]
        niv = self.node_iv[src] if ov > 0 else None
        bw = self.link_bw[li]
        ln, prop = self.link_steps[li], self.link_prop[li]
        if bw > 0 and nb > 0:
            if n == 1:
                hop = (niv, ov, ln, li, 1, head / bw, 0.0, 0.0, prop)
            else:
                hop = (niv, ov, ln, li, 2, head / bw, (nb - last) / bw, last / bw, prop)
        else:
            hop = (niv, ov, ln, li, 0, 0.0, 0.0, 0.0, prop)
        hit = self._hops[key] = (hop, nb / bw if bw > 0 else 0.0)
        return hit

    def evict(self) -> None:
        """Empty the route cache (routes and their plans). The recorder flushes first (every
        compact record is expanded, so no row refers to a plan any more), then forgets the
        plans. The (source, destination) route and command caches bound themselves."""
        for f in self.flow_slots.flows:      # flows not yet complete: their compact rows
            if f is not None:                # refer to plans
                expand(f)
        self.rec.flush(self.env.now)
        self.rec.drop_plans()
        self.routes_nb.clear()
        self.held = 0
        self.evictions += 1

    def send(  # type: ignore[override]  # the base's **fast, by name
            self, op_id: int, tile: int, src: int, dst: int, nbytes: int, addr: int = 0,
            ready: list[float] | None = None, at: float | None = None, ack: float = 0.0,
            span: tuple[float, float] | None = None, shape: int = 0, group: int = 1,
            bursts: Bursts | list[float] | None = None) -> _Ev:
        """As ``Fabric.send``, but the event is a bare one (``after``): yield it or add
        callbacks; it is not a ``simpy.Event`` (no ``all_of``). ``at``: flits ready at this
        (future) time instead of now;
        ``span``: (first, last) flit ready times instead of ``ready`` (the closed form
        needs no more); ``ack``: the returned event fires that much later (a control
        message back, whose row the caller records), so a DMA round trip is one SimPy
        event. The event's value is the completion time (before ``ack``). ``shape``: flits
        leave in ready order, so the short last flit of an HBM read (which may finish before
        full bursts) is the head (1), somewhere in the middle (2) or, as for every other
        transfer, the tail (0): the closed form needs the sizes of the head and tail flits.
        ``group``: how many (full) flits are ready at the last ready time. They cross the
        path one after another, so the last cannot arrive before ``(group - 1)`` full flit
        times on the slowest link after it would alone (exact for a tandem of FIFO links):
        its ready time is moved by that much. Without it, a read whose short burst leads
        three full ones ready together came out two flit times early. ``bursts``: an HBM
        read's ready time per burst (``hbm.Bursts``, worked out when asked for, or a list), how a
        flow's work arrives at its first link (``fair.Booked.arrival``)."""
        return send(self, op_id, tile, src, dst, nbytes, addr, ready, at, ack, span, shape, group,
                    bursts)

    def new_route(self, key: tuple[int, ...], src: int, dst: int, nbytes: int,
                  shape: int) -> _Route:
        """The route of ``key`` made and cached (``routes.send``: a key not seen yet); the
        cache is emptied first when full (``evict``)."""
        if self.held >= self.HELD_MAX:
            self.evict()
        rt = self.routes_nb[key] = _Route(self, src, dst, nbytes, shape)
        self.held += len(rt.hops) + 1
        return rt

    def _hop(self, rt: _Route, j: int, op_id: int, tile: int, h: float, t: float,
             now: float) -> tuple[float, float]:
        """Book hop ``j`` sequentially (head at ``h``, tail at ``t``); record its row;
        return head and tail at the next node (``routes.hop_seq``, typed there)."""
        return hop_seq(self, rt, j, op_id, tile, h, t, now)

    def _arrive(self, rt: _Route, op_id: int, tile: int, addr: int, h: float, t: float,
                now: float, ack: float) -> _Ev:
        """Book the destination (overhead, then the HBM commit when the data arrives)
        sequentially; record the terminal row; the completion event."""
        q = 0.0
        h_in = h
        niv = rt.dst_iv
        if niv is not None:
            ov = rt.dst_ov
            s = serve(niv, now, h, ov)
            q = s - (h + ov)
            h = s
        if t < h:
            t = h
        if rt.hbm is not None:
            return commit_later(self, rt, op_id, tile, addr, h_in, h, t, q, ack)
        self._rows([(op_id, tile, rt.term_stage, rt.dst, -1, h_in, t, rt.term_busy, q, rt.nb)])
        return complete(self, t, ack)

    # ------------------------------------------------------------------ fair share (``fair``)
    def _rows(self, rows: list[tuple]) -> None:
        f = self._f
        if f is None:
            self.rec.rows(rows)
        else:
            f.segs.extend([("R", r) for r in rows])

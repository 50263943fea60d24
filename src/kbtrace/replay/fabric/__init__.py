"""The data fabric: links + forwarding nodes, in two fidelity modes with one interface.

``Fabric.send(...)`` moves ``nbytes`` from one node to another along
``topology.route`` and returns a SimPy event that fires when the last byte is
committed at the destination (HBM: last pseudo-channel commit). Transfers move
as flits of ``cube.hbm.burst_bytes``.

flit (reference)
    One standing process per directed link (its own FIFO, never shared with a
    node) serialises flits FIFO for ``flit_bytes / bw_gbps`` and delivers each
    after the propagation delay. One standing process per node (its own inbox
    FIFO) forwards flits in arrival order and charges the node's
    ``overhead_ns`` once per transaction, on the head flit. Flits of concurrent
    transfers interleave at flit granularity. The FIFOs (``_Fifo``) and delays
    (``_after``) schedule exactly the events a ``simpy.Store`` and
    ``env.timeout`` would, in the same order, without their per-event objects.
fast
    Per transfer, in closed form, booked when it starts: the head reaches link *j*
    after the node's overhead and crosses it; the link is busy until the tail
    leaves, ``max(tail_arrival, start + (nbytes - last) / bw) + last / bw``, at the
    bandwidth share ``(nbytes / bw) / occupancy`` (below 1 when a slower link
    upstream spaces the flits). Exact for a transfer alone on its path (the flit
    departure sequence is convex, so the max-plus recursion is decided by the
    head and tail). Under contention, bookings made earlier keep their times:
    transfers share a link while their shares fit its bandwidth (as their flits
    interleave in flit mode); one that finds too little to spare is served with
    what is left from its arrival on; a node's overhead is served in the gaps
    between earlier ones, or before a flow's booked earlier whose head arrives later
    (``fair``: the flow moves).

Control messages (``nbytes == 0``: read requests, write acks, launch fan-out)
travel on a separate control channel: propagation plus node overheads, no
bandwidth occupancy, identical in both modes. Hop rows: one per link per
transfer (``link_idx`` set; ``t_enter`` = head reaches the link's source node,
``t_leave`` = tail reaches the link's destination), one terminal row at the
destination node, and one row per control message. In fast mode a head moved later after
it was booked (``fair``, ``heads``) enters its rows as it now arrives (``enters``).

Modules (one-way imports: ``flit`` and ``fast`` import ``base`` and ``events``; ``fast`` imports
``booking``; this package imports all three):

``base``     ``Transfer`` and the ``Fabric`` base (routes, per-link / per-node constants,
             control messages).
``events``   bare SimPy events (``_Ev``, ``after``: ``env.timeout`` without its object,
             pushed onto the heap as ``Environment.schedule`` does; compiled with the
             core; imports nothing of the package; ``flit``, ``fast``, ``routes``,
             ``fair`` and ``heads`` import it).
``flit``     ``FlitFabric``: standing link / node processes, per-flit FIFOs.
``fast``     ``FastFabric``: closed-form timing per transfer, booked in stretches.
``routes``   routes and their free-path closed forms (``_Route``, ``_Plan``), and the
             walk booking a transfer along them (``book_route``; imports ``events``,
             ``booking``, ``fair``, ``heads`` and ``bodies``; ``fast`` imports it).
``booking``  fast mode's reservation arithmetic on plain lists (node busy intervals,
             link bandwidth shares): pure functions, no SimPy.
``fifo``     streams that meet on a link served together, first come, first served
             (``share_fifo``; imports ``booking``).
``ledger``   flows' link bookings as C records (``Recs`` per link, flows named by slot in
             ``Slots``): no Python object per hop (imports nothing of the package).
``fair``     fast mode's fair share: flows that meet on a link served together, moved
             (imports ``events``, ``booking``, ``fifo`` and ``ledger``).
``heads``    node overheads serving heads in arrival order, moving flows' heads (a moved
             single flit's link booking too); HBM writes' commits (``HbmWrite``)
             (imports ``events``, ``booking``, ``fair`` and ``bodies``; ``fast`` imports all
             of them).
``bodies``   stream bodies held at mesh routers by the heads that arrive before them, found
             among the links' live bookings (``ledger.Recs``; nothing noted per hop)
             (imports ``booking`` and ``fair``, compiled ``ledger``'s types; ``heads``, ``routes`` and ``fast``
             import it).
``pull``     IPCQ credits queued behind a head that moved later served again earlier,
             carried on along their path (imports ``booking``, ``fair``, ``heads``).
``enters``   a moved head's hop rows entered as it now arrives, as late as its link
             bookings allow (imports nothing of the package; ``fair`` imports it).
``core``     which ``FastFabric`` runs: the compiled twin of ``fast`` + ``booking``
             (Cython, built by ``pip install -e .``) or this pure-Python reference.
"""

from __future__ import annotations

from typing import Any

import simpy

from kbtrace.replay.fabric.base import Fabric, Transfer
from kbtrace.replay.fabric.core import fast_fabric
from kbtrace.replay.fabric.events import after
from kbtrace.replay.fabric.fast import FastFabric
from kbtrace.replay.fabric.flit import FlitFabric
from kbtrace.replay.hbm import HbmController
from kbtrace.replay.recorder import Recorder

__all__ = ["Fabric", "FlitFabric", "FastFabric", "Transfer", "after", "make_fabric"]


def make_fabric(fidelity: str, env: simpy.Environment, topo: Any, rec: Recorder,
                hbm: dict[int, HbmController]) -> Fabric:
    """The fabric of a fidelity mode (fast: compiled when built, ``core.fast_fabric``)."""
    if fidelity == "flit":
        return FlitFabric(env, topo, rec, hbm)
    if fidelity in ("fast", "fast-fcfs"):
        return fast_fabric()(env, topo, rec, hbm, fair=fidelity == "fast")
    raise KeyError(fidelity)

"""Bare SimPy events for the replay's own timers: ``_Ev``, what ``Environment.step`` and
``Process._resume`` touch of an event, and ``after``, ``env.timeout`` without the ``Timeout``
object.

``after`` schedules its event as ``Environment.schedule`` does (the same heap entry: time,
priority, the environment's next event id, the event), pushed straight onto the
environment's queue (``replay.eventq``), as the replay's servers (``stations.Server``) and PE
CPUs (``cpu.Cpu``) schedule their own timers: a SimPy method call and, interpreted, a Python
frame fewer per event. Compiled (``_events_c``,
with the fast core), the booking code calls it without a Python frame either: fast mode
makes one per transfer that completes (``routes.book_route`` and ``complete``,
``fair``, ``heads``). Imports nothing of the package but ``errors``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import simpy
from simpy.events import NORMAL  # the priority of a Timeout

from kbtrace.errors import InvariantError

__all__ = ["after", "_Ev"]

if TYPE_CHECKING:       # to the type checker a bare event is the SimPy event it stands for
    _EventLike = simpy.Event
else:
    _EventLike = object


class _Ev(_EventLike):
    """A bare SimPy event: what ``Environment.step`` and ``Process._resume`` touch (plus
    ``value``, as on a ``Timeout``)."""
    __slots__ = ("callbacks", "_ok", "_value")

    if TYPE_CHECKING:   # made bare (no environment) and filled in by hand
        def __init__(self) -> None: ...

    @property
    def value(self) -> Any:
        return self._value


def after(env: simpy.Environment, delay: float, value: Any = None) -> _Ev:
    """``env.timeout(delay, value)`` without the ``Timeout`` object: the same event scheduled
    the same way (its value is ``_value``), and refused like it for a negative delay."""
    if delay < 0:
        raise InvariantError(f"an event scheduled {-delay:.6g} ns in the past (at "
                             f"{env.now + delay:.6g} ns, now {env.now:.6g} ns)")
    ev = _Ev()
    ev.callbacks = []
    ev._ok = True
    ev._value = value
    q: Any = env._queue     # (``env.schedule``: its ``replay.eventq`` queue)
    q.push(env._now + delay, NORMAL, ev)
    return ev

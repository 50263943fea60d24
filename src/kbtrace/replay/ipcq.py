"""IPCQ deadlock reports: which sends wait for slots, which receives wait for data.

The IPCQ model itself lives with its components: ``engine.Sim`` (as ``context.SimContext``) owns the rx buffers
(one ``simpy.Container`` of ``n_slots`` per (launch, sender, receiver, direction),
``ipcq_channel``) and the slot tier costs (``slot_access``); ``pe`` blocks PE_CPU at a
send until its buffer has the slots (credits), moves the payload on the DMA vc_comm
channel and, once the data has landed, reads the slot and returns the credit.

Capture blocks a send on the same slot counts, so a trace deadlocks in replay only when
it is replayed with fewer or smaller slots than it was captured with (``--set
pe.ipcq.n_slots`` / ``slot_bytes`` or a different topology). ``diagnose`` turns the
state left when the schedule ran dry into one line naming every blocked send (its
buffer, the slots it needs, the free ones and the sends holding them) and receive
(the send it waits for), and the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from kbtrace.replay.context import SimContext as Sim
    from kbtrace.replay.ops import Op

__all__ = ["diagnose"]

MAX_LISTED = 6


def _where(sim: Sim, op: Op) -> str:
    """``file:line`` of an op's kernel call, when the trace has it."""
    got = sim.source.where(op.op_id)
    if got is None:
        return ""
    f, ln = got
    return f" at {f}:{ln}" if f is not None else ""


def _prog(op: Op) -> str:
    return f"program {op.program} (sip{op.sip}.cube{op.cube}.pe{op.pe})"


def diagnose(sim: Sim, unfinished: np.ndarray) -> str | None:
    """One line describing an IPCQ deadlock, or None if no IPCQ op is involved
    (``unfinished``: the ids of the ops that never completed, ascending)."""
    src = sim.source
    kinds = np.array(src.kind_values, dtype=object)[src.kinds[unfinished]]
    send_ids = [int(i) for i in unfinished[kinds == "send"] if int(i) in sim.ipcq_waiting]
    # receives the PE_CPU reached (later ones sit behind a blocked op of their program)
    recv_ids = [int(i) for i in unfinished[kinds == "recv"] if _issued(sim, int(i))]
    if not send_ids and not recv_ids:
        return None
    want = send_ids[:MAX_LISTED] + recv_ids[:MAX_LISTED]
    want += [sim._match[i] for i in recv_ids[:MAX_LISTED] if i in sim._match]
    got = src.fetch([i for i in want if i not in sim.sends])
    ops = {**got, **sim.sends}
    sends = [ops[i] for i in send_ids[:MAX_LISTED]]
    recvs = [ops[i] for i in recv_ids[:MAX_LISTED]]
    parts: list[str] = []
    need_slots = 0
    for o in sends:
        n_slots, slot_bytes, _kind = sim.ipcq_params(o)
        ch, k = sim.ipcq_channel(o)
        held = sim.ipcq_held.get((o.launch, o.program, o.peer_program, o.direction), [])
        held_s = ", ".join(f"send op {h}{_where(sim, ops[h])} (recv op "
                           f"{ops[h].match_op_id} not done)" for h in held[:MAX_LISTED])
        need = sum(-(-int(ops[h].nbytes) // slot_bytes) for h in held) \
            + -(-int(o.nbytes) // slot_bytes)
        need_slots = max(need_slots, need)
        parts.append(f"{_prog(o)} send op {o.op_id} ({o.direction!r} -> program "
                     f"{o.peer_program}){_where(sim, o)} waits for {k} slot(s) of its "
                     f"{o.direction!r} buffer: {int(ch.level)} of {n_slots} free (slot_bytes "
                     f"{slot_bytes}), held by {held_s or 'nothing'}")
    for o in recvs:
        sid = sim._match.get(o.op_id)
        snd = ops.get(sid) if sid is not None else None
        if snd is None:
            continue
        state = ("waits for slots" if snd.op_id in sim.ipcq_waiting else
                 "not issued yet" if not _issued(sim, snd.op_id) else "in flight")
        parts.append(f"{_prog(o)} recv op {o.op_id} ({o.direction!r}){_where(sim, o)} waits "
                     f"for send op {snd.op_id} of program {snd.program} ({state})")
    more = len(send_ids) + len(recv_ids) - len(parts)
    fix = ("a send waits for IPCQ slots that only a later recv frees; capture checks this "
           "with the slots it was captured with: re-capture on this topology (capture then "
           "names the sends) or give the buffers room"
           + (f" (--set pe.ipcq.n_slots={need_slots})" if need_slots else ""))
    if not send_ids:
        fix = ("every blocked recv waits for a send that was never issued; check the "
               "kernel's send/recv order or re-capture on this topology")
    return (f"IPCQ deadlock: {len(unfinished)} op(s) never completed: " + "; ".join(parts)
            + (f"; and {more} more" if more > 0 else "") + f"; {fix}")


def _issued(sim: Sim, op_id: int) -> bool:
    t = sim.rec.t_issue[op_id]
    return bool(t == t)        # NaN until issued

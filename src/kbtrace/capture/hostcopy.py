"""Host memory and host <-> device copies: ``h2d`` / ``d2h`` op rows.

Host tensors live in a host address space above the 51-bit device space
(``HOST_BASE = 2**52``), so no device address decodes to them and kernels cannot
reach them (the address sanitizer does not know them). A copy between a host tensor
and a device tensor becomes one op per device shard, in the host program's order
between launches:

``h2d``  host -> device shard: ``src_space=host`` (``mem_strides`` when the shard is
         not contiguous in the host tensor, e.g. a column shard), ``dst`` = the shard;
         every replica of a replicated tensor gets its own copy.
``d2h``  device shard -> host: ``src`` = the shard, ``dst_space=host`` (strided as
         above); replicated tensors are read from replica 0 only.

Rows carry ``launch = program = pid0 = pid1 = -1``, the device side's ``sip / cube /
pe`` and ``seq`` = the copy's position among the host program's copy ops, so
(launch, program, seq) stays unique. Dependencies and pending values flow through
copies like through loads and stores: an ``h2d`` depends on the ``d2h`` ops that last
wrote its host range, a ``d2h`` on the last writers of its shard; the capture-time
image (``kmem``) is updated so kernels after an ``h2d`` load the copied values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kbtrace.capture.dtypes import itemsize
from kbtrace.capture.executor import Op

if TYPE_CHECKING:
    from kbtrace.capture.tracer import Tracer
    from kbtrace.capture.workload import Shard, Tensor

__all__ = ["HOST_BASE", "HOST_BYTES", "CopySpec", "FreeSpec", "MapSpec", "emit_copy", "apply"]

HOST_BASE = 1 << 52          # above every 51-bit device address
HOST_BYTES = 1 << 44         # 16 TiB of host address space


@dataclass(frozen=True)
class CopySpec:
    """One host copy action: ``kind`` "h2d" (src host, dst device) or "d2h"."""
    kind: str
    src: Tensor
    dst: Tensor


@dataclass(frozen=True)
class FreeSpec:
    """``w.free(tensor)``: its memory is unmapped at this point of the host program."""
    tensor: Tensor


@dataclass(frozen=True)
class MapSpec:
    """A tensor placed in reused memory is mapped at this point of the host program."""
    regions: list[Any]


def apply(tracer: Tracer, spec: Any, host_seq: int) -> int:
    """Run one non-launch host action; return the next host copy sequence number."""
    if isinstance(spec, CopySpec):
        return emit_copy(tracer, spec, host_seq)
    if isinstance(spec, FreeSpec):
        for reg in spec.tensor.regions:
            tracer.regions.remove(reg)
    else:
        for reg in spec.regions:
            tracer.regions.add(reg)
    return host_seq


def _host_view(t: Tensor, s: Shard) -> tuple[int, list[int]]:
    """(host address of shard ``s``'s first element, element strides or [] if contiguous)."""
    full = t.shape
    strides = [math.prod(full[d + 1:]) for d in range(len(full))]
    first = sum(o * st for o, st in zip(s.offset, strides, strict=True))
    # contiguous iff, after the first dimension the shard spans more than once, it spans
    # every dimension whole
    dims = [d for d, n in enumerate(s.shape) if n > 1]
    contiguous = not dims or all(s.shape[d] == full[d] for d in range(dims[0] + 1, len(full)))
    return t.shards[0].addr + first * itemsize(t.dtype), [] if contiguous else strides


def emit_copy(tracer: Tracer, spec: CopySpec, host_seq: int) -> int:
    """Record the copy's ops (see module doc); return the next host sequence number."""
    if spec.kind == "h2d":
        host, dev = spec.src, spec.dst
        shards = dev.shards
    else:
        dev, host = spec.src, spec.dst
        shards = [s for s in dev.shards if s.replica == 0]
    hreg = tracer.host_regions.find(host.shards[0].addr, host.nbytes)
    assert hreg is not None
    for s in shards:
        haddr, strides = _host_view(host, s)
        nb = math.prod(s.shape) * itemsize(dev.dtype)
        span = (1 + sum((n - 1) * st for n, st in zip(s.shape, strides, strict=True))) \
            * itemsize(dev.dtype) if strides else nb
        dreg = tracer.regions.find(s.addr, nb)
        assert dreg is not None
        op_id = tracer.next_op
        tracer.next_op += 1
        if spec.kind == "h2d":
            deps, pending = hreg.readers_view(haddr, haddr + span)
            src, dst, sspace, dspace = haddr, s.addr, "host", "hbm"
        else:
            deps, pending = dreg.readers_view(s.addr, s.addr + nb)
            src, dst, sspace, dspace = s.addr, haddr, "hbm", "host"
        op = Op(op_id=op_id, launch=-1, program=-1, pid0=-1, pid1=-1, sip=s.sip, cube=s.cube,
                pe=s.pe, seq=host_seq, kind=spec.kind, name=spec.kind, is_async=False,
                src_space=sspace, src_addr=src, dst_space=dspace, dst_addr=dst, nbytes=nb,
                out_shape=list(s.shape), out_dtype=dev.dtype, mem_strides=strides,
                deps=list(deps), src_file=None, src_line=None)
        host_seq += 1
        _append(tracer, op)
        if not pending:   # real values: the capture-time image sees the copy
            if spec.kind == "h2d":
                tracer.kwrite(dst, tracer.kmem.read(src, s.shape, dev.dtype, strides or None))
            else:
                tracer.kwrite(dst, tracer.kmem.read(src, s.shape, dev.dtype), strides or None)
        if spec.kind == "h2d":
            dreg.note_write(s.addr, s.addr + nb, op_id, pending)
        elif strides:     # a strided write keeps the older writers of the gaps
            hreg.writers.append((haddr, haddr + span, op_id, pending))
        else:
            hreg.note_write(haddr, haddr + span, op_id, pending)
    return host_seq


def _append(tracer: Tracer, op: Any) -> None:
    log = tracer.log
    log.append(op)
    if len(log) >= tracer.sink.batch:
        tracer.sink.drain()

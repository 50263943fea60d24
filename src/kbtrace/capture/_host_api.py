"""Host memory calls of the host program (``Workload.host_tensor``, ``copy_to_device``,
``copy_to_host``, ``free``): mixed into ``workload.Workload``; the ops they lead to are
emitted by ``hostcopy`` when the host program reaches them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kbtrace.capture.dtypes import itemsize
from kbtrace.capture.hostcopy import CopySpec, FreeSpec
from kbtrace.capture.memory import Region
from kbtrace.errors import CaptureError

if TYPE_CHECKING:
    from kbtrace.capture.workload import Tensor

__all__ = ["HostMemoryMixin"]


class HostMemoryMixin:
    """``host_tensor``, ``copy_to_device``, ``copy_to_host`` and ``free`` of ``Workload``."""

    name: str
    tensors: dict[str, Any]
    actions: list[Any]
    _hbm: dict[tuple[int, int, int], Any]
    _host: Any
    _tracer: Any

    def _declare(self, name: str, shape: Sequence[int] | int, dtype: str, init: Any,
                 space: str = "hbm") -> Tensor:
        raise NotImplementedError

    def free(self, tensor: Tensor) -> None:
        """Release a device tensor's HBM after the launches declared so far: later tensors may
        reuse it (ADR-0048 first fit + coalescing); a kernel touching it after this point is an
        unallocated-memory error."""
        t = self._own(tensor, "free", "hbm")
        if t.freed:
            raise CaptureError(f"workload {self.name!r}: tensor {t.name!r} freed twice")
        if t.role == "output":
            raise CaptureError(f"workload {self.name!r}: tensor {t.name!r} is an output, which "
                               f"must stay allocated; copy it to the host first (w.copy_to_host) "
                               f"and make the host tensor the output")
        for s in t.shards:
            self._hbm[(s.sip, s.cube, s.pe)].free(s.addr, math.prod(s.shape) * itemsize(t.dtype))
        t.freed = True
        self.actions.append(FreeSpec(t))

    def host_tensor(self, name: str, shape: Sequence[int] | int, dtype: str = "f32",
                    init: Any = "zeros") -> Tensor:
        """Declare a tensor in host memory (kernels cannot address it; move it with
        ``copy_to_device`` / ``copy_to_host``)."""
        t = self._declare(name, shape, dtype, init, space="host")
        nbytes = t.nbytes
        addr = self._host.alloc(max(nbytes, 1), f"host tensor {name!r}")
        from kbtrace.capture.workload import Shard
        t.shards.append(Shard(0, -1, -1, -1, addr, tuple(0 for _ in t.shape), t.shape))
        self._tracer.host_regions.add(Region(addr, max(nbytes, 1), f"host tensor {name!r}",
                                             "host", dtype))
        self._tracer.write_initial(addr, t.stored)
        self.tensors[name] = t
        return t

    def _own(self, t: Any, what: str, space: str) -> Tensor:
        from kbtrace.capture.workload import Tensor
        own = isinstance(t, Tensor) and self.tensors.get(t.name) is t
        if not own:
            raise CaptureError(f"workload {self.name!r}: {what} of "
                               f"{getattr(t, 'name', type(t).__name__)!r}, which is not a tensor "
                               f"of this workload; pass a tensor returned by w.tensor / "
                               f"w.host_tensor")
        if t.space != space:
            where = "host memory (w.host_tensor)" if space == "host" else "device HBM (w.tensor)"
            raise CaptureError(f"workload {self.name!r}: {what}: tensor {t.name!r} lives in "
                               f"{t.space}, expected one in {where}")
        return t

    def _copy(self, kind: str, src: Tensor, dst: Tensor) -> None:
        if (src.shape, src.dtype) != (dst.shape, dst.dtype):
            raise CaptureError(f"workload {self.name!r}: {kind} {src.name!r} -> {dst.name!r}: "
                               f"{src.shape} {src.dtype} vs {dst.shape} {dst.dtype}; copies "
                               f"need equal shapes and dtypes")
        self.actions.append(CopySpec(kind, src, dst))

    def copy_to_device(self, src: Tensor, dst: Tensor) -> Tensor:
        """Copy host tensor ``src`` into device tensor ``dst`` (every shard, every replica):
        ``h2d`` ops, run after the launches declared before and before those declared after."""
        self._copy("h2d", self._own(src, "copy_to_device", "host"),
                   self._own(dst, "copy_to_device", "hbm"))
        return dst

    def copy_to_host(self, src: Tensor, dst: Tensor | None = None) -> Tensor:
        """Copy device tensor ``src`` (replica 0 of replicated ones) into host tensor ``dst``
        (default: a new zero host tensor ``<src>_host``): ``d2h`` ops, in program order."""
        src = self._own(src, "copy_to_host", "hbm")
        if dst is None:
            dst = self.host_tensor(f"{src.name}_host", src.shape, src.dtype)
        self._copy("d2h", src, self._own(dst, "copy_to_host", "host"))
        return dst

"""Collective calls of the host program (``Workload.all_reduce``, ``Workload.distributed``).

Mixed into ``workload.Workload``; the algorithms live in ``kbtrace.collectives`` (imported
here, one way: the collectives never import capture).
"""

from __future__ import annotations

from typing import Any

from kbtrace.collectives import Distributed, all_reduce

__all__ = ["CollectiveMixin"]


class CollectiveMixin:
    """``all_reduce`` and ``distributed`` of ``Workload``."""

    _dist: Distributed | None = None

    def all_reduce(self, tensor: Any, op: str = "sum", algorithm: str = "lrab",
                   root: str = "centre", buffer_kind: str | None = None,
                   n_slots: int | None = None, slot_bytes: int | None = None) -> Any:
        """Sum ``tensor`` (or a list of tensors, e.g. one per rank) over all its shards: one
        launch of a collective (``kbtrace.collectives``: ``algorithm`` lrab | hier3 | ring,
        lrab's ``root`` centre | corner, this collective's IPCQ ``buffer_kind`` / ``n_slots``
        / ``slot_bytes``); afterwards every shard holds the total. Returns its geometry."""
        return all_reduce(self, tensor, op, algorithm, root, buffer_kind, n_slots, slot_bytes)

    def distributed(self) -> Any:
        """This workload's ``torch.distributed``-like process group (rank = SIP; one per
        workload): ``init_process_group``, ``get_rank``, ``get_world_size``, ``all_reduce``,
        ``barrier``, ``spawn`` (``kbtrace.collectives.Distributed``)."""
        if self._dist is None:
            self._dist = Distributed(self)
        return self._dist

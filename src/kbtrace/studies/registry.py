"""The studies ``kbtrace study NAME`` runs: name -> ``StudySpec`` (module imported on use)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from kbtrace.errors import UsageError

__all__ = ["StudySpec", "STUDIES", "load_study", "LIST_KINDS"]

#: what ``kbtrace list`` lists (``catalog.catalog``), in print order
LIST_KINDS = ("workloads", "topologies", "sweeps", "studies", "traces", "runs")


@dataclass(frozen=True)
class StudySpec:
    name: str
    description: str
    reference: str        # where the predecessor's figures come from (shared/reference/)
    module: str           # a module with ``run(ctx) -> StudyResult``


STUDIES: dict[str, StudySpec] = {s.name: s for s in (
    StudySpec("gemm", "GEMM shapes x operand staging on one PE: per-stage breakdown, MAC "
              "utilisation against the ideal pipeline", "ADR-0044, ADR-0054, commitlog §6/§17",
              "kbtrace.studies.gemm"),
    StudySpec("pe_dma", "PE DMA writes: 6 uncongested, 5 congested and 2 SIP-wide scenarios "
              "with per-component breakdown and single / aggregate utilisation",
              "commitlog §6 (plot_pe_dma_perf)", "kbtrace.studies.pe_dma"),
    StudySpec("pe2pe", "PE-to-PE transfers over 4 hop types x 128 B - 10 KB: IPCQ send/recv "
              "against raw DMA", "commitlog §12 (PE-to-PE latency experiment)",
              "kbtrace.studies.pe2pe"),
    StudySpec("gqa", "Llama-70B grouped-query attention: single / multi-user x prefill (KV ring) "
              "/ decode (partial-softmax combine), verified, op counts, latency breakdown",
              "ADR-0057, commitlog §16 (milestone-gqa-llama70b)", "kbtrace.studies.gqa"),
    StudySpec("allreduce", "LRAB all-reduce on 6 SIPs: n_elem x ring_1d / torus_2d / mesh_2d, "
              "IPCQ buffer kinds, topology diagram, the reference curve",
              "ADR-0043, commitlog §13/§18", "kbtrace.studies.allreduce"),
)}


def load_study(name: str) -> ModuleType:
    spec = STUDIES.get(name)
    if spec is None:
        import difflib
        close = difflib.get_close_matches(name, list(STUDIES), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(f"study {name!r}: no such study; {hint}known: {', '.join(STUDIES)}")
    return importlib.import_module(spec.module)

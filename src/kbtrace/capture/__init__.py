"""Capture: run Triton-like ``tl.*`` kernels on greenlets and record them as Arrow op traces.

Role
    Turn a workload (``capture/<name>.py``: tensors, placement, launches, numpy
    references) into a trace directory that replay and analysis read.
Inputs
    a workload file, a compiled ``Topology`` (or a topology YAML path), parameters.
Outputs
    ``ops.parquet`` (``schema.OPS``, one row per op), ``memory.parquet``
    (``schema.MEMORY``), ``trace.json``.
Phases
    build (host program places tensors, declares launches) -> run (one greenlet
    per program, cooperative deterministic scheduler; memory ops real, compute
    deferred; compact op records) -> drain (rows expanded and executed by the
    numpy executor in capture order for their digests, streamed to Parquet)
    -> finalize (atomic writes).
Layers of the kernel API (STYLE item 9)
    ``tl`` (thin public functions) -> ``_semantics`` (shape/dtype checks) ->
    ``program.Program`` (recorder backend), the active program in a ContextVar.
``executor.execute`` is the single definition of what every op computes.
"""

from kbtrace.capture import layouts, tl
from kbtrace.capture.executor import ExecResult, execute
from kbtrace.capture.handles import CompletionHandle, RecvFuture, TensorHandle
from kbtrace.capture.layouts import mesh, ring, torus
from kbtrace.capture.trace import Trace, capture, open_trace
from kbtrace.capture.workload import Tensor, Workload, parse_params

__all__ = [
    "capture", "open_trace", "Trace", "execute", "ExecResult", "Workload", "Tensor",
    "parse_params", "tl", "TensorHandle", "CompletionHandle", "RecvFuture",
    "layouts", "ring", "mesh", "torus",
]

from kbtrace._callable import make_module_callable  # noqa: E402

make_module_callable(__name__, "capture")  # kbtrace.capture(...) calls capture()

"""Insight: answers to an architect's next questions about a replayed run.

Role: from a run directory (``run.json``, its trace and topology), say what to make faster
(``attribute``: each resource class replayed faster and slower, ranked), what a parameter
change would do without a full replay (``whatif``), and how far the model is from measured
figures (``calibrate``).
Inputs: a run directory written by ``kbtrace replay`` / ``kbtrace run``; resource classes
(``resources``: named groups of topology parameters with the sense that makes them faster).
Outputs: ``RUN/attribution/attribution.parquet`` (``schema.ATTRIBUTION``) that
``kbtrace report`` shows with a tornado chart; ``WhatIf`` estimates (``whatif``: ``retime``
prepares a run once, ``Retimer.retime`` prices its hops on a new topology (``pricing``),
re-binds IPCQ credit waits to another slot count (``credits``) and re-times it in one pass
over its events); ``calibrate`` fits topology parameters to measured figures
(``scenarios``: single-flow and hot-target PE DMA reads replayed alone) and writes the
fitted topology YAML.
Imports are one way: this package uses ``replay`` (sweep machinery), ``topology`` and
``analysis``; none of those imports it (``kbtrace run``'s headline calls it lazily).
"""

from __future__ import annotations

from kbtrace.insight.attribute import Attribution, attribute
from kbtrace.insight.calibrate import Calibration, calibrate
from kbtrace.insight.resources import RESOURCES, ResourceClass
from kbtrace.insight.whatif import Retimer, WhatIf, whatif

__all__ = ["attribute", "Attribution", "RESOURCES", "ResourceClass", "whatif", "WhatIf",
           "Retimer", "calibrate", "Calibration"]

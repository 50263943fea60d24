"""Helpers for the replay and analysis tests: synthetic traces built straight from
``schema.OPS`` rows, and copies of a captured and replayed run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa

from kbtrace import schema
from kbtrace.topology import address

TOPO_DIR = Path(__file__).resolve().parents[1] / "topologies"


class SynthTrace:
    """Duck-types ``capture.Trace`` for ``replay``: ``path``, ``meta``, ``ops()``."""

    def __init__(self, rows: list[dict[str, Any]], name: str = "synth") -> None:
        full = []
        for i, r in enumerate(rows):
            row = {f.name: schema.field_default(f) for f in schema.OPS}
            row.update({"op_id": i, "name": r.get("kind", "")})
            row.update(r)
            full.append(row)
        self.table = pa.Table.from_pylist(full, schema=schema.OPS)
        self.path = None
        self.meta = {"workload": name, "content_hash": {"ops": name + str(len(rows))},
                     "topology": {"name": "default"}}

    def ops(self) -> pa.Table:
        return self.table


def on(sip: int = 0, cube: int = 0, pe: int = 0, program: int = 0, launch: int = 0,
       seq: int = 0) -> dict[str, Any]:
    return {"sip": sip, "cube": cube, "pe": pe, "pid0": pe, "pid1": cube, "program": program,
            "launch": launch, "seq": seq}


def hbm(sip: int, cube: int, pe: int, topo: Any, offset: int = 0) -> int:
    """Physical address ``offset`` bytes into PE ``pe``'s HBM slice."""
    return address.hbm_addr(sip, cube, pe * topo.hbm_slice_bytes + offset)


def load(src: int, nbytes: int, **where: Any) -> dict[str, Any]:
    return {**on(**where), "kind": "load", "src_space": "hbm", "src_addr": src, "dst_space": "tcm",
            "dst_addr": address.pe_tcm_addr(where.get("sip", 0), where.get("cube", 0),
                                            where.get("pe", 0), 0),
            "nbytes": nbytes, "out_shape": [nbytes // 4], "out_dtype": "f32"}


def store(dst: int, nbytes: int, **where: Any) -> dict[str, Any]:
    return {**on(**where), "kind": "store", "src_space": "tcm",
            "src_addr": address.pe_tcm_addr(where.get("sip", 0), where.get("cube", 0),
                                            where.get("pe", 0), 0),
            "dst_space": "hbm", "dst_addr": dst, "nbytes": nbytes, "out_shape": [nbytes // 4],
            "out_dtype": "f32"}


def copy_run(run: Path, dst: Path) -> Path:
    """Copy a run and its trace (siblings ``run`` and ``trace`` of one directory) to ``dst``;
    point run.json at the copied trace; return the copied run directory."""
    shutil.copytree(run.parent, dst)
    meta = json.loads((dst / "run" / "run.json").read_text())
    meta["trace"]["path"] = str(dst / "trace")
    (dst / "run" / "run.json").write_text(json.dumps(meta))
    return dst / "run"


def rehash(doc: Path, key: str, name: str) -> None:
    """Record ``name``'s new digest in ``doc`` (trace.json ``content_hash`` / run.json
    ``files``): a deliberately edited file that passes the integrity check, so a test can
    reach what a reader checks after it."""
    from kbtrace._io import file_hash
    meta = json.loads(doc.read_text())
    meta[key][name] = file_hash(doc.parent / name)
    doc.write_text(json.dumps(meta))

"""``kbtrace export perfetto``: the run as Chrome trace-event JSON (opens in ui.perfetto.dev),
engines and fabric alike.

Mapping
    process  one per (SIP, cube) for its engines, named ``sipS.cubeC``, and one per (SIP,
             cube) for its fabric, named ``sipS.cubeC fabric``; "host/io" and "fabric"
             for what lies outside cubes.
    thread   engines: one track per engine (``op_timing.engine``), named by its node id
             relative to the cube (``pe3.dma``); fabric: one track per directed link that
             carried data (``link router_0_1 -> router_0_2 (router_mesh)``) and one per HBM
             controller that served accesses (``hbm_ctrl.pe3``). Slices that overlap on a
             track (DMA channels, async composites, transfers sharing a link) spill onto
             extra lanes named ``... [2]``, so every slice nests correctly.
    slice    ``X`` per op (name ``kind/name``; args op_id, launch, program, seq, queue_ns,
             nbytes) and per fabric hop (a link hop from its head entering to its tail
             leaving; an HBM access, the ``hbm`` stage at the controller; name ``kind/name``
             of the op it serves; args op_id, tile, nbytes, queue_ns).
    counter  (``C`` events, process-scoped, named ``<track> <series>``) in each fabric process:
             ``link A -> B bytes in flight`` per link that carried data (+nbytes when a
             transfer's head enters, -nbytes when its tail leaves), ``links bytes in flight``
             summed over the process's links, ``link A -> B util`` (busy fraction of each
             of the run's equal time windows, the ``utilisation_windows`` view), and per HBM
             controller ``hbm_ctrl.peP waiting`` / ``in service`` (accesses queued for a
             pseudo-channel: ``[t_enter, t_enter + queue_ns]``; being served: the busy tail
             ``[t_leave - busy_ns, t_leave]``). Routers have no hops of their own (only
             their outgoing links do), so a router is the set of its link tracks.
    pseudo-channels  a run replayed with ``--hbm-pcs`` (``hbm_pcs.parquet``) adds one track
             per HBM pseudo-channel that served something (``hbm_ctrl.pe3 pc05``), one slice
             (cat ``hbm_pc``, name ``kind/name``; args op_id, nbytes, write) per op's
             back-to-back bursts there; without it, a controller's accesses are one track
             (a transfer's bursts spread over all of its pseudo-channels).
    flow     one per transfer: from the issuing op through each link it crossed, in path
             order (``s`` on the op, ``t`` on each link slice), ending on the matching
             receive for an IPCQ send, else on the last link (``f``); plus one ``s``/``f``
             pair per dependency whose producer ran on another engine.
    time     integer nanoseconds: every start and end is rounded to the nearest ns, then
             written as a JSON *string* of microseconds with exactly three decimals
             (``"12.345"``). Perfetto's JSON importer multiplies a number by 1000 and
             truncates (``12.345`` -> 12344 ns), but parses a string exactly; every flow
             point lies inside the slice it binds to, checked in integer ns.

Large runs: at most ``MAX_FABRIC_SLICES`` fabric slices (the earliest by entry time) and as
many pseudo-channel slices,
``MAX_FLOWS`` flows and ``MAX_COUNTER_EVENTS`` counter events (every counter cut at the same
time); ``otherData`` says how many were left out.
"""

from __future__ import annotations

import functools
import json
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kbtrace._io import atomic_path, trim_heap
from kbtrace.analysis._earliest import Earliest
from kbtrace.analysis._memory import release_cache
from kbtrace.analysis._perfetto_fabric import fabric_slices
from kbtrace.analysis._perfetto_flows import Chains, chain_flows
from kbtrace.analysis._perfetto_ops import Encoded, counter_steps, op_slices
from kbtrace.analysis._perfetto_rows import cross_engine_deps, op_rows

__all__ = ["export_perfetto", "trace_events", "us", "MAX_FABRIC_SLICES", "MAX_FLOWS",
           "MAX_COUNTER_EVENTS"]

MAX_FLOWS = 50_000
MAX_FABRIC_SLICES = 200_000
MAX_COUNTER_EVENTS = 500_000


def us(ns: int) -> str:
    """Integer nanoseconds as the exact decimal microseconds string Perfetto parses."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def _split(node: str) -> tuple[str, str]:
    parts = node.split(".")
    if len(parts) >= 3 and parts[0].startswith("sip") and parts[1].startswith("cube"):
        return ".".join(parts[:2]), ".".join(parts[2:])
    return "", node


class _Tracks:
    """Processes, threads (with overlap lanes) and their metadata events."""

    def __init__(self) -> None:
        self.procs: dict[str, int] = {}
        self.threads: dict[tuple[str, str, int], int] = {}
        self.lane_end: dict[tuple[str, str], list[int]] = {}

    def place(self, proc: str, track: str, t0: int, t1: int) -> tuple[int, int]:
        """(pid, tid) of the first lane of ``track`` free at ``t0``; the lane is busy to t1."""
        if proc not in self.procs:
            self.procs[proc] = len(self.procs) + 1
        lanes = self.lane_end.setdefault((proc, track), [])
        for lane, end in enumerate(lanes):      # (a loop: no generator per slice)
            if end <= t0:
                lanes[lane] = t1
                break
        else:
            lanes.append(t1)
            lane = len(lanes) - 1
        key = (proc, track, lane)
        if key not in self.threads:
            self.threads[key] = len(self.threads) + 1
        return self.procs[proc], self.threads[key]

    def pid(self, proc: str) -> int:
        """The pid of process ``proc`` (registered by ``place``)."""
        return self.procs[proc]

    def meta(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for proc, pid in self.procs.items():
            out.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
                        "args": {"name": proc}})
            out.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index",
                        "args": {"sort_index": pid}})
        for (proc, track, lane), tid in self.threads.items():
            out.append({"ph": "M", "pid": self.procs[proc], "tid": tid, "name": "thread_name",
                        "args": {"name": track if lane == 0 else f"{track} [{lane + 1}]"}})
            out.append({"ph": "M", "pid": self.procs[proc], "tid": tid,
                        "name": "thread_sort_index", "args": {"sort_index": tid}})
        return out


_BATCH = 16_384      # rows fetched from DuckDB at a time, events encoded at a time
#: the op slices' rows: every op_timing row by engine, then start (``_perfetto_rows.op_rows``
#: gives the same rows from a single run's file)
OPS_QUERY = ("SELECT t.op_id, t.launch, t.program, t.seq, CAST(t.kind AS VARCHAR) AS kind, "
             "CAST(t.name AS VARCHAR) AS name, CAST(t.engine AS VARCHAR) AS engine, "
             "t.t_start_ns, t.t_end_ns, t.queue_ns, t.nbytes FROM op_timing t "
             "ORDER BY engine, t_start_ns, t_end_ns DESC, op_id")
#: the dependencies whose producer ran on another engine (``_perfetto_rows.cross_engine_deps``
#: counts them and gives the first ones from a single run's files)
DEPS_QUERY = ("SELECT d.dep, d.op_id FROM (SELECT op_id, unnest(deps) AS dep FROM ops) d "
              "JOIN op_timing a ON a.op_id = d.dep JOIN op_timing b ON b.op_id = d.op_id "
              "WHERE a.engine <> b.engine")


def _arrow_batches(run: Any, query: str, rows: int = _BATCH) -> Iterator[Any]:
    """The rows of ``query`` as Arrow record batches of ``rows`` (never the whole result)."""
    rel = run._relation(query)
    try:
        yield from rel.to_arrow_reader(rows)
        release_cache(run.con)      # what the query held, before the next part's arrays
    except Exception as exc:  # duckdb.Error, raised as the Run names it
        import duckdb
        if isinstance(exc, duckdb.Error):
            raise run.error(exc) from exc
        raise


def _batches(run: Any, query: str):
    """The rows of ``query`` as tuples, ``_BATCH`` at a time (never the whole result)."""
    for b in _arrow_batches(run, query):
        cols = [c.to_pylist() for c in b.columns]
        yield from zip(*cols, strict=True)


class _Slots:
    """Per op: (pid, tid, start, end) of its slice and its label, in arrays indexed by op_id
    (a dict of tuples costs ~25x more at a million ops; pid, tid and label index as int32,
    29 B per op against 41 as five int64). Last placement wins, as a dict's."""

    def __init__(self) -> None:
        self.pt = np.zeros((0, 3), dtype=np.int32)     # pid, tid, label index
        self.se = np.zeros((0, 2), dtype=np.int64)     # start, end (ns)
        self.has = np.zeros(0, dtype=bool)
        self.labels: list[str] = []
        self._lab: dict[str, int] = {}

    def _grow(self, top: int) -> None:
        """Room for op ids up to ``top`` (doubling)."""
        if top >= len(self.has):
            n = max(top + 1, 2 * len(self.has), 1024)
            pt = np.zeros((n, 3), dtype=np.int32)
            pt[:len(self.pt)] = self.pt
            se = np.zeros((n, 2), dtype=np.int64)
            se[:len(self.se)] = self.se
            h = np.zeros(n, dtype=bool)
            h[:len(self.has)] = self.has
            self.pt, self.se, self.has = pt, se, h

    def put(self, op_id: int, pid: int, tid: int, s: int, e: int, label: str) -> None:
        self._grow(op_id)
        li = self._lab.get(label)
        if li is None:
            li = self._lab[label] = len(self.labels)
            self.labels.append(label)
        self.pt[op_id] = (pid, tid, li)
        self.se[op_id] = (s, e)
        self.has[op_id] = True

    def put_many(self, op_id: np.ndarray, pid: np.ndarray, tid: np.ndarray, s: np.ndarray,
                 e: np.ndarray, label_i: np.ndarray, labels: list[str]) -> None:
        """``put`` of many ops at once (``label_i`` indexes ``labels``)."""
        if not len(op_id):
            return
        self._grow(int(op_id.max()))
        glob = np.array([self._lab.setdefault(lab, len(self._lab)) for lab in labels], np.int64)
        self.labels.extend(list(self._lab)[len(self.labels):])
        self.pt[op_id] = np.column_stack([pid, tid, glob[label_i]])
        self.se[op_id] = np.column_stack([s, e])
        self.has[op_id] = True

    def __contains__(self, op_id: object) -> bool:
        return isinstance(op_id, int) and 0 <= op_id < len(self.has) and bool(self.has[op_id])

    def get(self, op_id: int) -> tuple[int, int, int, int] | None:
        if op_id not in self:
            return None
        pid, tid, _ = self.pt[op_id].tolist()
        s, e = self.se[op_id].tolist()
        return pid, tid, s, e

    def __getitem__(self, op_id: int) -> tuple[int, int, int, int]:
        got = self.get(op_id)
        if got is None:
            raise KeyError(op_id)
        return got

    def label(self, op_id: int) -> str:
        return self.labels[int(self.pt[op_id, 2])] if op_id in self else f"op {op_id}"


def _fabric_cut(run: Any) -> tuple[int, str]:
    """The number of fabric hops and, when there are more than ``MAX_FABRIC_SLICES``, a
    filter keeping those entering no later than the ``MAX_FABRIC_SLICES``-th earliest (a
    superset of the earliest ``MAX_FABRIC_SLICES`` in the slice order, ties at that time
    included), so the sort is of those rows, not of every hop (1.0 M ops, 20 M fabric
    hops: 16 -> 2 CPU s); the entry times are streamed (``_earliest.Earliest``), or were
    counted by the island twins' scan when ``Run.materialize`` made them (``run._fabric``)."""
    import duckdb

    got = getattr(run, "_fabric", None)
    if got is None or got.k != MAX_FABRIC_SLICES:
        got = Earliest(MAX_FABRIC_SLICES)
        try:
            for b in run.con.sql("SELECT t_enter_ns FROM hops WHERE link_idx >= 0 OR "
                                 "CAST(stage AS VARCHAR) = 'hbm'").to_arrow_reader(1 << 20):
                got.add(b.column(0).to_numpy())
        except duckdb.Error as exc:  # surfaced like Run.sql's
            raise run.error(exc) from exc
    cut = got.cut()
    if cut is None:
        return got.n, ""
    return got.n, f" AND h.t_enter_ns <= CAST('{cut!r}' AS DOUBLE)"   # the exact double


def _stream(run: Any, info: dict[str, Any], tracks: _Tracks):
    """The slice and flow events in order (the metadata, known only at the end, is
    ``tracks.meta()``); memory stays bounded by a batch of rows plus the per-op slots."""
    slot = _Slots()
    top = run.con.sql("SELECT max(op_id) FROM op_timing").fetchall()[0][0]
    if top is not None and top >= 0:    # room for every op at once (doubling held up to 2x
        slot._grow(int(top))            # the ops' rows, and a copy while it grew)
    split = functools.cache(_split)        # a few hundred engines and nodes, 1 M+ calls
    ops = op_rows(run, 1 << 16)         # (numpy, from a single run's file; else the SQL)
    yield from op_slices(ops if ops is not None else _arrow_batches(run, OPS_QUERY, 1 << 16),
                         tracks, slot, split)
    del ops
    trim_heap()     # (the op columns' and their batches' freed arrays, before the fabric's)
    # fabric: link hops and HBM accesses, each a slice on its link's / controller's track
    n_fabric, cut = _fabric_cut(run)
    chains = Chains()
    steps = _Steps()
    link_track: dict[int, tuple[str, str]] = {}
    n_hops = 0
    for ev in fabric_slices(_arrow_batches(
            run,
            "SELECT h.op_id, h.tile, h.hop, h.link_idx, h.t_enter_ns, h.t_leave_ns, h.nbytes, "
            "h.queue_ns, h.busy_ns, "
            "CASE WHEN h.link_idx >= 0 THEN l.src_id ELSE n.node_id END AS node, "
            "l.dst_id, l.kind AS link_kind FROM hops h "
            "LEFT JOIN links l ON l.link_idx = h.link_idx "
            "LEFT JOIN nodes n ON n.node_idx = h.node_idx "
            f"WHERE (h.link_idx >= 0 OR CAST(h.stage AS VARCHAR) = 'hbm'){cut} "
            f"ORDER BY h.t_enter_ns, h.op_id, h.tile, h.hop LIMIT {MAX_FABRIC_SLICES}",
            1 << 16), tracks, slot, split, steps, chains, link_track):
        if isinstance(ev, int):         # (the number of slices, last)
            n_hops = ev
        else:
            yield ev
    info["fabric_slices_left_out"] = int(n_fabric) - n_hops
    yield from _pc_slices(run, slot, tracks, info)
    yield from _counters(run, tracks, steps, link_track, info)
    yield from _flows(run, slot, chains, info)


def _pc_slices(run: Any, slot: _Slots, tracks: _Tracks,
               info: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One track per HBM pseudo-channel that served something (``hbm_ctrl.peP pcK``, in its
    cube's fabric process), one slice per op's back-to-back services there, when the run
    recorded them (``hbm_pcs.parquet``: ``kbtrace replay/run --hbm-pcs``; a single run); at
    most ``MAX_FABRIC_SLICES``, the earliest (as the link slices)."""
    path = run.run_dirs[0] / "hbm_pcs.parquet" if len(run.run_dirs) == 1 else None
    if path is None or not path.is_file():
        return
    import pyarrow.parquet as pq

    src = "read_parquet('" + str(path).replace("'", "''") + "')"
    n = 0
    for node, op_id, pc, write, t0, t1, nb in _batches(
            run, f"SELECT n.node_id, p.op_id, p.pc, p.write, p.t_start_ns, p.t_end_ns, p.nbytes "
                 f"FROM {src} p JOIN nodes n USING (node_idx) "
                 f"ORDER BY p.t_start_ns, p.node_idx, p.pc LIMIT {MAX_FABRIC_SLICES}"):
        n += 1
        s, e = round(t0), round(t1)
        e = max(s, e)
        cube, local = _split(node)
        pid, tid = tracks.place(f"{cube} fabric" if cube else "fabric",
                                f"{local} pc{pc:02d}", s, e)
        yield {"ph": "X", "pid": pid, "tid": tid, "ts": us(s), "dur": us(e - s),
               "name": slot.label(op_id), "cat": "hbm_pc",
               "args": {"op_id": op_id, "nbytes": nb, "write": write}}
    info["pc_slices_left_out"] = pq.ParquetFile(path).metadata.num_rows - n


class _Steps:
    """Per counter (process, track, series): its +- steps as (time, delta), in two compact
    integer arrays (8 bytes a value: a counter gets 2 steps per hop)."""

    def __init__(self) -> None:
        self.t: dict[tuple[str, str, str], array[int]] = {}
        self.d: dict[tuple[str, str, str], array[int]] = {}

    def add(self, key: tuple[str, str, str], t0: int, d0: int, t1: int, d1: int) -> None:
        if key not in self.t:
            self.t[key], self.d[key] = array("q"), array("q")
        self.t[key].extend((t0, t1))
        self.d[key].extend((d0, d1))

    def add_many(self, key: tuple[str, str, str], t0: np.ndarray, d0: np.ndarray,
                 t1: np.ndarray, d1: np.ndarray) -> None:
        """``add`` of each (t0, d0, t1, d1) row of the arrays."""
        if key not in self.t:
            self.t[key], self.d[key] = array("q"), array("q")
        self.t[key].frombytes(np.column_stack([t0, t1]).astype(np.int64).tobytes())
        self.d[key].frombytes(np.column_stack([d0, d1]).astype(np.int64).tobytes())

    def levels(self) -> Iterator[tuple[tuple[str, str, str], np.ndarray, np.ndarray]]:
        """Per counter, in key order: the distinct step times and the value after each."""
        for key in sorted(self.t):
            t = np.frombuffer(self.t[key], dtype=np.int64)
            d = np.frombuffer(self.d[key], dtype=np.int64)
            order = np.lexsort((d, t))
            t, level = t[order], np.cumsum(d[order])
            last = np.r_[t[1:] != t[:-1], True]          # the value after every step at t
            yield key, t[last], level[last]


def _counters(run: Any, tracks: _Tracks, steps: _Steps, link_track: dict[int, tuple[str, str]],
              info: dict[str, Any]) -> Iterator[dict[str, Any] | Encoded]:
    """``C`` events: each counter's step function (one event per distinct time), then each
    link's utilisation per window of ``utilisation_windows`` (ending at the makespan). At most
    ``MAX_COUNTER_EVENTS``: past that, every counter stops at the same time."""
    series = list(steps.levels())
    util: list[tuple[int, str, int, float]] = []        # (pid, track, ns, util)
    if link_track:
        last: dict[int, int] = {}
        for idx, t0, u in run.sql("SELECT resource_idx, t0_ns, util FROM utilisation_windows "
                                  "WHERE resource_kind = 'link' ORDER BY resource_idx, "
                                  "win").rows():
            if idx in link_track:
                last[idx] = tracks.pid(link_track[idx][0])
                util.append((last[idx], link_track[idx][1], round(t0), round(u, 6)))
        ms = round(run.makespan_ns)
        util += [(pid, link_track[idx][1], ms, 0.0) for idx, pid in sorted(last.items())]
    times = np.concatenate([t for _, t, _ in series] + [np.array([u[2] for u in util], np.int64)])
    cut = None
    if len(times) > MAX_COUNTER_EVENTS:          # every counter up to one time, not beyond
        cut = int(np.partition(times, MAX_COUNTER_EVENTS - 1)[MAX_COUNTER_EVENTS - 1])
        if int((times <= cut).sum()) > MAX_COUNTER_EVENTS:   # ties at the cut: stop before
            cut -= 1
        info["counter_events_left_out"] = int((times > cut).sum())
    yield from counter_steps(series, tracks.pid, cut)      # (encoded as columns)
    for pid, track, ts, u in util:
        if cut is None or ts <= cut:
            yield {"ph": "C", "pid": pid, "name": track, "ts": us(ts), "args": {"util": u}}


def trace_events(run: Any, info: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Trace events for an open Run (deterministic order); ``info`` receives the counts of
    what was left out (fabric slices, flows) on large runs. (``export_perfetto`` streams the
    same events to its file instead of holding them.)"""
    info = {} if info is None else info
    tracks = _Tracks()
    events: list[dict[str, Any]] = []
    for ev in _stream(run, info, tracks):
        if isinstance(ev, Encoded):
            events.extend(ev.events())
        else:
            events.append(ev)
    return tracks.meta() + events


def _flows(run: Any, slot: _Slots, chains: Chains, info: dict[str, Any]):
    """One flow per transfer (op -> each link -> receive or last link; ``_perfetto_flows``),
    one per cross-engine dependency; every point inside the slice it binds to (integer ns).
    At most ``MAX_FLOWS``; the dependency rows past that are counted in SQL, not fetched."""
    recv_of = dict(run.sql("SELECT op_id, match_op_id FROM ops WHERE kind = 'send' "
                           "AND match_op_id IS NOT NULL ORDER BY op_id").rows())
    done: list[str] = []        # points encoded (as json.dumps would), not yet handed on

    def point(ph: str, fid: int, pid: int, tid: int, ts: int, cat: str) -> Encoded | None:
        done.append(f'{{"ph":"{ph}","id":{fid},"pid":{pid},"tid":{tid},"ts":"{us(ts)}",'
                    f'"name":"{cat}","cat":"flow.{cat}"' + (',"bp":"e"}' if ph == "f" else "}"))
        if len(done) < _BATCH:
            return None
        out = Encoded(",".join(done).encode(), len(done))
        done.clear()
        return out

    total, n, points = chain_flows(chains, slot, recv_of, MAX_FLOWS)
    yield from points
    # every dependency row joins two op_timing rows, so both ops have a slice: the rows
    # past the MAX_FLOWS already drawn are only counted
    limit = max(0, MAX_FLOWS - n)
    deps = cross_engine_deps(run, limit)    # (numpy, from a single run's files; else the SQL)
    if deps is None:
        n_deps = int(run.sql(f"SELECT count(*) AS n FROM ({DEPS_QUERY})").item())
        pairs: Iterator[tuple[Any, ...]] = _batches(run, f"{DEPS_QUERY} ORDER BY 1, 2 LIMIT {limit}")
    else:
        n_deps, first_dep, first_op = deps
        pairs = zip(first_dep.tolist(), first_op.tolist(), strict=True)
    for src, dst_op in pairs:
        if src not in slot or dst_op not in slot:
            continue
        n += 1
        sp, st, s0, s1 = slot[src]
        dp, dt, d0, _ = slot[dst_op]
        if ev := point("s", n, sp, st, max(s0, s1 - 1), "dep"):  # inside the producer's slice
            yield ev
        if ev := point("f", n, dp, dt, d0, "dep"):
            yield ev
    if done:
        yield Encoded(",".join(done).encode(), len(done))
    info["flows_left_out"] = total + n_deps - n


def _write(path: Path, events: Any, tracks: _Tracks, other: Any) -> int:
    """Write ``{"traceEvents": meta + events, "displayTimeUnit": "ns", "otherData": other()}``
    as compact JSON, byte for byte what ``json.dumps(doc, separators=(",", ":"))`` writes,
    without holding the events: they are encoded ``_BATCH`` at a time into an unnamed
    temporary file beside ``path``, then copied after the metadata (known only at the end)."""
    import shutil
    import tempfile

    enc = json.JSONEncoder(separators=(",", ":")).encode
    n = 0
    with tempfile.TemporaryFile(dir=path.parent) as body:
        buf: list[dict[str, Any]] = []
        for ev in events:
            if isinstance(ev, Encoded):     # a batch encoded already (_perfetto_ops)
                if buf:
                    body.write((b"," if n else b"") + enc(buf)[1:-1].encode())
                    n += len(buf)
                    buf = []
                if ev.n:
                    body.write((b"," if n else b"") + ev.data)
                    n += ev.n
                continue
            buf.append(ev)
            if len(buf) >= _BATCH:
                body.write((b"," if n else b"") + enc(buf)[1:-1].encode())
                n += len(buf)
                buf = []
        if buf:
            body.write((b"," if n else b"") + enc(buf)[1:-1].encode())
            n += len(buf)
        meta = tracks.meta()
        with open(path, "wb") as f:
            f.write(b'{"traceEvents":[' + enc(meta)[1:-1].encode())
            if meta and n:
                f.write(b",")
            body.seek(0)
            shutil.copyfileobj(body, f, 1 << 20)
            f.write(b'],"displayTimeUnit":"ns","otherData":' + enc(other()).encode() + b"}")
    return len(meta) + n


def export_perfetto(run: Any, out: str | os.PathLike[str]) -> int:
    """Write the run's timeline as trace-event JSON; return the number of events."""
    from kbtrace.analysis.run import Run, open_run

    owned = not isinstance(run, Run)
    r = open_run(run) if owned else run
    try:
        left: dict[str, Any] = {}
        tracks = _Tracks()
        from kbtrace.analysis.reporter import run_inputs
        with atomic_path(Path(out), run_inputs(r.run_dirs, r.trace_dir)) as tmp:
            n = _write(tmp, _stream(r, left, tracks), tracks, lambda: {
                "run": str(r.path), "run_id": str(r.info.get("run_id")),
                "makespan_ns": r.makespan_ns, "time": "integer ns",
                **{k: v for k, v in left.items() if v}})
        return n
    finally:
        if owned:
            r.close()

"""kbtrace diff / summaries / baselines on synthetic runs."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from kbtrace._io import write_table
from kbtrace.analysis.differ import diff, parse_rule
from kbtrace.analysis.summary import load_summary, summarize, write_summary
from kbtrace.analysis.synthetic import write_synthetic_run
from kbtrace.cli import main
from kbtrace.errors import AnalysisError


def _scale_op(run, op_id, factor):
    """Stretch one op (and everything after its start) by ``factor``: a slower op."""
    t = pq.read_table(run / "op_timing.parquet")
    start = t.column("t_start_ns").to_pylist()[t.column("op_id").to_pylist().index(op_id)]
    cols = {}
    for c in ("t_issue_ns", "t_start_ns", "t_end_ns"):
        v = t.column(c)
        cols[c] = pc.if_else(pc.greater(v, start),
                             pc.add(start, pc.multiply(pc.subtract(v, start), factor)), v)
    for c, v in cols.items():
        t = t.set_column(t.schema.get_field_index(c), t.schema.field(c), v)
    write_table(run / "op_timing.parquet", t)
    h = pq.read_table(run / "hops.parquet")
    for c in ("t_enter_ns", "t_leave_ns"):
        v = h.column(c)
        h = h.set_column(h.schema.get_field_index(c), h.schema.field(c),
                         pc.if_else(pc.greater(v, start),
                                    pc.add(start, pc.multiply(pc.subtract(v, start), factor)), v))
    write_table(run / "hops.parquet", h)


@pytest.fixture()
def base(tmp_path):
    return write_synthetic_run(tmp_path / "base")


def test_self_diff_no_change(base, capsys):
    res = diff(base, base, ["makespan>2%", "stage.dma_read>5%", "op.max>1%"])
    assert res.unchanged and not res.failed and res.n_matched == 9
    assert main(["diff", str(base), str(base), "--fail-on", "makespan>2%"]) == 0
    out = capsys.readouterr().out
    assert "verdict: no change" in out and "ops: 9 matched, 0 added, 0 removed" in out


def test_regression_fails_and_reports(base, tmp_path, capsys):
    new = write_synthetic_run(tmp_path / "new")
    _scale_op(new, 8, 2.0)        # the final store takes 60 ns instead of 30
    res = diff(base, new, ["makespan>2%"])
    m = res.metrics["makespan"]
    assert (m.base, m.new, round(m.pct, 4)) == (180.0, 210.0, 16.6667)
    assert res.failed and res.violations[0].startswith("makespan changed by +16.67%")
    assert res.metrics["stage.dma_write"].abs == 30.0
    top = res.changed.row(0, named=True)
    assert (top["seq"], top["kind"], top["delta_ns"]) == (3, "store", 30.0)
    assert not diff(base, new, ["makespan>20%"]).failed
    assert diff(base, new, ["stage.dma_write>50%"]).failed       # 30 -> 60 = +100%
    assert not diff(base, new, ["stage.gemm>0"]).failed
    rc = main(["diff", str(base), str(new), "--fail-on", "makespan>2%", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["failed"] and doc["metrics"]["makespan"]["delta"] == 30.0
    assert main(["diff", str(base), str(new), "-f", "md"]) == 0
    assert "| makespan | 180 | 210 | +30 | +16.67% |" in capsys.readouterr().out


def test_added_removed_ops(base, tmp_path):
    new = write_synthetic_run(tmp_path / "new")
    t = pq.read_table(new / "op_timing.parquet")
    t = t.filter(pc.not_equal(t.column("op_id"), 3))            # drop the wait
    write_table(new / "op_timing.parquet", t)
    res = diff(base, new, ["ops.removed>0"])
    assert res.removed.rows() == [(0, 0, 3, "wait", "wait")] and res.added.height == 0
    assert res.failed
    res2 = diff(new, base)
    assert res2.added.rows() == [(0, 0, 3, "wait", "wait")] and not res2.failed


def test_baseline_roundtrip_is_small_and_deterministic(base, tmp_path):
    a = write_summary(summarize(base), tmp_path / "bl_a")
    b = write_summary(summarize(base), tmp_path / "bl_b")
    for f in ("summary.json", "ops.parquet"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    s = load_summary(a)
    assert s.makespan_ns == 180.0 and s.stages["idle"] == 5.0
    assert diff(a, base, ["makespan>0%", "op.max>0%"]).unchanged


def test_bad_rules():
    assert parse_rule("stage.dma_read>5%").percent
    with pytest.raises(AnalysisError, match="expected METRIC>VALUE"):
        parse_rule("makespan bigger")


def test_unknown_metric(base):
    with pytest.raises(AnalysisError, match="unknown metric"):
        diff(base, base, ["makspan>2%"])
    with pytest.raises(AnalysisError, match="unknown metric"):
        diff(base, base, ["stage.dmaread>2%"])
    # a util rule naming no node/link kind used to match nothing and never fire
    for bad in ("util.hbm_ctrl<-10%", "util.node.hbm_ctlr>1%", "util.link.hbm_ctrl>1%"):
        with pytest.raises(AnalysisError, match="unknown metric 'util"):
            diff(base, base, [bad])
    assert not diff(base, base, ["util.node.hbm_ctrl<-10%", "util.link.pcie>1%"]).failed


def test_util_metric(base):
    res = diff(base, base)
    assert res.metrics["util.node.hbm_ctrl"].base == pytest.approx(75 / 180)


def _set_durations(run, durs):
    """Give ops new durations (t_end = t_start + dur), nothing else moved."""
    t = pq.read_table(run / "op_timing.parquet")
    ids, start = t.column("op_id").to_pylist(), t.column("t_start_ns").to_pylist()
    end = t.column("t_end_ns").to_pylist()
    for op, dur in durs.items():
        end[ids.index(op)] = start[ids.index(op)] + dur
    i = t.schema.get_field_index("t_end_ns")
    write_table(run / "op_timing.parquet",
                t.set_column(i, t.schema.field(i), pa.array(end, t.schema.field(i).type)))


def test_op_max_is_one_op_in_verdict_table_and_json(base, tmp_path, capsys):
    new = write_synthetic_run(tmp_path / "new")
    # op 7 math/exp 30 -> 45 ns (+15, +50%: the largest relative change);
    # op 1 composite/gemm 60 -> 84 ns (+24, +40%: the largest absolute change)
    _set_durations(new, {7: 45.0, 1: 84.0})
    res = diff(base, new, ["op.max>10%"])
    d = res.metrics["op.max"]
    assert (d.base, d.new, d.abs, d.pct) == (30.0, 45.0, 15.0, 50.0)
    assert res.op_max == {"launch": 0, "program": 1, "seq": 2, "kind": "math", "name": "exp"}
    assert res.violations == ["op.max changed by +50% (30 -> 45, launch 0 program 1 seq 2 "
                              "math/exp), rule op.max>10%"]
    assert not diff(base, new, ["op.max>50%"]).failed and diff(base, new, ["op.max>=50%"]).failed
    # a bare value compares the same op's change in ns
    assert diff(base, new, ["op.max>10"]).failed and not diff(base, new, ["op.max>15"]).failed
    assert main(["diff", str(base), str(new), "--fail-on", "op.max>10%"]) == 1
    out = capsys.readouterr().out
    assert "verdict: REGRESSION: op.max changed by +50% (30 -> 45, launch 0 program 1" in out
    assert " ".join(next(ln for ln in out.splitlines() if ln.startswith("op.max ")).split()) == \
        "op.max 30 45 +15 +50.00%"
    assert "op.max is launch 0 program 1 seq 2 math/exp (largest relative per-op change)" in out
    assert main(["diff", str(base), str(new), "-f", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["metrics"]["op.max"]
    assert doc == {"base": 30.0, "new": 45.0, "delta": 15.0, "pct": 50.0,
                   "op": {"launch": 0, "program": 1, "seq": 2, "kind": "math", "name": "exp"}}


def test_op_max_catches_a_large_speed_up(base, tmp_path):
    new = write_synthetic_run(tmp_path / "new")
    _set_durations(new, {5: 6.0, 7: 33.0})      # op 5 load 60 -> 6 ns (-90%); op 7 +10%
    res = diff(base, new, ["op.max>80%"])
    d = res.metrics["op.max"]
    assert (d.base, d.new, d.abs, round(d.pct, 6)) == (60.0, 6.0, -54.0, -90.0)
    assert res.violations == ["op.max changed by -90% (60 -> 6, launch 0 program 1 seq 0 "
                              "load/load), rule op.max>80%"]
    assert not diff(base, new, ["op.max>90%"]).failed
    # the reverse diff: 6 -> 60 ns is +900%
    assert diff(new, base, ["op.max>800%"]).violations[0].startswith("op.max changed by +900% "
                                                                      "(6 -> 60, launch 0 program 1")

"""``benchmarks/bench_costs.py``'s arithmetic: a cachegrind file's per-function counts, the
per-op difference of two runs, and Cython's mangled names made readable (the replays under
valgrind are its ``benchmark`` test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_costs import demangle, main, marginal, parse, report  # noqa: E402

# cachegrind's format: a function's lines, each "line Ir D1mr ..." (a function may recur
# under another file: its counts add up)
SMALL = """desc: I1 cache: 32768 B, 64 B, 8-way associative
cmd: python child.py
events: Ir D1mr D1mw DLmr DLmw
fl=/a.c
fn=hot
10 100 5 1 2 0
11 50 0 0 0 1
fn=startup
3 1000 10 0 4 0
fl=/b.c
fn=hot
7 50 0 0 0 0
summary: 1200 15 1 6 1
"""

LARGE = """events: Ir D1mr D1mw DLmr DLmw
fl=/a.c
fn=hot
10 400 25 3 8 2
fn=startup
3 1000 10 0 4 0
fn=new
1 60 1 0 3 1
"""


def test_parse_sums_a_function_over_its_lines_and_files():
    events, funcs = parse(SMALL.splitlines())
    assert events == ["Ir", "D1mr", "D1mw", "DLmr", "DLmw"]
    assert funcs["hot"] == [200, 5, 1, 2, 1]
    assert funcs["startup"] == [1000, 10, 0, 4, 0]


def test_marginal_is_the_difference_per_added_op():
    per_op = marginal(parse(SMALL.splitlines()), parse(LARGE.splitlines()), 100)
    assert per_op["hot"] == {"Ir": 2.0, "D1mr": 0.2, "D1mw": 0.02, "DLmr": 0.06, "DLmw": 0.01}
    assert per_op["startup"] == {e: 0.0 for e in ("Ir", "D1mr", "D1mw", "DLmr", "DLmw")}
    assert per_op["new"]["Ir"] == 0.6


def test_report_orders_by_cost_and_gives_the_deltas_of_a_second_tree():
    a = marginal(parse(SMALL.splitlines()), parse(LARGE.splitlines()), 100)
    b = {fn: {e: v * 0.5 for e, v in c.items()} for fn, c in a.items()}
    text = report([{"src": "A", "core": "compiled", "ops": (1, 101), "per_op": a},
                   {"src": "B", "core": "compiled", "ops": (1, 101), "per_op": b}], top=2)
    lines = text.splitlines()
    assert lines[2] == "| A | compiled | 1 → 101 | 3 | 0 | 0 | 0 | 0 |"
    top = lines[lines.index("Top 2 functions of A by instructions per op:") + 4]
    assert top.startswith("| hot | 2.0 |") and top.endswith("| 76.9% |")
    assert "B against A: Ir per op -1, LL misses per op -0.1" in text


@pytest.mark.parametrize(("mangled", "readable"), [
    ("__pyx_f_7kbtrace_6replay_6fabric_9_routes_c_5_Plan_take", "routes._Plan.take"),
    ("__pyx_pw_7kbtrace_6replay_6fabric_7_fair_c_4Flow_5done", "fair.Flow.done"),
    ("__pyx_pf_7kbtrace_6replay_6fabric_10_segsort_c_6windows.constprop.0", "segsort.windows"),
    ("__pyx_f_7kbtrace_6replay_6fabric_7_fair_c_fair_hop", "fair.fair_hop"),
    ("__pyx_tp_dealloc_7kbtrace_6replay_6fabric_7_fair_c_Flow", "dealloc fair.Flow"),
    ("__pyx_f_7kbtrace_6replay_6fabric_11_stations_c_9DmaServer_route",
     "stations.DmaServer.route"),
    ("_PyEval_EvalFrameDefault", "_PyEval_EvalFrameDefault"),
    ("__pyx_pymod_exec_lib", "__pyx_pymod_exec_lib"),
])
def test_demangle(mangled, readable):
    assert demangle(mangled) == readable


def test_bad_sizes_and_trees_are_refused_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--ops", "30000", "30000"])
    assert e.value.code == 2
    assert "--ops: two different sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--src", str(tmp_path)])
    assert e.value.code == 2
    assert "no kbtrace package there" in capsys.readouterr().err

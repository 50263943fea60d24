"""An open run bounds DuckDB's memory (issue 22, target 3): a memory limit, a spill
directory of kbtrace's own that ``close`` removes, and an actionable line for a bad limit."""

from __future__ import annotations

import gc

import pytest

from kbtrace.analysis._memory import MEMORY_ENV
from kbtrace.analysis.run import open_run
from kbtrace.capture import capture
from kbtrace.errors import UsageError
from kbtrace.replay import ReplayOptions, replay
from test_replay_util import TOPO_DIR


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mem")
    capture(TOPO_DIR.parent / "capture" / "softmax.py", TOPO_DIR / "tiny.yaml", {}, d / "tr")
    return replay(d / "tr", TOPO_DIR / "tiny.yaml", ReplayOptions(out_dir=str(d / "run"))).run_dir


def test_open_run_limits_duckdb_memory_and_cleans_its_spill_directory(run_dir, monkeypatch):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    r = open_run(run_dir)
    (limit, tmp), = r.con.sql("SELECT current_setting('memory_limit'), "
                              "current_setting('temp_directory')").fetchall()
    spill = r._spill_dir
    assert limit == "488.2 MiB" and tmp == str(spill) and spill.is_dir()
    r.close()
    assert not spill.exists()
    monkeypatch.setenv(MEMORY_ENV, "2GB")
    with open_run(run_dir) as r:
        assert r.con.sql("SELECT current_setting('memory_limit')").fetchall() == [("1.8 GiB",)]


def test_a_run_never_closed_still_removes_its_spill_directory(run_dir):
    # a notebook's `run = open_run(...)`, dropped without close: the directory (DuckDB's temp
    # files, the twins' Parquet files: ~0.6 GB at 1 M ops) goes with the run, not left in /tmp
    r = open_run(run_dir)
    spill = r._spill_dir
    (spill / "twin-x.parquet").write_bytes(b"x")
    del r
    gc.collect()
    assert spill is not None and not spill.exists()


def test_a_bad_memory_limit_is_one_usage_line(run_dir, monkeypatch):
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(UsageError, match=r"^KBTRACE_DUCKDB_MEMORY='lots' is not a memory size; "
                                         r"use e.g. 1GB or 512MB$"):
        open_run(run_dir)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024


def test_release_cache_hands_back_what_a_finished_query_kept(run_dir, monkeypatch):
    """DuckDB keeps a finished sort's memory (outside ``duckdb_memory()``) until its limit is
    set again: ``release_cache`` sets the limit ``open_run`` chose (not the environment's now),
    keeps the connection's tables, and does nothing on a sandboxed run."""
    from kbtrace.analysis._memory import release_cache

    monkeypatch.setenv(MEMORY_ENV, "2GB")
    with open_run(run_dir) as r:
        monkeypatch.setenv(MEMORY_ENV, "1GB")
        r.con.execute("CREATE TEMP TABLE keep AS SELECT 42 AS x")
        before = _rss_mib()
        for _ in r.con.sql("SELECT i, i::VARCHAR AS s FROM range(2000000) t(i) "
                           "ORDER BY hash(i)").to_arrow_reader(1 << 16):
            pass
        held = _rss_mib() - before
        release_cache(r.con)
        assert held > 60 and _rss_mib() - before < held - 60     # ~150 -> ~40 MiB
        assert r.con.sql("SELECT current_setting('memory_limit'), (SELECT x FROM keep)"
                         ).fetchall() == [("1.8 GiB", 42)]
    with open_run(run_dir, sandbox=True) as r:     # (opened under 1GB)
        release_cache(r.con)        # its configuration is locked: nothing, no error
        assert r.con.sql("SELECT current_setting('memory_limit')").fetchall() == [
            ("953.6 MiB",)]

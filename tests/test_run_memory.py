"""``kbtrace run`` gives freed memory back between its stages (issue 22, target 3), so a
stage's peak does not stack on what the one before it freed."""

from __future__ import annotations

import kbtrace.analysis.main as main_mod
import kbtrace.analysis.perfetto as perfetto_mod
import kbtrace.analysis.reporter as reporter_mod
from kbtrace.analysis.main import run_workload


def test_memory_is_released_between_the_report_and_the_timeline(tmp_path, monkeypatch):
    """On the kept 1.0 M-op gemm run the timeline's peak fell 731/700 -> 668/685 MiB with it."""
    calls: list[str] = []

    def recorded(name, fn):
        def wrapper(*a, **k):
            calls.append(name)
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(main_mod, "release_memory",
                        recorded("release", main_mod.release_memory))
    monkeypatch.setattr(reporter_mod, "report", recorded("report", reporter_mod.report))
    monkeypatch.setattr(perfetto_mod, "export_perfetto",
                        recorded("timeline", perfetto_mod.export_perfetto))
    s = run_workload("gemm", topology="small", out=tmp_path / "data", verify_data=False,
                     attribute=False)
    assert s.perfetto.is_file()
    i = calls.index("report")
    assert calls[i:i + 3] == ["report", "release", "timeline"]

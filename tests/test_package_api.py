"""The top-level package surface: lazy exports and callable stage packages."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_stage_packages_are_callable_in_any_import_order() -> None:
    # submodule imported first, then the top-level name used as a function
    assert _run("import kbtrace.replay, kbtrace; print(callable(kbtrace.replay), "
                "kbtrace.replay.ReplayOptions.__name__)") == "True ReplayOptions"
    assert _run("import kbtrace; f = kbtrace.capture; import kbtrace.capture.trace; "
                "print(callable(kbtrace.capture), kbtrace.capture.open_trace.__name__)") \
        == "True open_trace"


def test_lazy_exports_resolve() -> None:
    import kbtrace
    for name in kbtrace.__all__:
        assert getattr(kbtrace, name) is not None, name


def test_stage_package_exports_resolve() -> None:
    # every name a stage package lists in __all__ must import (README: `from kbtrace.analysis
    # import export_perfetto, run_workload, summarize, catalogue_markdown`)
    import importlib
    for pkg in ("kbtrace.topology", "kbtrace.capture", "kbtrace.replay", "kbtrace.analysis"):
        mod = importlib.import_module(pkg)
        for name in mod.__all__:
            assert getattr(mod, name) is not None, f"{pkg}.{name}"
    from kbtrace.analysis import summarize
    assert summarize.__module__ == "kbtrace.analysis.summary"


def test_cli_parser_and_replay_do_not_import_the_analysis_stack() -> None:
    """Building the CLI parser (every command) and a replay need neither polars, duckdb nor
    matplotlib: importing them would add ~0.2-0.5 s to every command and replay process."""
    code = (
        "import sys\n"
        "from kbtrace.cli import build_parser\n"
        "build_parser()\n"
        "import kbtrace.replay.engine\n"
        "print(sorted(m for m in ('polars', 'duckdb', 'matplotlib') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

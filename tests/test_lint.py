"""The code base stays clean under the project's ruff rule set (pyproject [tool.ruff])."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff not installed (pip install -e '.[test]')")
def test_ruff_clean() -> None:
    res = subprocess.run(["ruff", "check", "src", "tests", "benchmarks", "scripts"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr

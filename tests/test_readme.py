"""README.md's generated sections match the code and docs/ they are copied from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gen():
    spec = importlib.util.spec_from_file_location("gen_readme", ROOT / "scripts" / "gen_readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_generated_sections_are_current() -> None:
    text = (ROOT / "README.md").read_text()
    assert _gen().render(text) == text, "README.md is stale: run python scripts/gen_readme.py"


def test_readme_includes_every_stage_page_once() -> None:
    """Each docs/<stage>.md is copied in between both markers: a lost BEGIN marker left the
    topology page as a stale hand copy that the render check above could not see."""
    text = (ROOT / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        rel = f"docs/{page.name}"
        assert text.count(f"<!-- BEGIN:include {rel} -->") == 1, rel
        assert text.count(f"<!-- END:include {rel} -->") == 1, rel


def test_readme_quick_start_has_exactly_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    cmds = [ln for ln in block.splitlines() if ln.strip()]
    assert len(cmds) == 2
    assert cmds[0].startswith("pip install -e . && kbtrace run")
    assert cmds[1].startswith("pip install -e '.[test]' && python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && python -m pytest" in ci


def test_readme_typical_session_runs(tmp_path, monkeypatch, capsys) -> None:
    """Every command of the quick start's "typical session" works, in a fresh directory,
    after the main job (``kbtrace run``): the names it uses resolve, the exit codes are 0."""
    import shlex

    from kbtrace.cli import main

    text = (ROOT / "README.md").read_text()
    block = text.split("A typical session after that:", 1)[1].split("```bash", 1)[1]
    lines = [ln for ln in block.split("```", 1)[0].splitlines() if ln.strip()]
    assert len(lines) >= 6 and all(ln.startswith("kbtrace ") for ln in lines)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--no-report", "--no-verify"]) == 0
    for ln in lines:
        argv = shlex.split(ln, comments=True)[1:]
        assert main(argv) == 0, (ln, capsys.readouterr().err)
    assert (tmp_path / "gemm.json").is_file()
    assert (tmp_path / "data" / "sweeps" / "hbm_bandwidth" / "points.parquet").is_file()
    assert (tmp_path / "data" / "runs" / "softmax-hbm16" / "run.json").is_file()


def test_contents_links_use_githubs_anchors() -> None:
    """The generated contents: GitHub's anchors (markup and punctuation dropped, repeats
    numbered), one link per ``##`` / ``###`` heading outside code fences."""
    gen = _gen()
    seen: dict[str, int] = {}
    assert gen._anchor("`kbtrace run` — the main job", seen) == "kbtrace-run--the-main-job"
    assert gen._anchor("Topology: hardware YAML → compiled `Topology`", seen) == \
        "topology-hardware-yaml--compiled-topology"
    assert [gen._anchor("CLI", seen) for _ in range(3)] == ["cli", "cli-1", "cli-2"]
    toc = gen._contents("# T\n## A b\n```\n## not a heading\n```\n### C\n## A b\n#### deep\n")
    assert toc == "- [A b](#a-b)\n  - [C](#c)\n- [A b](#a-b-1)\n"
    text = (ROOT / "README.md").read_text()
    assert "- [Quick start](#quick-start)\n" in text
    assert "  - [`kbtrace diff` — CI gate](#kbtrace-diff--ci-gate)\n" in text

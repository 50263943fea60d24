"""pymalloc's arenas on transparent huge pages (``kbtrace._hugearena``, ``kbtrace._hugepages``).

The allocator changes a whole process and can not be undone, so every check that installs it
runs in a fresh interpreter. Skipped where the extension is not built (not Linux, no C
compiler); in CI (``CI`` set, Linux) it must be built, as the compiled replay core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kbtrace import _hugepages

ROOT = Path(__file__).resolve().parents[1]

try:
    from kbtrace import _hugearena  # type: ignore[attr-defined]  # noqa: F401
    BUILT = True
except ImportError:
    BUILT = False

needs_ext = pytest.mark.skipif(not BUILT, reason="kbtrace._hugearena is not built")
#: what install() answers on this machine when nothing switches it off
EXPECTED = ("installed" if _hugepages.thp_mode() not in (None, "never")
            else f"off (transparent huge pages: {_hugepages.thp_mode() or 'none'})")


def _python(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line, parsed as JSON."""
    full = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    full.pop(_hugepages.ENV, None)
    full.update(env or {})
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_built_in_ci():
    if not (os.environ.get("CI") and sys.platform.startswith("linux")):
        pytest.skip("outside CI (or off Linux) the extension is optional")
    assert BUILT


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert _hugepages.thp_mode(str(f)) == "madvise"
    f.write_text("always madvise [never]\n")
    assert _hugepages.thp_mode(str(f)) == "never"
    assert _hugepages.thp_mode(str(tmp_path / "missing")) is None


_CHURN = """
import json, sys
from kbtrace import _hugearena, _hugepages
before = [str(i) * 3 for i in range(300_000)]      # arenas of the allocator before install
status = _hugepages.install()
s0 = _hugearena.stats()
total, arenas_high, chunks = 0, 0, []
for rnd in range(3):
    objs = [(i, str(i), [i, i + 1]) for i in range(1_000_000)]     # ~250 MiB of small objects
    arenas_high = max(arenas_high, _hugearena.stats()["arenas"])
    chunks.append(_hugearena.stats()["chunks"])
    assert all(t[0] == i and t[1] == str(i) and t[2][1] == i + 1 for i, t in enumerate(objs))
    total += sum(t[2][0] for t in objs)
    del objs
del before                          # freed through the hook into the allocator they came from
hg = 0
cur = None
for line in open("/proc/self/smaps"):
    if "-" in line.split()[0] and not line.startswith(("VmFlags", "Name")):
        cur = line
    elif line.startswith("VmFlags") and " hg" in line:
        hg += 1
after = [str(i) for i in range(200_000)]
print(json.dumps({"status": status, "s0": s0, "end": _hugearena.stats(), "total": total,
                  "arenas_high": arenas_high, "chunks": chunks, "hg_vmas": hg, "after": after[-1]}))
"""


@needs_ext
def test_python_allocates_and_frees_millions_of_objects_on_the_arenas():
    out = _python(_CHURN)
    assert out["status"] == EXPECTED
    assert out["total"] == 3 * sum(range(1_000_000))
    assert out["after"] == "199999"
    if EXPECTED != "installed":
        assert out["end"]["installed"] is False
        return
    end = out["end"]
    assert out["s0"]["installed"] is True and out["s0"]["chunks"] == 0
    assert end["arena_size"] in (256 << 10, 1 << 20)      # CPython's ARENA_SIZE
    assert end["passed_on"] == 0                          # every arena in a chunk
    # ~250 MiB of objects per round: > 100 MiB of arenas in the chunks at once, back to a
    # handful after each del (their 2 MiB blocks given back), the same chunks reused
    assert out["arenas_high"] * end["arena_size"] > 100 << 20
    assert end["arenas"] < out["arenas_high"] // 4
    assert end["blocks_released"] * (2 << 20) >= 3 * 50 << 20
    assert 2 <= out["chunks"][0] == out["chunks"][-1] == end["chunks"] <= 8
    assert out["hg_vmas"] >= 1                            # the chunks are madvised huge


@needs_ext
def test_switch_off_and_thp_never_leave_the_allocator_alone(tmp_path):
    code = ("import json\nfrom kbtrace import _hugearena, _hugepages\n{pre}"
            "s = _hugepages.install()\nx = [str(i) for i in range(500_000)]\n"
            "print(json.dumps({{'status': s, 'again': _hugepages.install(), "
            "'stats': _hugearena.stats()}}))")
    out = _python(code.format(pre=""), {_hugepages.ENV: "0"})
    assert out["status"] == out["again"] == "off (KBTRACE_HUGE_PAGES=0)"
    assert out["stats"]["installed"] is False and out["stats"]["chunks"] == 0
    never = tmp_path / "enabled"
    never.write_text("always madvise [never]\n")
    out = _python(code.format(pre=f"_hugepages.THP_ENABLED = {str(never)!r}\n"))
    assert out["status"] == "off (transparent huge pages: never)"
    assert out["stats"]["installed"] is False


@needs_ext
def test_importing_kbtrace_or_calling_main_does_not_install():
    out = _python("import json\nimport kbtrace, kbtrace.replay, kbtrace.analysis\n"
                  "from kbtrace.cli import main\nmain(['--quiet', 'topo', 'show', "
                  "'topologies/tiny.yaml'])\nfrom kbtrace import _hugearena, _hugepages\n"
                  "print(json.dumps([_hugearena.stats()['installed'], _hugepages.status()]))")
    assert out == [False, "not installed"]


@needs_ext
def test_a_sweep_worker_installs_as_its_parent_did():
    from kbtrace.replay import _sweepsafe
    code = ("import json, os\nfrom kbtrace.replay._sweepsafe import worker_init\n"
            "from kbtrace import _hugepages\nworker_init(os.getppid(), {flag})\n"
            "print(json.dumps(_hugepages.status()))")
    assert _python(code.format(flag=True)) == EXPECTED
    assert _python(code.format(flag=False)) == "not installed"
    assert _sweepsafe.worker_init.__defaults__ == (False,)


@needs_ext
def test_cli_replay_writes_identical_files_with_and_without(tmp_path):
    """The ``kbtrace`` command (``python -m kbtrace``) installs it (``-vv`` says so); a replay
    with and without writes byte-identical files (run.json but for its wall time)."""
    from kbtrace.capture import capture
    capture(ROOT / "capture" / "gemm.py", ROOT / "topologies" / "small.yaml",
            {"M": 128, "N": 128, "K": 256}, tmp_path / "trace")
    said = {}
    for on in ("1", "0"):
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), _hugepages.ENV: on}
        res = subprocess.run([sys.executable, "-m", "kbtrace", "-vv", "replay",
                              str(tmp_path / "trace"), "--topology", "topologies/small.yaml",
                              "-o", str(tmp_path / f"run{on}")], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        said[on] = [ln for ln in res.stderr.splitlines() if "huge pages" in ln]
    assert said["1"] == [f"kbtrace: debug: pymalloc's arenas on huge pages: {EXPECTED}"]
    assert said["0"] == ["kbtrace: debug: pymalloc's arenas on huge pages: off "
                         "(KBTRACE_HUGE_PAGES=0)"]
    files = sorted(p.relative_to(tmp_path / "run1") for p in (tmp_path / "run1").rglob("*")
                   if p.is_file())
    assert Path("hops.parquet") in files and Path("run.json") in files
    for rel in files:
        a, b = ((tmp_path / d / rel).read_bytes() for d in ("run1", "run0"))
        if rel == Path("run.json"):
            a, b = ({k: v for k, v in json.loads(x).items() if k != "wall_s"} for x in (a, b))
        assert a == b, rel


_FAULTS = """
import json, resource
from kbtrace import _hugepages
status = _hugepages.install()
def rounds(n):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        b = bytearray(64 << 20)      # a block past glibc's default mmap threshold, touched whole
        del b
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
rounds(1)
print(json.dumps([status, _hugepages.malloc_status(), rounds(3)]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_block_is_reused_without_faulting_its_pages_in_again():
    """``install()`` keeps freed blocks up to 1 GiB mapped: three more 64 MiB blocks after the
    first fault in (next to) nothing; with ``KBTRACE_MALLOC_KEEP=0`` each is a fresh mapping
    whose 16,384 pages fault in as it is zeroed (unless the kernel backs it with huge pages)."""
    _huge, kept, faults = _python(_FAULTS)
    assert kept == "kept"
    assert faults < 1_000
    _huge, off, faults_off = _python(_FAULTS, {_hugepages.MALLOC_ENV: "0"})
    assert off == "off (KBTRACE_MALLOC_KEEP=0)"
    if _hugepages.thp_mode() != "always":
        assert faults_off > 3 * 16_384 * 0.9

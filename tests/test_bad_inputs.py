"""Catalogue of bad inputs (issue 21, classes 2-4 and 8-11): each case builds its inputs in
a fresh directory, runs one ``kbtrace`` command in-process, and asserts

* the exit code,
* stderr: exactly one line, ``kbtrace: error: ...`` matching the case's pattern (no
  traceback; a case that must succeed asserts its warnings instead),
* that nothing in the directory changed except the command's declared output (every file's
  bytes are snapshot before and after).

The inputs come from one real capture + replay of gemm on tiny.yaml (copied per case and
then damaged), hand-written YAML, workloads and sweep configs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kbtrace.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "topologies" / "tiny.yaml"
GEMM = REPO / "capture" / "gemm.py"
TINY_TEXT = TINY.read_text()


# ----------------------------------------------------------------------------- harness

@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[Path], list[str]]   # writes inputs under the directory, returns argv
    rc: int
    msg: str | None                      # substring of the one error line (None: rc 0)
    out: str | None = None               # the command's output (may change), relative
    warn: str | None = None              # rc 0 cases: substring of the one warning line


def _snapshot(root: Path, skip: Path | None) -> dict[str, str]:
    snap = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        if p.is_symlink():
            snap[str(p)] = "link:" + os.readlink(p)
        elif p.is_file():
            snap[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            snap[str(p)] = "dir"
    return snap


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """tiny.yaml gemm (M=N=64, K=64): a trace ``tr`` and its run ``run`` (replayed fast)."""
    root = tmp_path_factory.mktemp("bad_inputs_base")
    assert main(["capture", str(GEMM), "-t", str(TINY), "-p", "M=64", "-p", "N=64",
                 "-p", "K=64", "-o", str(root / "tr")]) == 0
    assert main(["replay", str(root / "tr"), "-t", str(TINY), "-o", str(root / "run")]) == 0
    assert main(["capture", str(REPO / "capture" / "ring_allreduce.py"), "-t", str(TINY),
                 "-p", "P=2", "-o", str(root / "ring")]) == 0
    assert main(["capture", str(REPO / "capture" / "gemm_composite.py"), "-t", str(TINY),
                 "-p", "M=64", "-p", "N=64", "-p", "K=64", "-o", str(root / "comp")]) == 0
    return root


def _run_case(case: Case, base: Path, tmp_path: Path, monkeypatch, capsys) -> str:
    work = tmp_path / "w"
    shutil.copytree(base, work)
    run_json = work / "run" / "run.json"          # the copied run names the copied trace
    meta = json.loads(run_json.read_text())
    meta["trace"]["path"] = str(work / "tr")
    run_json.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    monkeypatch.chdir(work)
    monkeypatch.setenv("KBTRACE_CACHE_DIR", str(tmp_path / "cache"))
    argv = case.setup(work)
    capsys.readouterr()
    out = (work / case.out) if case.out else None
    before = _snapshot(work, out)
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert rc == case.rc, (rc, err)
    if case.msg is not None:
        assert len(lines) == 1 and lines[0].startswith("kbtrace: error: "), err
        assert case.msg in lines[0], lines[0]
        assert len(lines[0]) < 1200, len(lines[0])
    elif case.warn is not None:
        assert [ln for ln in lines if ln.startswith("kbtrace: warning: ")] and \
            case.warn in err, err
    else:
        assert "error" not in err, err
    assert _snapshot(work, out) == before, "a file outside the command's output changed"
    return err


def w(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


def topo(text: str | bytes, cmd: tuple[str, ...] = ("topo", "show")):
    """A case setup: write ``t.yaml`` and run ``kbtrace topo show t.yaml``."""
    def setup(d: Path) -> list[str]:
        w(d / "t.yaml", text)
        return [*cmd, "t.yaml"]
    return setup


def workload(src: str | bytes, name: str = "wl.py"):
    def setup(d: Path) -> list[str]:
        w(d / name, src)
        return ["capture", name, "-t", str(TINY), "-o", "out"]
    return setup


def _alias_bomb(levels: int, key: str = "name") -> str:
    parts = ["&v0 [lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    for i in range(1, levels):
        parts.append(f"&v{i} [" + ",".join([f"*v{i - 1}"] * 9) + "]")
    return f"{key}: [{', '.join(parts)}]\n"


def _sweep_cfg(text: str):
    def setup(d: Path) -> list[str]:
        w(d / "s.yaml", text)
        return ["sweep", "s.yaml", "-o", "sw"]
    return setup


HBM = "  hbm:\n    pc_bw_gbps: {}\n"
MESH = "  mesh:\n    {}\n"

# ----------------------------------------------------------------------------- YAML (2, 8, 10)

YAML_CASES = [
    Case("yaml-binary", topo(b"\xff\xfe\x00\x01name: x\n"), 2,
         "t.yaml: not UTF-8 text (byte 0xff at line 1, column 1)"),
    Case("yaml-latin1", topo("name: caf\xe9\n".encode("latin-1")), 2,
         "t.yaml: not UTF-8 text (byte 0xe9 at line 1, column 10)"),
    Case("yaml-nul-bytes", topo(b"\x00" * 64), 2, "t.yaml: "),
    Case("yaml-deep-5000", topo("a: " + "[" * 5000 + "]" * 5000 + "\n"), 2,
         "t.yaml: nested more than 32 levels deep"),
    Case("yaml-deep-40", topo("name: " + "[" * 40 + "]" * 40 + "\n"), 2,
         "nested more than 32 levels deep (line 1)"),
    Case("yaml-400-digit-float", topo(TINY_TEXT + HBM.format("9" * 400)), 2,
         "cube.hbm.pc_bw_gbps = 99999999999999999999...99999999 (400 characters): must be a "
         "finite number"),
    Case("yaml-400-digit-int", topo(TINY_TEXT.replace("count: 2", "count: " + "9" * 400)), 2,
         "cube.pes.count = 99999999999999999999...99999999 (400 characters): at most"),
    Case("yaml-negative-400-digit", topo(TINY_TEXT + HBM.format("-" + "9" * 400)), 2,
         "must be a finite number of magnitude <= 1e+15"),
    Case("yaml-nan", topo(TINY_TEXT + HBM.format(".nan")), 2,
         "cube.hbm.pc_bw_gbps = nan: must be a finite number"),
    Case("yaml-inf", topo(TINY_TEXT + HBM.format(".inf")), 2,
         "cube.hbm.pc_bw_gbps = inf: must be a finite number"),
    Case("yaml-near-infinite-bw", topo(TINY_TEXT + MESH.format("link_bw_gbps: 1e300")), 2,
         "cube.mesh.link_bw_gbps = 1e+300: must be a finite number of magnitude <= 1e+15"),
    Case("yaml-bw-1e13", topo(TINY_TEXT + MESH.format("link_bw_gbps: 1.0e13")), 2,
         "cube.mesh.link_bw_gbps = 10000000000000.0: a rate must be within [1e-12, 1e+12]"),
    Case("yaml-bw-1e-300", topo(TINY_TEXT + HBM.format("1.0e-300")), 2,
         "cube.hbm.pc_bw_gbps = 1e-300: a rate must be within [1e-12, 1e+12]"),
    Case("yaml-alias-bomb", topo(_alias_bomb(6)), 2,
         "t.yaml: name[5]: expands to more than 100,000 values"),
    Case("yaml-alias-bomb-7", topo(_alias_bomb(7)), 2, "expands to more than 100,000 values"),
    Case("yaml-recursive-alias", topo(TINY_TEXT.replace("name: tiny", "name: &a [*a]")), 2,
         "name = [[...]]: must be a string"),
    Case("yaml-ucie-connections", topo(TINY_TEXT.replace(
        "sip:\n", "sip:\n  ucie: {connections: 100000000}\n")), 2,
        "sip.ucie.connections = 100000000: at most 64"),
    Case("yaml-mesh-rows", topo(TINY_TEXT + MESH.format("rows: 20000")), 2,
         "cube.mesh.rows = 20000: at most 64"),
    Case("yaml-mesh-cols-huge", topo(TINY_TEXT + MESH.format("cols: 1000000000000")), 2,
         "cube.mesh.cols = 1000000000000: at most 64"),
    Case("yaml-cube-mesh-huge", topo(TINY_TEXT.replace("cube_mesh_w: 1", "cube_mesh_w: 100000")),
         2, "100000x1 = 100000 cubes; at most 16 per SIP"),
    Case("yaml-slots-huge", topo(TINY_TEXT.replace("pe:\n", "XX") + "pe:\n  ipcq: {n_slots: 1000000000}\n"),
         2, "pe.ipcq.n_slots = 1000000000: at most 65,536"),
    Case("yaml-file-too-large", topo("# " + "x" * (2 << 20) + "\n" + TINY_TEXT), 2,
         "t.yaml: larger than 1024 KiB"),
    Case("yaml-name-dotdot", topo(TINY_TEXT.replace("name: tiny", "name: ../../evil")), 2,
         "name = '../../evil': a topology name is a file-name-safe word"),
    Case("yaml-name-slash", topo(TINY_TEXT.replace("name: tiny", "name: a/b")), 2,
         "name = 'a/b': a topology name is a file-name-safe word"),
    Case("yaml-name-empty", topo(TINY_TEXT.replace("name: tiny", "name: ''")), 2,
         "name = '': a topology name is a file-name-safe word"),
    Case("yaml-tab-indent", topo("name: x\n\tsystem: 1\n"), 2, "t.yaml: malformed YAML at line 2"),
    Case("yaml-empty", topo(""), 2, "t.yaml: the topology file is empty"),
    Case("yaml-top-level-list", topo("- 1\n- 2\n"), 2, "t.yaml: top level must be a mapping"),
    Case("yaml-duplicate-key", topo(TINY_TEXT + "name: again\n"), 2, "name: duplicate key"),
    Case("yaml-1e3-accepted", topo(TINY_TEXT + HBM.format("1e3")), 0, None),
    Case("yaml-1E-2-accepted", topo(TINY_TEXT + HBM.format("-1E-2").replace("-1E", "1E")), 0,
         None),
    Case("yaml-set-1e3-accepted", lambda d: ["topo", "show", str(TINY), "--set",
                                             "cube.hbm.pc_bw_gbps=2e3"], 0, None),
    Case("yaml-set-alias-bomb", lambda d: ["topo", "show", str(TINY), "--set",
                                           "cube.hbm.pc_bw_gbps=" + _alias_bomb(6)[6:].strip()],
         2, "the value is not valid YAML ([5]: expands to more than 100,000 values"),
    Case("topo-dev-zero", lambda d: ["topo", "show", "/dev/zero"], 2,
         "/dev/zero is not a regular file (a topology is a file)"),
    Case("topo-directory", lambda d: (d / "tdir").mkdir() or ["topo", "show", "tdir"], 2,
         "tdir is a directory (a topology is a file)"),
    Case("topo-is-run-dir", lambda d: ["topo", "show", "run"], 2,
         "run is a directory (a topology is a file)"),
    Case("sweep-binary", _sweep_cfg(b"\x89PNG\r\n\x1a\n\x00\x00"), 2,
         "s.yaml: not UTF-8 text (byte 0x89 at line 1, column 1)"),
    Case("sweep-alias-bomb", _sweep_cfg(_alias_bomb(6, "traces")), 2,
         "s.yaml: traces[5]: expands to more than 100,000 values"),
    Case("sweep-grid-huge", _sweep_cfg(
        "traces: [tr]\ntopologies: [" + str(TINY) + "]\ngrid:\n" + "".join(
            f"  {k}: [{', '.join(str(v) for v in range(1, 41))}]\n"
            for k in ("cube.hbm.pc_bw_gbps", "cube.mesh.link_bw_gbps", "pe.tcm.read_bw_gbps",
                      "pe.tcm.write_bw_gbps"))), 2,
        "traces x topologies x fidelities x grid: 2,560,000 points; at most 100,000"),
    Case("sweep-workload-grid-huge", _sweep_cfg(
        f"workloads:\n  - path: {GEMM}\n    grid: {{" + ", ".join(
            f"{k}: [{', '.join(str(v) for v in range(1, 101))}]" for k in ("BM", "BN", "BK"))
        + f"}}\ntopologies: [{TINY}]\n"), 2, "grid: 1,000,000 points; at most 100,000"),
]

# ----------------------------------------------------------------------------- workloads (2, 10)

WORKLOAD_CASES = [
    Case("wl-syntax-error", workload("def build(w, p)\n    pass\n"), 2,
         "has a syntax error at "),
    Case("wl-failing-import", workload("import kbtrace_no_such_module_xyz\n"), 2,
         "failed to import: ModuleNotFoundError: No module named 'kbtrace_no_such_module_xyz' "
         "(at "),
    Case("wl-raises-at-import", workload("x = 1\nraise ValueError('boom')\n"), 2,
         "failed to import: ValueError: boom (at "),
    Case("wl-recursion-at-import", workload("def f():\n    return f()\nf()\n"), 2,
         "failed to import: RecursionError"),
    Case("wl-not-utf8", workload(b"def build(w, p):\n    x = '\xff'\n"), 2,
         "has a syntax error at "),
    Case("wl-binary", workload(b"\x7fELF\x02\x01\x01\x00" * 8), 2, "wl.py"),
    Case("wl-empty", workload(""), 2, "defines no build(w, p) function"),
    Case("wl-build-raises", workload("def build(w, p):\n    y = 2\n    raise KeyError('k')\n"),
         2, "build() raised KeyError: 'k' (at "),
    Case("wl-tensor-2^62-bytes", workload(
        "def build(w, p):\n    w.tensor('x', (1 << 31, 1 << 31), 'f32')\n"), 2,
        "tensor 'x': shape (2147483648, 2147483648) f32 needs 18,446,744,073,709,551,616 B, "
        "more than the 48 GB of HBM in topology 'tiny'"),
    Case("wl-tensor-256-GiB", workload(
        "def build(w, p):\n    w.tensor('x', (1 << 18, 1 << 18), 'f32', init=w.random(0))\n"),
        2, "needs 274,877,906,944 B, more than the 48 GB of HBM"),
    Case("wl-load-2^64-bytes", workload(
        "def k(tl, x):\n    tl.store(x, tl.load(x, (1 << 31, 1 << 31), 'f32'))\n"
        "def build(w, p):\n    x = w.tensor('x', (64, 64), 'f32')\n"
        "    w.launch(k, args=(x,))\n"), 2,
        "tl.load of 18446744073709551616 B at 0x2000000000 touches unallocated memory"),
    Case("wl-zeros-huge", workload(
        "def k(tl, x):\n    tl.store(x, tl.zeros((1 << 31, 1 << 31), 'f32'))\n"
        "def build(w, p):\n    x = w.tensor('x', (64, 64), 'f32')\n"
        "    w.launch(k, args=(x,))\n"), 2, "scratch of sip0.cube0.pe0 overflow"),
    Case("wl-grid-huge", workload(
        "def k(tl, x):\n    pass\n"
        "def build(w, p):\n    x = w.tensor('x', (64, 64), 'f32')\n"
        "    w.launch(k, grid=(1 << 40, 1 << 40), args=(x,))\n"), 2,
        "does not fit 'tiny' (2 PEs x 1 cubes); use a smaller grid"),
    Case("wl-param-400-digits", lambda d: ["capture", str(GEMM), "-t", str(TINY), "-p",
                                           "M=32" + "0" * 398, "-o", "out"], 2,
         "more than the 48 GB of HBM in topology 'tiny'"),
    Case("wl-folder-shadows-nothing", lambda d: (d / "nosuch").mkdir() or
         ["capture", "nosuch", "-t", str(TINY), "-o", "out"], 2,
         "workload 'nosuch': nosuch is a directory (a workload is a file) and no workload of "
         "that name is in the catalog"),
]


def test_wl_error_names_file_and_line(base, tmp_path, monkeypatch, capsys):
    err = _run_case(Case("x", workload("import os\n\ndef build(w, p)\n"), 2, "syntax error"),
                    base, tmp_path, monkeypatch, capsys)
    assert f"{tmp_path / 'w' / 'wl.py'}:3: expected ':'" in err
    err = _run_case(Case("x", workload("def build(w, p):\n    y = 2\n    raise KeyError('k')\n"),
                         2, "build()"), base, tmp_path / "b", monkeypatch, capsys)
    assert f"(at {tmp_path / 'b' / 'w' / 'wl.py'}:3;" in err


def test_traceback_flag_shows_the_chain(base, tmp_path, monkeypatch, capsys):
    work = tmp_path / "w"
    work.mkdir()
    monkeypatch.chdir(work)
    w(work / "wl.py", "def helper():\n    raise ValueError('deep')\nhelper()\n")
    rc = main(["--traceback", "capture", "wl.py", "-t", str(TINY), "-o", "out"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("kbtrace: error: workload 'wl.py' failed to import: ValueError: deep")
    assert "Traceback (most recent call last)" in err and "in helper" in err
    assert not (work / "out").exists()


def test_folder_named_like_a_workload_does_not_hide_it(base, tmp_path, monkeypatch, capsys):
    """A ./gemm folder in the working directory: ``capture gemm`` still finds capture/gemm.py."""
    work = tmp_path / "w"
    (work / "gemm").mkdir(parents=True)
    (work / "gemm" / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    monkeypatch.setenv("KBTRACE_CACHE_DIR", str(tmp_path / "cache"))
    rc = main(["capture", "gemm", "-t", str(TINY), "-p", "M=64", "-p", "N=64", "-p", "K=64",
               "-o", "out"])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((work / "out" / "trace.json").read_text())["workload"] == "gemm"
    assert (work / "gemm" / "notes.txt").read_text() == "mine"


def test_read_only_cache_warns_once(base, tmp_path, monkeypatch, capsys):
    """A cache directory that cannot be created (a file in the way; root ignores chmod):
    the command works and prints one warning, not one per compile."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".cache").write_text("not a directory")
    monkeypatch.delenv("KBTRACE_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    from kbtrace.topology import topology as topo_mod
    monkeypatch.setattr(topo_mod, "_CACHE_WARNED", set())
    with warnings.catch_warnings():
        warnings.simplefilter("default")        # pytest turns warnings into errors
        rc = main(["replay", str(base / "tr"), "-t", str(TINY), "-o", "r2"])
        rc2 = main(["replay", str(base / "tr"), "-t", str(TINY), "-o", "r3"])
    err = capsys.readouterr().err
    assert rc2 == 0
    assert rc == 0
    warns = [ln for ln in err.splitlines() if ln.startswith("kbtrace: warning: ")]
    assert warns == [f"kbtrace: warning: topology cache {tmp_path / 'home' / '.cache'}"
                     "/kbtrace/topology is not writable (Not a directory); compiling without "
                     "it (set KBTRACE_CACHE_DIR to a writable directory to reuse compiled "
                     "topologies)"], err
    assert (tmp_path / "home" / ".cache").read_text() == "not a directory"


def test_disk_full_names_the_path(tmp_path, monkeypatch):
    """ENOSPC while Arrow writes a batch is an OutputError naming the output file."""
    import errno

    import pyarrow.parquet as pq

    from kbtrace import schema
    from kbtrace._io import BatchWriter
    from kbtrace.errors import OutputError

    bw = BatchWriter(tmp_path / "hops.parquet", schema.HOPS, batch_rows=1)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(pq.ParquetWriter, "write_batch", full)
    with pytest.raises(OutputError) as ei:
        bw.append_row(0, 0, -1, "gemm", 0, -1, 0.0, 1.0, 1.0, 0.0, 1.0, 8)
    assert str(ei.value) == (f"cannot write {tmp_path / 'hops.parquet'}: No space left on "
                             "device; choose a writable output path (-o)")
    bw.abort()
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- traces (2, 3)

def edit_ops(trace: Path, fn: Callable[[list[dict]], object]) -> None:
    """Rewrite ``trace/ops.parquet`` through ``fn(rows)`` (rows edited in place) and record
    the new file's hash in trace.json: a crafted trace that passes the integrity check, so
    only validation can refuse it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kbtrace import schema
    from kbtrace._io import file_hash
    rows = pq.read_table(trace / "ops.parquet").to_pylist()
    fn(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema.OPS), trace / "ops.parquet")
    meta = json.loads((trace / "trace.json").read_text())
    meta["content_hash"]["ops.parquet"] = file_hash(trace / "ops.parquet")
    (trace / "trace.json").write_text(json.dumps(meta))


def replay_edited(fn: Callable[[list[dict]], object], trace: str = "tr",
                  extra: tuple[str, ...] = ()):
    def setup(d: Path) -> list[str]:
        edit_ops(d / trace, fn)
        return ["replay", trace, "-t", str(TINY), *extra, "-o", "rr"]
    return setup


def first(of_kind: str, **values):
    """An edit: set ``values`` on the first op of kind ``of_kind``."""
    def fn(rows: list[dict]) -> None:
        r = next(r for r in rows if r["kind"] == of_kind)
        r.update(values)
    return fn


def _dep(value):
    def fn(rows):
        r = next(r for r in rows if r["deps"])
        r["deps"] = [value(r)]
    return fn


def _swap_ids(rows):
    rows[1]["op_id"] = 0


def _unpair(rows):
    s = next(r for r in rows if r["kind"] == "send")
    s["match_op_id"] = next(r["op_id"] for r in rows if r["kind"] == "load")


def _asymmetric(rows):
    recvs = [r for r in rows if r["kind"] == "recv"]
    recvs[0]["match_op_id"] = recvs[1]["match_op_id"]


def _drop_recv(rows):
    sends = [r for r in rows if r["kind"] == "send"]
    recv = next(r for r in rows if r["kind"] == "recv")
    recv["kind"], recv["name"] = "cycles", "cycles"
    recv["match_op_id"] = None
    del sends


def _bad_addr(col: str, addr: int):
    def fn(rows):
        r = next(r for r in rows if r["kind"] == "load")
        r[col] = addr
    return fn


def _tcm_addr(pe: int, off: int) -> int:
    from kbtrace.topology import address
    return address.pe_tcm_addr(0, 0, pe, off)


def _hbm(off: int) -> int:
    from kbtrace.topology import address
    return address.hbm_addr(0, 0, off)


RT = "replay build: ops.parquet: op "
TRACE_CASES = [
    Case("trace-unknown-kind", replay_edited(first("load", kind="teleport")), 2,
         "(teleport, launch 0, program 0, seq 1): unknown op kind 'teleport'", "rr"),
    Case("trace-empty-kind", replay_edited(first("store", kind="")), 2,
         "unknown op kind ''", "rr"),
    Case("trace-unknown-space", replay_edited(first("load", src_space="moon")), 2,
         "src_space 'moon' is not one of hbm, tcm, sram, ipcq, host", "rr"),
    Case("trace-unknown-dtype", replay_edited(first("dot", out_dtype="f128")), 2,
         "out_dtype 'f128' is not one of", "rr"),
    Case("trace-unknown-in-dtype", replay_edited(first("dot", in_dtypes=["f32", "q4"])), 2,
         "in_dtypes value 'q4' is not one of", "rr"),
    Case("trace-unknown-direction", replay_edited(first("send", direction="up"), "ring"), 2,
         "direction 'up' is not one of", "rr"),
    Case("trace-dep-missing", replay_edited(_dep(lambda r: 10**9)), 2,
         "depends on op 1000000000, which is not in the trace", "rr"),
    Case("trace-dep-negative", replay_edited(_dep(lambda r: -3)), 2,
         "depends on op -3, which is not in the trace", "rr"),
    Case("trace-dep-self", replay_edited(_dep(lambda r: r["op_id"])), 2,
         "which is not an earlier op", "rr"),
    Case("trace-dep-cycle", replay_edited(_dep(lambda r: r["op_id"] + 1)), 2,
         "which is not an earlier op (dependencies point back in capture order", "rr"),
    Case("trace-op-id-not-dense", replay_edited(_swap_ids), 2,
         "row 1 has op_id 0, expected 1", "rr"),
    Case("trace-negative-nbytes", replay_edited(first("load", nbytes=-4096)), 2,
         "nbytes = -4096 is outside [0, 1099511627776]", "rr"),
    Case("trace-huge-nbytes", replay_edited(first("load", nbytes=1 << 62)), 2,
         "nbytes = 4611686018427387904 is outside", "rr"),
    Case("trace-negative-m", replay_edited(first("dot", m=-32)), 2,
         "GEMM dimension m = -32 is outside [1, 16777216]", "rr"),
    Case("trace-zero-k", replay_edited(first("dot", k=0)), 2,
         "GEMM dimension k = 0 is outside", "rr"),
    Case("trace-huge-n", replay_edited(first("dot", n=2**31 - 1)), 2,
         "GEMM dimension n = 2147483647 is outside", "rr"),
    Case("trace-null-m-on-dot", replay_edited(first("dot", m=None)), 2,
         "GEMM dimension m is null on a dot", "rr"),
    Case("trace-negative-shape", replay_edited(first("dot", out_shape=[-32, 32])), 2,
         "out_shape has extent -32", "rr"),
    Case("trace-huge-shape", replay_edited(first("dot", out_shape=[1 << 23, 1 << 23, 1 << 23])),
         2, "out_shape holds 5.9e+20 elements", "rr"),
    Case("trace-negative-cycles", replay_edited(first("load", cycles=-1)), 2,
         "cycles = -1 is outside", "rr"),
    Case("trace-pe-not-in-topology", replay_edited(first("load", pe=7)), 2,
         "runs on sip0.cube0.pe7, which topology 'tiny' (1 SIP(s) x 1 cubes x 2 PEs) does not "
         "have", "rr"),
    Case("trace-sip-not-in-topology", replay_edited(first("store", sip=3)), 2,
         "runs on sip3.cube0.pe0", "rr"),
    Case("trace-peer-not-in-topology", replay_edited(first("send", peer_pe=9), "ring"), 2,
         "IPCQ peer sip0.cube0.pe9", "rr"),
    Case("trace-addr-sip-unmapped", replay_edited(_bad_addr("src_addr", 5 << 47)), 2,
         "src_addr: address 0x2800000000000: SIP 5 not in this topology (1 SIPs)", "rr"),
    Case("trace-addr-mbz", replay_edited(_bad_addr("src_addr", (1 << 38) | (1 << 37))), 2,
         "src_addr: address 0x6000000000", "rr"),
    Case("trace-addr-cube-unmapped", replay_edited(_bad_addr("src_addr", 3 << 42)), 2,
         "cube 3 not in this topology (1 cubes per SIP)", "rr"),
    Case("trace-addr-hbm-past-capacity", replay_edited(_bad_addr("src_addr", _hbm(60 << 30))),
         2, "HBM offset 0xf00000000 beyond the 48 GB implemented per cube", "rr"),
    Case("trace-addr-hbm-extent", replay_edited(_bad_addr("src_addr", _hbm((48 << 30) - 16))),
         2, "bytes runs past the 48 GB of HBM per cube", "rr"),
    Case("trace-addr-tcm-other-pe", replay_edited(_bad_addr("dst_addr", _tcm_addr(5, 0))), 2,
         "dst_addr: address 0x", "rr"),
    Case("trace-addr-tcm-beyond", replay_edited(_bad_addr("dst_addr", _tcm_addr(0, 2044 << 10))),
         2, "uses TCM bytes [2093056, 2101248) but topology 'tiny' has pe.tcm.size_kb = 2048 "
         "(2097152 bytes)", "rr"),
    Case("trace-addr-in-addrs", replay_edited(first("dot", in_addrs=[7 << 47] * 3)), 2,
         "in_addrs: address 0x3800000000000: SIP 7 not in this topology", "rr"),
    Case("trace-operand-lists-differ", replay_edited(first("dot", in_addrs=[0, 0])), 2,
         "in_addrs has 2 operands but in_spaces has 3", "rr"),
    Case("trace-tcm-over-capacity", lambda d: ["replay", "tr", "-t", str(TINY), "--set",
                                               "pe.tcm.size_kb=8", "--set",
                                               "pe.tcm.scratch_kb=4", "-o", "rr"], 2,
         "TCM offset 0x101000 beyond pe.tcm.size_kb = 8; the trace was captured for 'tiny': "
         "replay it on a topology that maps it", "rr"),
    Case("trace-send-matched-to-load", replay_edited(_unpair, "ring"), 2,
         "is a load, not a recv (sends and receives must be paired)", "rr"),
    Case("trace-recv-asymmetric", replay_edited(_asymmetric, "ring"), 2,
         "sends and receives must be paired one to one", "rr"),
    Case("trace-match-missing", replay_edited(first("recv", match_op_id=10**6), "ring"), 2,
         "its IPCQ match is op 1000000, which is not in the trace", "rr"),
    Case("trace-send-without-recv", replay_edited(_drop_recv, "ring"), 2,
         "is a cycles, not a recv (sends and receives must be paired)", "rr"),
    Case("trace-extra-json-broken", replay_edited(first("composite", extra_json="{oops"),
                                                  "comp"), 2,
         "extra_json is not valid JSON", "rr"),
    Case("trace-extra-json-list", replay_edited(first("composite", extra_json="[1, 2]"),
                                                "comp"), 2,
         "extra_json is not a JSON object", "rr"),
    Case("trace-tile-shape-zero", replay_edited(first(
        "composite", extra_json='{"tile_shape": [0, 0, 0]}'), "comp"), 2,
        "extra_json tile_shape [0, 0, 0] is not three integers", "rr"),
    Case("trace-composite-too-many-tiles", replay_edited(first(
        "composite", m=1 << 20, n=1 << 20, extra_json='{"tile_shape": [1, 1, 1]}'), "comp"), 2,
        "tiles, more than 4194304", "rr"),
]

# ----------------------------------------------------------------------------- JSON (2)

def edit_json(rel: str, fn: Callable[[dict], object], cmd: tuple[str, ...], raw: bool = False):
    """Edit ``rel`` (a trace.json / run.json) through ``fn(doc)``; run ``cmd``. ``raw``:
    ``fn`` returns the file's new text."""
    def setup(d: Path) -> list[str]:
        p = d / rel
        doc = json.loads(p.read_text())
        new = fn(doc)
        p.write_text(new if raw else json.dumps(doc))
        return list(cmd)
    return setup


def _del(key):
    return lambda doc: doc.pop(key)


def _set(path, value):
    def fn(doc):
        *parents, leaf = path
        for k in parents:
            doc = doc[k]
        doc[leaf] = value
    return fn


SHOW = ("trace", "show", "tr")
REPLAY = ("replay", "tr", "-t", str(TINY), "-o", "rr")
SQL = ("sql", "run", "SELECT count(*) FROM op_timing")
TJ = "tr/trace.json: corrupt: "
JSON_CASES = [
    Case("tracejson-missing-workload", edit_json("tr/trace.json", _del("workload"), SHOW), 2,
         TJ + "key 'workload' is missing; re-capture the workload"),
    Case("tracejson-missing-launches", edit_json("tr/trace.json", _del("launches"), REPLAY), 2,
         TJ + "key 'launches' is missing", "rr"),
    Case("tracejson-n-ops-string", edit_json("tr/trace.json", _set(["n_ops"], "many"), SHOW), 2,
         TJ + "n_ops is a JSON string, expected an integer"),
    Case("tracejson-n-ops-negative", edit_json("tr/trace.json", _set(["n_ops"], -5), SHOW), 2,
         TJ + "n_ops = -5 is negative"),
    Case("tracejson-topology-list", edit_json("tr/trace.json", _set(["topology"], []), REPLAY),
         2, TJ + "topology is a JSON array, expected an object", "rr"),
    Case("tracejson-topology-name-number", edit_json(
        "tr/trace.json", _set(["topology", "name"], 7), SHOW), 2,
        TJ + "topology.name is a JSON number, expected a string"),
    Case("tracejson-params-list", edit_json("tr/trace.json", _set(["params"], [1]), SHOW), 2,
         TJ + "params is a JSON array, expected an object"),
    Case("tracejson-grid-short", edit_json("tr/trace.json", _set(["launches", 0, "grid"], [1]),
                                           SHOW), 2,
         TJ + "launches[0].grid is missing or not an array"),
    Case("tracejson-launch-not-object", edit_json("tr/trace.json", _set(["launches", 0], 3),
                                                  SHOW), 2, TJ + "launches[0].kernel"),
    Case("tracejson-content-hash-string", edit_json(
        "tr/trace.json", _set(["content_hash"], "abc"), REPLAY), 2,
        TJ + "content_hash is a JSON string, expected an object", "rr"),
    Case("tracejson-op-counts-float", edit_json(
        "tr/trace.json", _set(["op_counts", "load"], 1.5), SHOW), 2,
        TJ + "op_counts.load is not an integer"),
    Case("tracejson-reference-check", edit_json(
        "tr/trace.json", _set(["reference_check", "c"], 5), SHOW), 2,
        TJ + "reference_check.c is not an object with ok, max_abs_err and dtype"),
    Case("tracejson-golden-string", edit_json("tr/trace.json", _set(["golden"], "yes"), SHOW),
         2, TJ + "golden is a JSON string, expected true or false"),
    Case("tracejson-nan", edit_json("tr/trace.json", lambda doc: json.dumps(doc).replace(
        '"max_abs_err": ', '"max_abs_err": NaN, "x": '), SHOW, raw=True), 2,
        TJ + "NaN is not a JSON number (kbtrace never writes one)"),
    Case("tracejson-truncated", edit_json("tr/trace.json", lambda doc: json.dumps(doc)[:40],
                                          SHOW, raw=True), 2,
         "tr/trace.json: corrupt or truncated JSON"),
    Case("tracejson-array", edit_json("tr/trace.json", lambda doc: "[]", SHOW, raw=True), 2,
         "tr/trace.json: corrupt (a JSON array, not an object)"),
    Case("runjson-makespan-nan", edit_json("run/run.json", lambda doc: json.dumps(doc).replace(
        '"makespan_ns": ', '"makespan_ns": NaN, "x": '), SQL, raw=True), 2,
        "run/run.json: corrupt: NaN is not a JSON number"),
    Case("runjson-makespan-infinity", edit_json("run/run.json", lambda doc: json.dumps(
        doc).replace('"makespan_ns": ', '"makespan_ns": -Infinity, "x": '),
        ("verify", "run"), raw=True), 2, "run/run.json: corrupt: -Infinity is not a JSON number"),
    Case("runjson-makespan-string", edit_json("run/run.json", _set(["makespan_ns"], "fast"),
                                              SQL), 2,
         "run/run.json: corrupt: makespan_ns is a JSON string, expected a number"),
    Case("runjson-too-large", edit_json("run/run.json", lambda doc: json.dumps(
        {**doc, "pad": "x" * (65 << 20)}), SQL, raw=True), 2,
        "run/run.json: larger than 64 MiB, which no kbtrace JSON file is"),
    Case("runjson-binary", lambda d: (d / "run" / "run.json").write_bytes(b"\xff\xfe{}") and
         ["verify", "run"], 2,
         "run/run.json: unreadable ('utf-8' codec can't decode byte 0xff"),
    Case("runjson-trace-path-number", edit_json("run/run.json", _set(["trace", "path"], 5),
                                                ("verify", "run")), 2,
         "run/run.json: corrupt: trace.path is a JSON number, expected a string"),
]

# ----------------------------------------------------------------------------- integrity (4)

def flip(rel: str, at: float = 0.5, n: int = 4):
    """An edit: invert ``n`` bytes of ``rel`` at fraction ``at`` of its length."""
    def fn(d: Path) -> None:
        p = d / rel
        data = bytearray(p.read_bytes())
        i = int(len(data) * at)
        data[i:i + n] = bytes(b ^ 0xFF for b in data[i:i + n])
        p.write_bytes(bytes(data))
    return fn


def then(*steps, argv: tuple[str, ...]):
    def setup(d: Path) -> list[str]:
        for step in steps:
            step(d)
        return list(argv)
    return setup


def _empty(rel: str):
    return lambda d: (d / rel).write_bytes(b"")


def _rehash(doc: str, key: str, name: str):
    def fn(d: Path) -> None:
        from kbtrace._io import file_hash
        p = d / doc
        meta = json.loads(p.read_text())
        meta[key][name] = file_hash(p.parent / name)
        p.write_text(json.dumps(meta))
    return fn


def _edit_timing(fn_rows):
    def fn(d: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from kbtrace import schema
        t = pq.read_table(d / "run" / "op_timing.parquet")
        rows = t.to_pylist()
        rows = fn_rows(rows)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema.OP_TIMING),
                       d / "run" / "op_timing.parquet")
    return fn


def _backwards(rows):
    rows[3]["t_end_ns"] = rows[3]["t_start_ns"] - 50.0
    return rows


def _nan_end(rows):
    rows[2]["t_end_ns"] = float("nan")
    return rows


def _follow_trace(d: Path) -> None:
    """The run records the (crafted, rehashed) trace's identity: only validation is left."""
    from kbtrace._io import trace_hash
    info = json.loads((d / "run" / "run.json").read_text())
    info["trace"]["hash"] = trace_hash(json.loads((d / "tr" / "trace.json").read_text()),
                                       d / "tr")
    (d / "run" / "run.json").write_text(json.dumps(info))


CHANGED = ": changed since kbtrace wrote it (digest "
RFIX = "re-run `kbtrace replay` to regenerate the run"
INTEGRITY_CASES = [
    Case("flip-hops-sql", then(flip("run/hops.parquet"), argv=SQL), 2,
         "run/hops.parquet" + CHANGED),
    Case("flip-hops-diff", then(flip("run/hops.parquet"), argv=("diff", "run", "run")), 2,
         "run/hops.parquet" + CHANGED),
    Case("flip-hops-report", then(flip("run/hops.parquet", 0.3),
                                  argv=("report", "run", "-o", "rep")), 2,
         "run/hops.parquet" + CHANGED, "rep"),
    Case("flip-hops-export", then(flip("run/hops.parquet", 0.7),
                                  argv=("export", "perfetto", "run", "-o", "t.json")), 2,
         "run/hops.parquet" + CHANGED, "t.json"),
    Case("flip-op-timing-verify", then(flip("run/op_timing.parquet"), argv=("verify", "run")),
         2, "run/op_timing.parquet" + CHANGED),
    Case("flip-nodes-sql", then(flip("run/nodes.parquet"), argv=SQL), 2,
         "run/nodes.parquet" + CHANGED),
    Case("flip-links-check", then(flip("run/links.parquet", 0.2), argv=("check", "run")), 2,
         "run/links.parquet" + CHANGED),
    Case("empty-op-timing-diff", then(_empty("run/op_timing.parquet"),
                                      argv=("diff", "run", "run", "--fail-on", "makespan>2%")),
         2, "run/op_timing.parquet" + CHANGED),
    Case("swap-nodes-links", then(lambda d: shutil.copy(d / "run" / "nodes.parquet",
                                                        d / "run" / "links.parquet"),
                                  argv=SQL), 2, "run/links.parquet" + CHANGED),
    Case("op-timing-rows-dropped", then(_edit_timing(lambda rows: rows[:-3]),
                                        _rehash("run/run.json", "files", "op_timing.parquet"),
                                        argv=SQL), 2,
         "run/op_timing.parquet: 17 rows, run.json records ops = 20; " + RFIX),
    Case("op-ends-before-start-verify", then(_edit_timing(_backwards),
                                             _rehash("run/run.json", "files",
                                                     "op_timing.parquet"),
                                             argv=("verify", "run")), 2,
         "op_timing.parquet: op 3 is timed issue"),
    Case("op-ends-before-start-check", then(_edit_timing(_backwards),
                                            _rehash("run/run.json", "files",
                                                    "op_timing.parquet"),
                                            argv=("check", "run")), 2,
         "(it ends before it starts, or a time is not finite)"),
    Case("op-end-nan-verify", then(_edit_timing(_nan_end),
                                   _rehash("run/run.json", "files", "op_timing.parquet"),
                                   argv=("verify", "run")), 2,
         "op_timing.parquet: op 2 is timed issue"),
    Case("flip-trace-ops-sql", then(flip("tr/ops.parquet"), argv=SQL), 2,
         "tr/ops.parquet" + CHANGED),
    Case("flip-trace-memory-verify", then(flip("tr/memory.parquet"), argv=("verify", "run")), 2,
         "tr/memory.parquet" + CHANGED),
    Case("flip-trace-ops-replay", then(flip("tr/ops.parquet"), argv=REPLAY), 2,
         "tr/ops.parquet: content hash differs from trace.json", "rr"),
    Case("flip-trace-ops-check", then(flip("tr/ops.parquet"), argv=("check", "tr")), 2,
         "tr/ops.parquet: content hash differs from trace.json"),
    Case("runjson-files-list", edit_json("run/run.json", _set(["files"], ["a"]), SQL), 2,
         "run/run.json: corrupt: files is a JSON array, expected an object"),
    Case("runjson-files-path", edit_json("run/run.json", _set(["files", "../../x"], "00"),
                                         SQL), 2,
         "run/run.json: corrupt: its file digests are not an object of file name -> digest"),
    Case("verify-crafted-trace", then(lambda d: edit_ops(d / "tr", first("dot", m=-32)),
                                      _follow_trace, argv=("verify", "run")), 2,
         "tr/ops.parquet: op 3 (dot, launch 0, program 0, seq 3): GEMM dimension m = -32 is "
         "outside [1, 16777216]; re-capture the workload"),
    Case("verify-crafted-trace-deps", then(lambda d: edit_ops(d / "tr", _dep(lambda r: 10**6)),
                                           _follow_trace, argv=("verify", "run")), 2,
         "depends on op 1000000, which is not in the trace"),
    Case("check-nothing-there", lambda d: (d / "empty").mkdir() or ["check", "empty"], 2,
         "empty: holds no kbtrace trace (trace.json), run (run.json), baseline"),
    Case("check-missing", lambda d: ["check", "nope"], 2, "nope: no such file or directory"),
    Case("check-trace-fits-topology", then(lambda d: edit_ops(d / "tr", _dep(
        lambda r: r["op_id"] + 2)), argv=("check", "tr", "-t", str(TINY))), 2,
        "which is not an earlier op"),
    Case("check-run-old-trace", then(lambda d: shutil.rmtree(d / "tr"), lambda d: shutil.copytree(
        d / "ring", d / "tr"), argv=("check", "run")), 2,
        "changed since this run was replayed"),
]


def _sweep(d: Path) -> None:
    w(d / "s.yaml", f"traces: [{d / 'tr'}]\ntopologies: [{TINY}]\n"
                    "grid:\n  cube.hbm.pc_bw_gbps: [8, 1e3]\n")
    assert main(["sweep", "s.yaml", "-o", "sw"]) == 0


def _baseline(d: Path) -> None:
    from kbtrace.analysis.summary import summarize, write_summary
    write_summary(summarize(d / "run"), d / "bl" / "gemm")


BASELINE_CASES = [
    Case("flip-sweep-point-check", then(_sweep, flip(
        "sw/trace=tr/topology=tiny/fidelity=fast/cube.hbm.pc_bw_gbps=8/hops.parquet"),
        argv=("check", "sw")), 2, "cube.hbm.pc_bw_gbps=8/hops.parquet" + CHANGED),
    Case("flip-sweep-point-sql", then(_sweep, flip(
        "sw/trace=tr/topology=tiny/fidelity=fast/cube.hbm.pc_bw_gbps=1000.0/op_timing.parquet"),
        argv=("sql", "--sandbox", "sw", "SELECT count(*) FROM op_timing")), 2,
        "cube.hbm.pc_bw_gbps=1000.0/op_timing.parquet" + CHANGED),
    Case("flip-baseline-diff", then(_baseline, flip("bl/gemm/ops.parquet"),
                                    argv=("diff", "bl/gemm", "run")), 2,
         "bl/gemm/ops.parquet" + CHANGED),
    Case("flip-baseline-check", then(_baseline, flip("bl/gemm/ops.parquet", 0.8),
                                     argv=("check", "bl")), 2, "bl/gemm/ops.parquet" + CHANGED),
    Case("baseline-files-number", then(_baseline, edit_json(
        "bl/gemm/summary.json", _set(["files"], 3), ()), argv=("diff", "bl/gemm", "run")), 2,
        "summary.json: corrupt: its file digests are not an object"),
]

# ----------------------------------------------------------------------------- tolerance (9)

SLOW_CASES = [
    Case("slow-hbm-1e-10", lambda d: ["replay", "tr", "-t", str(TINY), "--set",
                                      "cube.hbm.pc_bw_gbps=1e-10", "-o", "rr"], 0, None, "rr"),
    Case("slow-gemm-clock-1e-9", lambda d: ["replay", "tr", "-t", str(TINY), "--set",
                                            "pe.gemm.clock_ghz=1e-9", "-o", "rr"], 0, None,
         "rr"),
    Case("slow-gemm-clock-flit", lambda d: ["replay", "tr", "-t", str(TINY), "--set",
                                            "pe.gemm.clock_ghz=1e-9", "--fidelity", "flit",
                                            "-o", "rr"], 0, None, "rr"),
    Case("slow-math-and-hbm", lambda d: ["replay", "ring", "-t", str(TINY), "--set",
                                         "pe.math.clock_ghz=1e-9", "--set",
                                         "cube.hbm.pc_bw_gbps=1e-10", "-o", "rr"], 0, None,
         "rr"),
]

def test_invariants_refuse_negative_durations():
    """Defence behind validation: a run whose op ends before it starts fails the run."""
    from types import SimpleNamespace

    import numpy as np

    from kbtrace.errors import InvariantError
    from kbtrace.replay import invariants
    rec = SimpleNamespace(busy=None, t_issue=np.array([0.0, 1.0]), t_start=np.array([0.0, 5.0]),
                          t_end=np.array([2.0, 3.0]))
    kinds = ["math", "dot"]
    source = SimpleNamespace(send_rows=[], kind=kinds.__getitem__)
    sim = SimpleNamespace(rec=rec, _ready={}, _match={}, topo=None, fabric=None,
                          source=source, launches=[])
    with pytest.raises(InvariantError, match=r"op 1 \(dot\) has a negative or undefined "
                                             r"duration: issue 1.000, start 5.000, end 3.000 ns"):
        invariants.check(sim, 3.0)
    assert invariants.tol(1e11) == pytest.approx(100.000001)


# ----------------------------------------------------------------------------- SQL sandbox (11)

def sandboxed(query: str):
    return lambda d: ["sql", "--sandbox", "run", query.replace("DIR", str(d))]


DENIED = "file system operations are disabled by configuration"
SANDBOX_CASES = [
    Case("sandbox-read-csv", sandboxed("SELECT * FROM read_csv('/etc/passwd')"), 2,
         'SQL failed: \'Permission Error: Cannot access file "/etc/passwd" - ' + DENIED),
    Case("sandbox-read-text", sandboxed("SELECT * FROM read_text('DIR/tr/trace.json')"), 2,
         DENIED),
    Case("sandbox-copy-to", sandboxed("COPY (SELECT 1) TO 'DIR/evil.csv'"), 2, DENIED),
    Case("sandbox-copy-over-run-file", sandboxed(
        "COPY (SELECT 1) TO 'DIR/run/op_timing.parquet' (FORMAT csv, USE_TMP_FILE false)"), 2,
        DENIED),
    Case("sandbox-read-parquet-direct", sandboxed("SELECT * FROM 'DIR/run/hops.parquet'"), 2,
         DENIED),
    Case("sandbox-attach", sandboxed("ATTACH 'DIR/x.db'"), 2, DENIED),
    Case("sandbox-install", sandboxed("INSTALL httpfs"), 2, DENIED),
    Case("sandbox-load", sandboxed("LOAD httpfs"), 2,
         "Loading external extensions is disabled through configuration"),
    Case("sandbox-unlock", sandboxed("SET lock_configuration = false"), 2,
         'Cannot change configuration option "lock_configuration" - the configuration has '
         "been locked"),
    Case("sandbox-enable-access", sandboxed("SET enable_external_access = true"), 2,
         "the configuration has been locked"),
    Case("sandbox-export", sandboxed("EXPORT DATABASE 'DIR/exp'"), 2, DENIED),
    Case("sandbox-glob", sandboxed("SELECT * FROM glob('/*')"), 2, DENIED),
    Case("sandbox-views-work", sandboxed("SELECT count(*) AS n FROM hops"), 0, None),
    Case("sandbox-library-view", sandboxed("top_hotspots"), 0, None),
]


def test_sandbox_gives_the_same_answers(base, tmp_path, capsys):
    """Views over Arrow datasets (sandbox) and over read_parquet give identical frames,
    for one run and for a set of runs (run_name column)."""
    from kbtrace.analysis.run import open_run
    for q in ("SELECT * FROM utilisation ORDER BY ALL", "SELECT * FROM critical_path",
              "SELECT * FROM hops", "SELECT * FROM ops ORDER BY op_id"):
        with open_run(base / "run") as a, open_run(base / "run", sandbox=True) as b:
            assert b.sandbox and a.sql(q).equals(b.sql(q)), q
    (tmp_path / "set").mkdir()
    for n in ("a", "b"):
        shutil.copytree(base / "run", tmp_path / "set" / n)
    with open_run(tmp_path / "set") as a, open_run(tmp_path / "set", sandbox=True) as b:
        q = "SELECT * FROM op_timing ORDER BY run_name, op_id"
        assert a.sql(q).equals(b.sql(q))
        assert b.sql("SELECT DISTINCT run_name FROM hops ORDER BY 1")["run_name"].to_list() == \
            ["a", "b"]


def test_diff_runs_sandboxed(base, monkeypatch):
    """diff (and baseline, through summarize) opens runs with sandbox=True."""
    from kbtrace.analysis import run as run_mod
    seen = []
    real = run_mod.open_run

    def spy(*a, **k):
        seen.append(k.get("sandbox"))
        return real(*a, **k)
    monkeypatch.setattr(run_mod, "open_run", spy)
    assert main(["diff", str(base / "run"), str(base / "run")]) == 0
    assert seen == [True, True]


CASES = (YAML_CASES + WORKLOAD_CASES + TRACE_CASES + JSON_CASES + INTEGRITY_CASES
         + BASELINE_CASES + SLOW_CASES + SANDBOX_CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case, base, tmp_path, monkeypatch, capsys):
    _run_case(case, base, tmp_path, monkeypatch, capsys)


def test_catalogue_size():
    assert len({c.id for c in CASES}) == len(CASES) == 166      # the README quotes the count

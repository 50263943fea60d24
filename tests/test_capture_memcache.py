"""The memory image's read cache (used by the executor) never returns stale bytes."""

from __future__ import annotations

import numpy as np
import pytest

from kbtrace.capture.dtypes import digest
from kbtrace.capture.executor import Machine, Op
from kbtrace.capture.image import MemoryImage

BASE = 0x4000_0000


def test_cached_read_is_shared_and_read_only() -> None:
    mem = MemoryImage()
    mem.write(BASE, np.arange(64, dtype=np.float32))
    e1 = mem.cached_read(BASE, (4, 4), "f32", (8, 1))
    e2 = mem.cached_read(BASE, [4, 4], "f32", [8, 1])
    assert e1 is e2
    assert e1[0].tolist()[1] == [8.0, 9.0, 10.0, 11.0]
    with pytest.raises(ValueError):
        e1[0][0, 0] = 1.0


@pytest.mark.parametrize("where", [0, 8 * 4 + 3 * 4, 60 * 4, 8 * 1024 * 4])
def test_write_into_span_invalidates(where: int) -> None:
    mem = MemoryImage()
    mem.write(BASE, np.arange(64, dtype=np.float32))
    before = mem.cached_read(BASE, (4, 4), "f32", (8, 1))[0].copy()
    mem.write(BASE + where, np.full(1, -1.0, dtype=np.float32))
    after = mem.cached_read(BASE, (4, 4), "f32", (8, 1))[0]
    assert np.array_equal(after, mem.read(BASE, (4, 4), "f32", (8, 1)))
    touched = where < 4 * 8 * 4
    assert np.array_equal(after, before) == (not touched or where == 60 * 4)


def test_strided_write_invalidates_remembered_tile() -> None:
    mem = MemoryImage()
    tile = np.ones((2, 2), dtype=np.float32)
    e = [tile, None, None]
    mem.write(BASE, tile)
    mem.remember(BASE, "f32", e)
    assert mem.cached_read(BASE, (2, 2), "f32") is e
    mem.write(BASE, np.full((2, 1), 7.0, dtype=np.float32), strides=(2, 1))
    got = mem.cached_read(BASE, (2, 2), "f32")[0]
    assert got.tolist() == [[7.0, 1.0], [7.0, 1.0]]


def test_contiguous_strided_read_does_not_alias_the_page() -> None:
    mem = MemoryImage()
    mem.write(BASE, np.arange(8, dtype=np.float32))
    view = mem.read(BASE, (2, 4), "f32", (4, 1))   # contiguous although strided
    mem.write(BASE, np.zeros(8, dtype=np.float32))
    assert view.tolist() == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]


def test_machine_digests_follow_memory_not_the_cache() -> None:
    m = Machine()
    m.mem.write(BASE, np.arange(16, dtype=np.float32))
    load = Op(op_id=0, kind="load", src_addr=BASE, dst_addr=BASE + 4096, out_shape=[2, 2],
              out_dtype="f32", mem_strides=[4, 1])
    _, d0 = m.step(load)
    assert d0 == digest(np.array([[0, 1], [4, 5]], dtype=np.float32))
    assert m.step(load)[1] == d0
    store = Op(op_id=1, kind="store", src_addr=BASE + 8192, dst_addr=BASE + 4, out_shape=[1],
               out_dtype="f32")
    m.mem.write(BASE + 8192, np.full(1, 9.0, dtype=np.float32))
    m.step(store)
    assert m.step(load)[1] == digest(np.array([[0, 9], [4, 5]], dtype=np.float32))


def test_noted_digest_outlives_the_cache_until_a_write_touches_its_span() -> None:
    """note_digest: a re-read after the cache dropped the entry starts with the digest of
    the same bytes; after a write into the span (or the memo's own reset) it starts with
    none, and a digest computed then is of the new bytes."""
    from kbtrace.capture import image
    mem = MemoryImage()
    mem.write(BASE, np.arange(256, dtype=np.int32))
    key = (BASE, (4, 4), "i32", (16, 1))
    e = mem.cached_read(BASE, (4, 4), "i32", (16, 1))
    e[1] = digest(e[0])
    mem.note_digest(key, e)
    for i in range(image._CACHE_CAP):          # fill the cache: it starts over
        mem.remember(BASE + (1 << 24) + 64 * i, "i32", [np.zeros(4, np.int32), None, None])
    again = mem.cached_read(BASE, (4, 4), "i32", (16, 1))
    assert again is not e and again[1] == e[1] == digest(again[0])
    mem.write(BASE + 16 * 4 * 3 + 8, np.full(1, -5, np.int32))     # row 3, column 2
    fresh = mem.cached_read(BASE, (4, 4), "i32", (16, 1))
    assert fresh[1] is None and fresh[0][3, 2] == -5
    mem.note_digest(key, [fresh[0], 123, None])                     # not what a read returns
    assert key not in mem._dig
    stale = [e[0], e[1], None]
    mem.note_digest((BASE + 4, (4, 4), "i32", (16, 1)), stale)      # never read: ignored
    assert (BASE + 4, (4, 4), "i32", (16, 1)) not in mem._dig


def test_clear_forgets_pages_and_cached_reads() -> None:
    mem = MemoryImage()
    mem.write(BASE, np.arange(16, dtype=np.int32))
    e = mem.cached_read(BASE, (4,), "i32")
    e[1] = digest(e[0])
    mem.note_digest((BASE, (4,), "i32", None), e)
    mem.clear()
    assert (mem._pages, mem._cache, mem._idx, mem._dig) == ({}, {}, {}, {})
    assert mem.read(BASE, (4,), "i32").tolist() == [0, 0, 0, 0]


def test_capture_frees_its_images_before_the_references_and_memory_parquet(
        tmp_path, monkeypatch) -> None:
    """The golden executor's image and the capture-time image (every PE's TCM the kernels
    used, the tensors twice) are empty when the references are computed and memory.parquet
    is written, and the trace is the one written when they were not freed (same bytes)."""
    import hashlib
    from pathlib import Path

    from kbtrace.capture import capture, trace, tracer

    root = Path(__file__).resolve().parents[1]
    seen: list[tuple[int, int]] = []
    made: list[tracer.Tracer] = []
    init = tracer.Tracer.__init__

    def keep(self, *a, **k):       # type: ignore[no-untyped-def]
        init(self, *a, **k)
        made.append(self)

    write = trace._write_memory

    def spy(path, w, refs):         # type: ignore[no-untyped-def]
        seen.append((len(made[-1].mem._pages), len(made[-1].kmem._pages)))
        write(path, w, refs)

    def sha(d: Path) -> list[str]:
        return [hashlib.sha256((d / f).read_bytes()).hexdigest()
                for f in ("ops.parquet", "memory.parquet")]

    topo = root / "topologies" / "small.yaml"
    monkeypatch.setattr(tracer.Tracer, "__init__", keep)
    monkeypatch.setattr(trace, "_write_memory", spy)
    capture(root / "capture" / "gemm.py", topo, out_dir=tmp_path / "freed")
    assert seen == [(0, 0)]
    monkeypatch.setattr(tracer.Tracer, "release", lambda self: None)
    capture(root / "capture" / "gemm.py", topo, out_dir=tmp_path / "kept")
    assert seen[1][0] > 0 and seen[1][1] > 0
    assert sha(tmp_path / "freed") == sha(tmp_path / "kept")


@pytest.mark.parametrize("row_elems", [2_048, 15_552, 52_032])
def test_a_tile_of_a_wide_matrix_is_indexed_by_its_rows(row_elems: int) -> None:
    """A (32, 64) i32 tile of a matrix with ``row_elems`` columns spans ~32 rows of it; the
    cache indexes the chunks its rows touch (at most 2 per row, whatever the width), so a
    write between its rows keeps the entry and a write into a row drops it."""
    mem = MemoryImage()
    rows = np.arange(32 * row_elems, dtype=np.int32).reshape(32, row_elems)
    mem.write(BASE, rows)
    entry = mem.cached_read(BASE, (32, 64), "i32", (row_elems, 1))
    indexed = [c for c, keys in mem._idx.items() if any(k[0] == BASE for k in keys)]
    assert len(indexed) <= 64
    assert entry[0].tolist()[1][:2] == [row_elems, row_elems + 1]
    mid = BASE + (row_elems + row_elems // 2) * 4      # between rows 1 and 2
    mem.write(mid, np.full(1, -7, dtype=np.int32))
    # (invalidation is by 8 KiB chunk: with rows 8 KiB apart every chunk holds a row)
    assert (mem.cached_read(BASE, (32, 64), "i32", (row_elems, 1)) is entry) == \
        (row_elems * 4 >= 4 * 8192)
    entry = mem.cached_read(BASE, (32, 64), "i32", (row_elems, 1))
    mem.write(BASE + (5 * row_elems + 63) * 4, np.full(1, -7, dtype=np.int32))  # row 5, last
    again = mem.cached_read(BASE, (32, 64), "i32", (row_elems, 1))
    assert again is not entry and again[0][5, 63] == -7
    assert np.array_equal(again[0], mem.read(BASE, (32, 64), "i32", (row_elems, 1)))


# --- strided tiles across 1 MiB pages: gathered and scattered page by page, never by span ---
_PAGE = 1 << 20


@pytest.mark.parametrize(("rows", "cols", "row_stride", "offset"), [
    (32, 64, 15_616, 0),               # a (BM, BK) tile of a (2,048, 15,616) i32 matrix
    (32, 64, 15_616, _PAGE - 3 * 4),   # its first row straddles a page boundary
    (64, 32, 2_048, _PAGE - 40_000),   # a (BK, BN) tile across one boundary
    (3, 5, 300_000, 12),               # every row on its own page
    (8, 8, 1, 0),                      # rows interleave (row stride < row span): the span path
])
def test_strided_tiles_across_pages_match_numpy(rows: int, cols: int, row_stride: int,
                                                offset: int) -> None:
    col_stride = 1 if row_stride > 1 else 8
    span = (rows - 1) * row_stride + (cols - 1) * col_stride + 1
    backing = np.arange(span + 64, dtype=np.int32) * 7 - 5
    mem = MemoryImage()
    addr = BASE + offset
    mem.write(addr, backing)
    view = np.lib.stride_tricks.as_strided(backing, shape=(rows, cols),
                                           strides=(row_stride * 4, col_stride * 4))
    got = mem.read(addr, (rows, cols), "i32", (row_stride, col_stride))
    assert np.array_equal(got, view)
    cached = mem.cached_read(addr, (rows, cols), "i32", (row_stride, col_stride))
    assert np.array_equal(cached[0], view)
    tile = -np.arange(rows * cols, dtype=np.int32).reshape(rows, cols) - 1
    mem.write(addr, tile, (row_stride, col_stride))
    expect = backing.copy()
    np.lib.stride_tricks.as_strided(expect, shape=(rows, cols),
                                    strides=(row_stride * 4, col_stride * 4))[...] = tile
    assert np.array_equal(mem.read(addr, (span + 64,), "i32"), expect)   # nothing else moved
    again = mem.cached_read(addr, (rows, cols), "i32", (row_stride, col_stride))
    assert again is not cached and np.array_equal(again[0], tile)        # the write invalidated


def test_strided_read_of_unwritten_pages_is_zeros() -> None:
    mem = MemoryImage()
    mem.write(BASE, np.ones(4, dtype=np.int32))
    got = mem.read(BASE + 3 * _PAGE, (4, 4), "i32", (300_000, 1))
    assert got.dtype == np.int32 and not got.any() and got.shape == (4, 4)


def test_strided_tile_across_pages_copies_rows_not_its_span(monkeypatch) -> None:
    mem = MemoryImage()
    mem.write(BASE, np.zeros(32 * 15_616, dtype=np.int32))      # ~1.9 MiB: two pages and more
    copied: list[int] = []
    real = MemoryImage.read_bytes
    monkeypatch.setattr(MemoryImage, "read_bytes",
                        lambda self, a, n: copied.append(n) or real(self, a, n))
    for offset in (0, _PAGE - 12):
        mem.read(BASE + offset, (32, 64), "i32", (15_616, 1))
        mem.write(BASE + offset, np.ones((32, 64), dtype=np.int32), (15_616, 1))
    assert copied and max(copied) <= 64 * 4     # a straddling row, never the 1.9 MiB span


def test_read_cache_evicts_the_least_recently_used(monkeypatch) -> None:
    from kbtrace.capture import image
    monkeypatch.setattr(image, "_CACHE_CAP", 4)
    mem = MemoryImage()
    mem.write(BASE, np.arange(1024, dtype=np.int32))
    first = mem.cached_read(BASE, (4,), "i32")
    for i in range(1, 4):                                   # fills the cache: 4 entries
        mem.cached_read(BASE + 16 * i, (4,), "i32")
    assert mem.cached_read(BASE, (4,), "i32") is first       # a hit: now the most recent
    mem.cached_read(BASE + 64, (4,), "i32")                  # evicts BASE + 16, not BASE
    assert mem.cached_read(BASE, (4,), "i32") is first
    assert mem.cached_read(BASE + 16, (4,), "i32")[0].tolist() == [4, 5, 6, 7]
    assert len(mem._cache) == 4


def test_read_cache_is_bounded_by_bytes(monkeypatch) -> None:
    from kbtrace.capture import image
    monkeypatch.setattr(image, "_CACHE_BYTES", 10 * 4096)
    mem = MemoryImage()
    mem.write(BASE, np.arange(64 * 1024, dtype=np.int32))
    tiles = [mem.cached_read(BASE + 4096 * i, (1024,), "i32") for i in range(30)]
    assert mem._bytes == sum(e[0].nbytes for e in mem._cache.values()) == 10 * 4096
    assert list(mem._cache.values()) == tiles[-10:]
    mem.write(BASE + 4096 * 29, np.zeros(1, np.int32))      # drops 28 and 29 (one 8 KiB chunk)
    assert mem._bytes == 8 * 4096 and len(mem._cache) == 8


def test_read_cache_counts_an_entry_under_two_keys_once(monkeypatch) -> None:
    """A load's entry is cached under its source and its TCM copy: its bytes count once,
    and come back when the last of its keys leaves."""
    from kbtrace.capture import image
    monkeypatch.setattr(image, "_CACHE_BYTES", 3 * 4096)
    mem = MemoryImage()
    mem.write(BASE, np.arange(8 * 1024, dtype=np.int32))
    tcm = BASE + (1 << 24)
    entries = []
    for i in range(3):                               # three loads: source + TCM copy each
        e = mem.cached_read(BASE + 8192 * i, (1024,), "i32")
        mem.write(tcm + 8192 * i, e[0])
        mem.remember(tcm + 8192 * i, "i32", e)
        entries.append(e)
    assert mem._bytes == 3 * 4096 and len(mem._cache) == 6     # all kept: 3 arrays, 6 keys
    mem.write(BASE + 8192, np.zeros(1, np.int32))               # drops load 1's source key
    assert mem._bytes == 3 * 4096 and len(mem._cache) == 5      # its TCM key still holds it
    mem.write(tcm + 8192, np.zeros(1, np.int32))
    assert mem._bytes == 2 * 4096 and len(mem._cache) == 4
    assert set(map(id, mem._cache.values())) == {id(entries[0]), id(entries[2])}


@pytest.mark.parametrize("seed", range(6))
def test_dirty_writes_read_back_as_a_flat_memory_would(seed: int) -> None:
    """``write_entry`` keeps its array dirty (no page bytes) until a read, a strided write
    or a partial overwrite needs the pages: random mixes of every write and read path over
    a span crossing a page boundary give what a flat byte array gives."""
    rng = np.random.default_rng(seed)
    base = BASE + (1 << 20) - 6 * 1024         # 6 KiB below a page boundary
    n = 16 * 1024
    flat = np.zeros(n, dtype=np.uint8)
    mem = MemoryImage()
    for step in range(400):
        kind = rng.integers(6)
        off = int(rng.integers(0, n // 4 - 64)) * 4
        if kind <= 1:       # a dirty write (a load's TCM copy, a dot's result)
            k = int(rng.integers(1, 64))
            arr = rng.integers(-9, 9, size=k).astype(np.int32)
            mem.write_entry(base + off, "i32", [arr, None, None])
            flat[off:off + 4 * k] = arr.view(np.uint8)
        elif kind == 2:     # a plain contiguous write, often over dirty spans
            k = int(rng.integers(1, 64))
            arr = rng.integers(-9, 9, size=k).astype(np.int32)
            mem.write(base + off, arr)
            flat[off:off + 4 * k] = arr.view(np.uint8)
        elif kind == 3:     # a strided tile write (leaves its gaps as they were)
            tile = rng.integers(-9, 9, size=(4, 3)).astype(np.int32)
            mem.write(base + off, tile, strides=(7, 1))
            view = np.ndarray((4, 3), np.int32, flat, off, (28, 4))
            view[...] = tile
        elif kind == 4:     # a strided tile read
            got = mem.read(base + off, (4, 3), "i32", (7, 1))
            assert np.array_equal(got, np.ndarray((4, 3), np.int32, flat, off, (28, 4))), step
        else:               # a cached contiguous read
            k = int(rng.integers(1, 64))
            got = mem.cached_read(base + off, (k,), "i32")[0]
            assert np.array_equal(got, flat[off:off + 4 * k].view(np.int32)), step
    assert np.array_equal(mem.read_bytes(base, n), flat)
    assert not mem._dirty           # read_bytes of the whole span wrote every dirty array


def test_dirty_write_covered_whole_is_dropped_without_a_page() -> None:
    mem = MemoryImage()
    a, b = np.arange(8, dtype=np.int32), np.arange(8, 16, dtype=np.int32)
    mem.write_entry(BASE, "i32", [a, None, None])
    mem.write_entry(BASE, "i32", [b, None, None])     # the same span: a never reaches a page
    assert not mem._pages
    assert list(mem._dirty) == [BASE] and mem._dirty[BASE][0] is b
    assert not mem._cache       # (a dirty entry is read from the dirty map, not the cache)
    assert mem.cached_read(BASE, (8,), "i32")[0] is b
    assert mem.cached_read(BASE, (2, 4), "i32")[0].tolist() == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert not mem._dirty and len(mem._pages) == 1      # (another shape: through the pages)
    mem.write_entry(BASE, "i32", [b, None, None])
    assert mem.read(BASE, (8,), "i32").tolist() == list(range(8, 16))
    assert not mem._dirty and len(mem._pages) == 1


def test_drop_forgets_a_dead_span_without_a_page_and_keeps_the_rest() -> None:
    """``drop`` of a span written whole (a dead buffer): its array leaves the dirty set and
    the read cache without reaching a page; the next write there takes the same-span path;
    a span written in part or not exactly as given is kept."""
    mem = MemoryImage()
    other = BASE + 8192                                 # (another 8 KiB chunk of the cache)
    a = np.arange(8, dtype=np.int32)                   # [BASE, BASE + 32)
    b = np.arange(100, 104, dtype=np.int32)            # [other, other + 16)
    mem.write_entry(BASE, "i32", [a, 7, None])
    mem.write_entry(other, "i32", [b, None, None])
    assert mem._bytes == 0 and not mem._cache       # (dirty entries: not in the cache)
    assert mem.cached_read(BASE, (8,), "i32")[1] == 7
    mem.drop([(BASE, 32), (other, 8), (BASE + 4096, 32)])    # exact, partial, unwritten
    assert mem._dirty[other][0] is b and mem._dirty[BASE].nbytes == 32
    assert mem._dirty[BASE].__class__ is not list and not mem._pages
    c = np.arange(8, 16, dtype=np.int32)
    mem.write_entry(BASE, "i32", [c, None, None])     # the buffer's next owner
    assert mem._dirty[BASE][0] is c and not mem._pages
    assert mem.read(BASE, (8,), "i32").tolist() == list(range(8, 16))
    assert mem.read(other, (4,), "i32").tolist() == [100, 101, 102, 103]
    # a dropped span read through the pages (never done by the executor) gives the page's
    # older bytes, not the forgotten ones: here the zeros it had
    mem.write_entry(BASE + 4096, "i32", [a, None, None])
    mem.drop([(BASE + 4096, 32)])
    assert mem.read(BASE + 4096, (8,), "i32").tolist() == [0] * 8
    assert BASE + 4096 not in mem._dirty


def test_capture_forgets_dead_tcm_buffers_with_the_same_trace(tmp_path, monkeypatch) -> None:
    """The golden image drops a TCM buffer's bytes once its owner died (``Tracer.dead``):
    after the kernels of gemm on small.yaml (tight TCM, so buffers are reused) it holds the
    arrays of a few live buffers, not every buffer the TCM held; the trace is byte for byte
    the one written when nothing is dropped."""
    import hashlib
    from pathlib import Path

    from kbtrace.capture import capture, tracer
    from kbtrace.capture.image import _Dead
    from kbtrace.topology import compile_topology

    root = Path(__file__).resolve().parents[1]
    topo = compile_topology(root / "topologies" / "small.yaml",
                            overrides={"pe.tcm.size_kb": 64, "pe.tcm.scratch_kb": 32})
    held: list[tuple[int, int]] = []
    release = tracer.Tracer.release

    def spy(self):                  # type: ignore[no-untyped-def]
        d = self.mem._dirty
        held.append((sum(1 for v in d.values() if v.__class__ is not _Dead),
                     sum(v[0].nbytes for v in d.values() if v.__class__ is not _Dead)))
        release(self)

    def sha(d: Path) -> list[str]:
        return [hashlib.sha256((d / f).read_bytes()).hexdigest()
                for f in ("ops.parquet", "memory.parquet", "trace.json")]

    monkeypatch.setattr(tracer.Tracer, "release", spy)
    params = {"M": 256, "N": 256, "K": 512}
    capture(root / "capture" / "gemm.py", topo, params, out_dir=tmp_path / "dropped")
    monkeypatch.setattr(MemoryImage, "drop", lambda self, spans: None)
    capture(root / "capture" / "gemm.py", topo, params, out_dir=tmp_path / "kept")
    assert held == [(7, 45_056), (384, 2_097_152)]  # (32 PEs x 64 KiB: all TCM)
    assert sha(tmp_path / "dropped") == sha(tmp_path / "kept")


def test_write_shared_keeps_a_page_once_until_either_image_writes_it() -> None:
    """Capture's two images get the initial tensors through ``write_shared``: a page both
    would hold alike is one array, copied by whichever image writes into it first; a page
    the other image had of its own gets a plain write there."""
    mem, kmem = MemoryImage(), MemoryImage()
    page = 1 << 20
    a = np.arange(page // 4 + 8, dtype=np.int32)             # one page and 32 B
    mem.write_shared(kmem, BASE, a)
    mem.write_shared(kmem, BASE + a.nbytes, np.full(8, 7, dtype=np.int32))
    assert sorted(mem._pages) == sorted(kmem._pages) == [BASE >> 20, (BASE >> 20) + 1]
    assert all(mem._pages[n] is kmem._pages[n] for n in mem._pages)
    kmem.write(BASE + 16, np.array([-1], dtype=np.int32))   # kmem's own copy of page 0
    assert mem._pages[BASE >> 20] is not kmem._pages[BASE >> 20]
    assert kmem.read(BASE, (6,), "i32").tolist() == [0, 1, 2, 3, -1, 5]
    assert mem.read(BASE, (6,), "i32").tolist() == [0, 1, 2, 3, 4, 5]
    mem.write(BASE + page + 32, np.array([9], dtype=np.int32))    # mem's own copy of page 1
    assert mem.read(BASE + page, (10,), "i32").tolist() == [262144 + i for i in range(8)] + [9, 7]
    assert kmem.read(BASE + page, (10,), "i32").tolist() == [262144 + i for i in range(8)] + [7, 7]
    # pages each holds its own copy of: written in both, not shared again
    mem.write_shared(kmem, BASE + 8, np.array([5, 5], dtype=np.int32))
    assert mem._pages[BASE >> 20] is not kmem._pages[BASE >> 20]
    assert kmem.read(BASE, (6,), "i32").tolist() == [0, 1, 5, 5, -1, 5]
    assert mem.read(BASE, (6,), "i32").tolist() == [0, 1, 5, 5, 4, 5]
    mem.clear()
    assert not mem._shared and kmem.read(BASE, (2,), "i32").tolist() == [0, 1]


def test_write_shared_borrows_the_whole_pages_of_the_tensor_itself() -> None:
    """The whole pages an initial tensor covers are read-only views of its own array in both
    images (its bytes held once); a write into either image copies the page first, so the
    tensor's array never changes; the partial pages at its ends are the images' own."""
    mem, kmem = MemoryImage(), MemoryImage()
    page = 1 << 20
    addr = BASE + page - 64                         # 64 B in page 0, pages 1-2 whole, 32 B in 3
    a = np.arange((64 + 2 * page + 32) // 4, dtype=np.int32)
    before = a.copy()
    mem.write_shared(kmem, addr, a)
    p0 = BASE >> 20
    assert sorted(mem._pages) == sorted(kmem._pages) == [p0, p0 + 1, p0 + 2, p0 + 3]
    for n in (p0 + 1, p0 + 2):                      # borrowed: views of ``a``, not writeable
        assert mem._pages[n] is kmem._pages[n] and np.shares_memory(mem._pages[n], a)
        assert not mem._pages[n].flags.writeable
    for n in (p0, p0 + 3):
        assert not np.shares_memory(mem._pages[n], a)
    assert mem.read(addr, a.shape, "i32").tolist() == a.tolist()
    kmem.write(addr + 64 + 8, np.array([-1, -2], dtype=np.int32))       # into page 1
    mem.write(addr + 64 + page, np.array([-3], dtype=np.int32), (1,))    # into page 2
    assert np.array_equal(a, before)
    assert kmem.read(addr + 64, (4,), "i32").tolist() == [16, 17, -1, -2]
    assert mem.read(addr + 64, (4,), "i32").tolist() == [16, 17, 18, 19]
    assert mem.read(addr + 64 + page, (2,), "i32").tolist() == [-3, 16 + page // 4 + 1]
    assert kmem.read(addr + 64 + page, (2,), "i32").tolist() == [16 + page // 4, 16 + page // 4 + 1]
    # a later initial write over a borrowed page: each image gets its own copy, written
    mem.write_shared(kmem, addr + 64 + 2 * page - 8, np.array([7, 7], dtype=np.int32))
    assert np.array_equal(a, before)
    assert mem.read(addr + 64 + 2 * page - 8, (2,), "i32").tolist() == [7, 7]
    assert kmem.read(addr + 64 + 2 * page - 8, (2,), "i32").tolist() == [7, 7]


def test_an_integer_dot_scans_each_cached_operand_tile_once(monkeypatch) -> None:
    """``max|x|`` of an integer dot's operands (is float32 BLAS exact?) is kept with the
    tile's cache entry: two dots of the same tiles scan each tile once; a write there
    makes a new entry, scanned anew; the products are numpy's."""
    from kbtrace.capture import executor

    scanned: list[int] = []
    real = executor.absmax

    def spy(x):                     # type: ignore[no-untyped-def]
        scanned.append(real(x))
        return real(x)

    monkeypatch.setattr(executor, "absmax", spy)
    m = Machine()
    a = np.array([[1, -7], [3, 2]], dtype=np.int32)
    b = np.array([[5, 0], [-2, 4]], dtype=np.int32)
    m.mem.write(BASE, a)
    m.mem.write(BASE + 65536, b)          # (another chunk: not invalidated with a)

    def dot(i: int) -> Op:
        return Op(op_id=i, kind="dot", in_addrs=[BASE, BASE + 65536], in_shapes=[[2, 2], [2, 2]],
                  in_dtypes=["i32", "i32"], out_shape=[2, 2], out_dtype="i32", acc_dtype="i32",
                  dst_addr=BASE + 8192 * (i + 1), m=2, n=2, k=2)

    outs = [m.step(dot(i))[0].tolist() for i in range(2)]
    assert outs == [(a @ b).tolist()] * 2 == [[[19, -28], [11, 8]]] * 2
    assert scanned == [7, 5]
    assert m.mem.cached_read(BASE, (2, 2), "i32")[3] == 7
    m.mem.write(BASE, np.array([[100, 0], [0, 1]], dtype=np.int32))
    assert m.step(dot(2))[0].tolist() == [[500, 0], [-2, 4]]
    assert scanned == [7, 5, 100]


def test_forget_reads_at_drops_the_reads_starting_there_and_nothing_else() -> None:
    """Verify forgets a tile's cached reads after the last load of it: what starts at that
    address leaves the cache (its bytes uncounted), other reads stay, and a read there
    afterwards reads the pages again (the same values, a new entry)."""
    mem = MemoryImage()
    mem.write(BASE, np.arange(256, dtype=np.int32))
    tile = mem.cached_read(BASE, (2, 4), "i32", (16, 1))
    flat = mem.cached_read(BASE, (8,), "i32")
    other = mem.cached_read(BASE + 64, (2, 4), "i32", (16, 1))
    assert len(mem._cache) == 3 and mem._bytes == 3 * 32
    mem.forget_reads_at([BASE, BASE + 4])            # (nothing is cached at BASE + 4)
    assert list(mem._cache.values()) == [other] and mem._bytes == 32
    again = mem.cached_read(BASE, (2, 4), "i32", (16, 1))
    assert again is not tile and again[0].tolist() == tile[0].tolist() == [
        [0, 1, 2, 3], [16, 17, 18, 19]]
    assert mem.cached_read(BASE, (8,), "i32")[0].tolist() == flat[0].tolist()
    assert mem.cached_read(BASE + 64, (2, 4), "i32", (16, 1)) is other


def test_forgotten_reads_leave_the_chunk_index() -> None:
    """A forgotten tile's key leaves every chunk it was indexed under (one per row of a
    (2, 4) tile of a 2,048-element-wide matrix: two rows, two chunks), so the index holds
    the cached entries' keys only, however many tiles were read and forgotten (kept, a
    1.0 M-op gemm's index held every A / B tile's key: ~48 MiB); a key whose digest was
    noted stays, for writes to drop that digest."""
    mem = MemoryImage()
    wide = 2048                                     # 8 KiB rows: one chunk per row
    mem.write(BASE, np.arange(4 * wide, dtype=np.int32))
    for col in range(0, 64, 4):                     # 16 tiles along the same two rows
        mem.cached_read(BASE + 4 * col, (2, 4), "i32", (wide, 1))
    assert sorted(len(k) for k in mem._idx.values()) == [16, 16]
    mem.forget_reads_at([BASE + 4 * col for col in range(0, 60, 4)])
    assert sorted(len(k) for k in mem._idx.values()) == [1, 1]
    assert {k[0] for keys in mem._idx.values() for k in keys} == {BASE + 4 * 60}
    kept = mem.cached_read(BASE + 4 * 60, (2, 4), "i32", (wide, 1))
    kept[1] = digest(kept[0])
    mem.note_digest((BASE + 4 * 60, (2, 4), "i32", (wide, 1)), kept)
    mem.forget_reads_at([BASE + 4 * 60])
    assert not mem._cache and sorted(len(k) for k in mem._idx.values()) == [1, 1]
    mem.write(BASE + 4 * 60, np.zeros(1, dtype=np.int32))    # the noted digest is dropped
    assert not mem._dig
    assert mem.cached_read(BASE + 4 * 60, (2, 4), "i32", (wide, 1))[1] is None


def test_memory_rows_are_slices_of_the_data_buffer_not_copies() -> None:
    """``executor._rows`` gives each memory row's bytes as a slice of its column's data buffer
    (a row's scalar copied its tensor: 40.5 MiB per input of a 1.0 M-op gemm), nulls as
    None, also for a table sliced past its first row."""
    import pyarrow as pa

    from kbtrace.capture.executor import _rows

    for typ in (pa.binary(), pa.large_binary()):
        t = pa.table({"role": ["input", "output", "input", "reference"],
                      "data": pa.array([b"ab", None, b"cdef", b"g"], typ)}).slice(1)
        got = list(_rows(t))
        assert [r for r, _ in got] == [{"role": "output"}, {"role": "input"},
                                       {"role": "reference"}]
        assert [None if b is None else b.to_pybytes() for _, b in got] == [None, b"cdef", b"g"]
        data = t.column("data").chunk(0).buffers()[2]
        assert got[1][1].address == data.address + 2      # (after "ab": no copy)

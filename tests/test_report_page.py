"""The report page as a reader sees it: the template escapes what it shows, and headless
Chromium (Debian's ``chromium``, when installed) loads every image and never has to scroll
the page sideways (a wide table scrolls inside its own box)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import polars as pl
import pytest

from kbtrace.analysis.reporter import UNITS_NOTE, report, write_page
from kbtrace.analysis.synthetic import write_synthetic_run
from kbtrace.capture import capture
from kbtrace.replay.sweep import run_sweep
from kbtrace.topology import compile_topology
from test_replay_util import TOPO_DIR

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install chromium)")
WIDTH = 1280       # px: the browser window (a laptop screen)

# Appended to a copy of the page: after load, what a reader would notice, as JSON in the DOM.
_CHECK = """<script>
window.addEventListener("load", () => {
  const vw = document.documentElement.clientWidth;
  const imgs = [...document.images].map(i => ({alt: i.alt, natural: i.naturalWidth,
                                                shown: i.clientWidth, complete: i.complete}));
  // elements whose right edge passes the window, outside a scrolling table box
  const wide = [...document.body.querySelectorAll("*")]
    .filter(e => !e.parentElement.closest(".table-wrap"))
    .filter(e => e.getBoundingClientRect().right > vw + 0.5)
    .map(e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : ""));
  const boxes = [...document.querySelectorAll(".table-wrap")]
    .map(b => ({scrolls: b.scrollWidth > b.clientWidth, width: b.clientWidth}));
  const out = document.createElement("pre");
  out.id = "kbtrace-check";
  out.textContent = JSON.stringify({vw, scrollWidth: document.documentElement.scrollWidth,
                                    imgs, wide, boxes});
  document.body.appendChild(out);
});
</script>"""

_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          f"--window-size={WIDTH},900"]


def _look(page, tmp_path):
    """Load ``page`` (an index.html) in headless Chromium; the ``_CHECK`` results."""
    probe = tmp_path / f"probe-{page.parent.name}.html"
    probe.write_text(page.read_text().replace("</body>", _CHECK + "</body>"))
    r = subprocess.run([CHROMIUM, *_FLAGS, f"--user-data-dir={tmp_path / 'chrome'}",
                        "--dump-dom", probe.as_uri()], capture_output=True, text=True,
                       timeout=180)
    m = re.search(r'<pre id="kbtrace-check">(.*?)</pre>', r.stdout, re.S)
    assert m, f"no check result from chromium (exit {r.returncode}): {r.stderr[-800:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def _assert_reads_well(seen, n_images, where):
    assert len(seen["imgs"]) == n_images, where
    for img in seen["imgs"]:
        assert img["complete"] and img["natural"] > 0, (where, img)
        # shown at (nearly) its own size: 9 pt at 100 dpi stays >= 12 px on the screen
        assert img["shown"] >= 0.95 * img["natural"], (where, img)
    assert seen["wide"] == [], (where, seen["wide"])
    assert seen["scrollWidth"] <= seen["vw"], (where, seen["scrollWidth"], seen["vw"])


def test_page_escapes_what_it_shows(tmp_path):
    df = pl.DataFrame({"name <b>": ["<script>alert(1)</script>", "a & b"], "t_ns": [1.5, 2e9]})
    write_page(tmp_path, "run <x>", [("Heading & <i>", "t", None)], {"t": df}, {},
               note=["5 < 6 & 7"], units=UNITS_NOTE)
    page = (tmp_path / "index.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<title>run &lt;x&gt;</title>" in page and "<th>name &lt;b&gt;</th>" in page
    assert "5 &lt; 6 &amp; 7" in page and "Heading &amp; &lt;i&gt;" in page
    assert '<td class="num">2e+09</td>' in page and '<td class="text">a &amp; b</td>' in page
    assert UNITS_NOTE in page


def test_long_table_says_where_the_rest_is(tmp_path):
    write_page(tmp_path, "t", [("T", "t", None)], {"t": pl.DataFrame({"i": range(45)})}, {})
    page = (tmp_path / "index.html").read_text()
    assert page.count("<tr>") == 41 and "5 more rows in tables/t.csv" in page


@needs_chromium
def test_run_report_in_chromium_images_load_nothing_overflows(tmp_path):
    out = report(write_synthetic_run(tmp_path / "run"), tmp_path / "rep")
    _assert_reads_well(_look(out / "index.html", tmp_path), 6, "run report")


@needs_chromium
def test_sweep_report_in_chromium_wide_points_table_scrolls_in_its_box(tmp_path):
    """The sweep's points table (23-24 columns) ran off the page; now it scrolls in its box."""
    small = str(TOPO_DIR / "small.yaml")
    capture(TOPO_DIR.parent / "capture" / "gemm.py", compile_topology(small),
            {"M": 64, "N": 64, "K": 64}, tmp_path / "gemm")
    res = run_sweep({"traces": [str(tmp_path / "gemm")], "topologies": [small],
                     "grid": {"cube.hbm.pc_bw_gbps": [4, 64]}}, tmp_path / "sweep")
    assert res.ok
    out = report(tmp_path / "sweep", tmp_path / "rep")
    assert len(pl.read_csv(out / "tables" / "points.csv").columns) >= 20
    seen = _look(out / "index.html", tmp_path)
    _assert_reads_well(seen, 2, "sweep report")
    assert any(b["scrolls"] for b in seen["boxes"])      # the points table, inside its box

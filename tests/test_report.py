"""report.html: self-contained, with the spec, the tables and every figure, rendered in headless Chromium
(Debian's package: scripts/sysdeps.sh installs it as root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# After the load event every image has decoded or failed; the page records which, and --dump-dom prints it.
PROBE = """<img id="probe-broken" src="data:image/png;base64,AAAA"><script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  document.body.dataset.images = imgs.length;
  const ok = i => i.complete && i.naturalWidth > 0;
  document.body.dataset.loaded = imgs.filter(ok).length;
  document.body.dataset.broken = imgs.filter(i => !ok(i)).map(i => i.alt || i.id).join(",");
});
</script>"""


class Page(HTMLParser):
    """What a test needs from a page: tables (id -> rows), images, links, body attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, int] = {}
        self.images: list[str] = []
        self.links: list[str] = []
        self.body: dict[str, str] = {}
        self._table: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id", "")
            self.tables[self._table] = 0
        elif tag == "tr" and self._table is not None:
            self.tables[self._table] += 1
        elif tag == "img":
            self.images.append(a.get("src", ""))
        elif tag == "a":
            self.links.append(a.get("href", ""))
        elif tag == "body":
            self.body = {k: v or "" for k, v in attrs}

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("r") / "tiny"
    r = subprocess.run([sys.executable, "-m", "testbed", "sim", str(ROOT / "experiments" / "tiny-3dc.yaml"), "--out",
                        str(out), "--sweep", "topology.links.*.latency_ms=5,30", "--set", "schedulers=[pp-wan,atlas]",
                        "--jobs", "1"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "testbed", "report", str(out), "--index", str(out.parent)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out / "report.html"


def test_the_report_holds_spec_tables_figures_and_trace_link(report):
    page = Page()
    page.feed(report.read_text())
    assert page.tables["summary"] == 1 + 4 and page.tables["summary-all"] == 5  # header + 2 points x 2
    figures = (report.parent / "figures")
    pngs = sorted(figures.glob("*.png"))
    assert len(page.images) == len(pngs) >= 5  # every figure drawn, embedded
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert {"trace.json", "spec.yaml", "summary.csv"} <= set(page.links)
    assert "latency_ms" in report.read_text() and "tiny-3dc" in report.read_text()
    index = Page()
    index.feed((report.parent.parent / "index.html").read_text())
    assert "tiny/report.html" in index.links


def test_a_bad_folder_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "testbed", "report", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "summary.csv" in r.stderr


def test_headless_chromium_loads_every_image_and_table(report, tmp_path):
    if CHROMIUM is None:
        if os.geteuid() != 0:
            pytest.skip("needs Debian's chromium (scripts/sysdeps.sh installs it as root)")
        pytest.fail("chromium is missing: run scripts/sysdeps.sh as root")
    page = tmp_path / "report.html"  # the report plus the probe, next to the report's own files
    page.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000", "--dump-dom",
                        page.as_uri()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = Page()
    dom.feed(r.stdout)
    n = int(dom.body["data-images"])
    assert n == len(list((report.parent / "figures").glob("*.png"))) + 1
    # every figure decoded; the deliberately broken probe image did not (so the check can fail)
    assert int(dom.body["data-loaded"]) == n - 1 and dom.body["data-broken"] == "probe-broken", dom.body
    assert dom.tables["summary"] == 5

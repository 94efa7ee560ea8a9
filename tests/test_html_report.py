"""`rewind forensics model.py --html report.html`: one self-contained page, rendered in headless Chromium.

The page is checked as Chromium builds it (--dump-dom after its script ran: the script marks the body ready, and
records any script error on it) and photographed; the screenshots are kept in the test run's temporary folder,
whose path the test prints (pytest -s shows it). The planted bug is half_positions: an error introduced by a
float16 `arange` and amplified by `cos`, so the chart has an origin and an amplifier to mark.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from provenance import forensics_cli
from tests.conftest import ROOT, line_of
from tests.forensics_cases import FORENSICS

MODEL = FORENSICS / "half_positions.py"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-extensions"]


def forensics(capsys, *args) -> tuple[int, str, str]:
    status = forensics_cli.main([*map(str, args), "--driver", "torch:cpu", "--budget-mb", "64"])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("report") / "report.html"
    status = forensics_cli.main([str(MODEL), "--driver", "torch:cpu", "--budget-mb", "64", "--html", str(path)])
    assert status == 1 and path.is_file()
    return str(path)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium, installed when missing (as `make extension` does, vscode-extension/scripts)."""
    done = subprocess.run([str(ROOT / "vscode-extension" / "scripts" / "ensure-chromium.sh")], capture_output=True,
                          text=True, env={**os.environ, "CHROMIUM": CHROMIUM})
    assert done.returncode == 0, done.stderr
    return CHROMIUM


def render(chromium: str, page: str, *mode: str) -> str:
    done = subprocess.run([chromium, *FLAGS, *mode, f"file://{page}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_report_is_one_self_contained_file(report):
    page = open(report).read()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page), "the page fetches something"
    assert "<link" not in page and "@import" not in page
    assert page.count('src="data:image/png;base64,') == 1
    verdict = re.search(r'id="verdict"[^>]*>([^<]*)<', page)[1]
    assert verdict == "Problem found"
    assert "error introduced at half_positions.py:%d by `arange`" % line_of(MODEL, "# BUG") in page
    assert f"by `cos` at half_positions.py:{line_of(MODEL, '# AMPLIFIED')}" in page
    bug = line_of(MODEL, "# BUG")
    assert f'<tr class=here><td class="n">{bug}</td>' in page  # the source excerpt marks the root cause's line
    assert "count positions and indices in int64 or float32" in page  # the fix
    assert "Confirmed by precision ablation" in page and "brings the outputs within tolerance" in page
    assert len(re.findall(r"<tr><td data-sort=", page)) == 11  # one row per node's floating output


def test_the_report_renders_in_headless_chromium_with_its_chart_and_table(report, chromium, tmp_path_factory):
    dom = render(chromium, report, "--dump-dom", "--virtual-time-budget=5000")
    body = re.search(r"<body[^>]*>", dom)[0]
    assert 'data-ready="sortable"' in body and "data-error" not in body, body
    assert re.search(r'<img id="growth-chart" alt="[^"]+" src="data:image/png;base64,', dom)
    assert len(re.findall(r"<tr>", dom.split('id="node-table"')[1].split("</table>")[0])) == 12  # header + 11
    shots = tmp_path_factory.mktemp("report-screenshots")
    for name, size in (("report-desktop", "1280,2400"), ("report-narrow", "480,3000")):
        render(chromium, report, f"--screenshot={shots / name}.png", f"--window-size={size}")
        png = (shots / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000, name  # a page with pictures, not blank
    print(f"screenshots of the report: {shots}")


def test_the_table_sorts_by_a_clicked_column_in_chromium(report, chromium, tmp_path):
    """The page's own script, clicked: the error column sorted up, then down (an infinite error sorts last)."""
    clicks = ("<script>const th = document.querySelectorAll('#node-table th')[6], first = () => "
              "document.querySelector('#node-table tbody td:nth-child(7)').dataset.sort;"
              "th.click(); document.body.dataset.up = first(); th.click(); document.body.dataset.down = first();"
              "</script></body>")
    clicked = tmp_path / "clicked.html"
    clicked.write_text(open(report).read().replace("</body>", clicks))
    dom = render(chromium, str(clicked), "--dump-dom")
    table = open(report).read().split('id="node-table"')[1]
    errors = [float(v) for v in re.findall(r'<td data-sort="([^"]+)">', table)[1::5]]  # tick, error, ... per row
    up, down = (float(re.search(fr'data-{d}="([^"]+)"', dom)[1]) for d in ("up", "down"))
    assert (up, down) == (min(errors), max(errors)) and "data-error" not in re.search(r"<body[^>]*>", dom)[0]


def test_an_html_target_that_would_destroy_something_is_refused_before_the_run(capsys, tmp_path):
    existing = tmp_path / "report.html"
    existing.write_text("keep me")
    status, _, err = forensics(capsys, MODEL, "--html", existing)
    assert status == 2 and f"{existing} exists and is kept; --overwrite replaces it" in err
    assert existing.read_text() == "keep me"
    status, _, err = forensics(capsys, MODEL, "--html", tmp_path)
    assert status == 2 and "it is a folder, not a regular file" in err
    status, _, err = forensics(capsys, MODEL, "--html", existing / "report.html")
    assert status == 2 and "is a file, not a folder" in err
    model = tmp_path / "model.py"
    shutil.copy(MODEL, model)
    status, _, err = forensics(capsys, model, "--html", model, "--overwrite")
    assert status == 2 and "it is the model file" in err and model.read_text() == MODEL.read_text()
    assert not list(tmp_path.glob(".*.partial"))


def test_overwrite_replaces_an_existing_report_whole(capsys, tmp_path):
    existing = tmp_path / "report.html"
    existing.write_text("old report")
    status, _, _ = forensics(capsys, FORENSICS / "cancellation.py", "--no-ablate", "--html", existing, "--overwrite")
    page = existing.read_text()
    assert status == 1 and page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "Precision ablation" in page and "Not run" in page

"""The app in a real browser: Debian's Chromium driven by Playwright (the system executable, no browser
download), the app started by ``llmslo app`` on 127.0.0.1. Each page is waited for until it has finished
drawing, its key figures are read from the page's text and compared with the llmslo command's JSON, and a
screenshot of it is saved in the test's output folder (with ``--update-golden``, the Overview's also as
``docs/img/app-overview.png``, the README's picture).

Outside CI the test skips, saying why, when Chromium or Playwright is missing; under ``CI=true`` it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmslo.tests._app_store import HOSTILE, cli_json, demo_store, free_port, wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
README_PICTURE = ROOT / "docs" / "img" / "app-overview.png"
PICTURE_MAX_BYTES = 300_000
VIEWPORT = {"width": 1400, "height": 1700}  # tall rather than full-page: Streamlit scrolls inside its own frame
FOOTER = "Every figure on this page comes from llmslo.analysis"


def _browser_or_skip() -> tuple[Any, str]:
    """Playwright's sync API and the system Chromium; a skip with the reason (a failure under CI) without."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright, why = None, "playwright is not installed (pip install playwright; no browser download)"
    else:
        why = "" if chromium else "Debian's chromium is not installed (apt-get install chromium)"
    if sync_playwright is None or chromium is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the browser test: {why}")
        pytest.skip(why)
    return sync_playwright, chromium


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    db = demo_store(tmp_path / "demo.duckdb")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llmslo.cli", "app", "--db", db.name, "--port", str(port)],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, proc)
        yield f"http://127.0.0.1:{port}", db
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _drawn(page: Any) -> str:
    """Wait until the page has finished drawing (its last element is there, the app is no longer running,
    every chart on screen has been rendered) and return its text."""
    page.get_by_text(FOOTER).wait_for(timeout=30_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=30_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')]"
        ".filter(c => c.offsetParent !== null).every(c => c.querySelector('canvas, svg'))", timeout=30_000)
    page.wait_for_timeout(300)  # the last layout pass of the charts
    text: str = page.inner_text("body")
    return text


def _percent(x: float) -> str:
    return f"{x:.1%}"


def test_every_page_draws_its_figures_in_chromium(server: tuple[str, Path], tmp_path: Path,
                                                  update_golden: bool) -> None:
    sync_playwright, chromium = _browser_or_skip()
    from llmslo.analysis import Store, format_duration
    from llmslo.analysis.report import store_contents
    from llmslo.app._show import auto_window_s, seconds

    url, db = server
    with Store.open(db, read_only=True) as store:
        contents = store_contents(store.con)
    window = format_duration(auto_window_s(contents.arrival_from_unix_s, contents.arrival_to_unix_s))  # the default
    report = cli_json("report", "--db", str(db), "--json")
    windows = cli_json("report", "--db", str(db), "--window", window, "--json")
    (whole,) = report["groups"]
    gpu = cli_json("gpu", "correlate", "--db", str(db), "--json")
    rollout = cli_json("rollout", "compare", "--db", str(db), "--update", "u-1", "--json")
    expected: dict[str, list[str]] = {
        "": ["Attempted", f"{report['totals']['attempted']:,}", _percent(report["totals"]["goodput_fraction"]),
             report["policy"]["rule"].split(";")[0], "Goodput by window"],
        "latency": [seconds(whole["latency"]["ttft_s"]["p99"]), seconds(whole["latency"]["e2e_s"]["p99"]),
                    "Client vs server TTFT"],
        "survivor-bias": [f"{sum(g['survivor_bias']['verdict'] == 'optimistic' for g in windows['groups'])} of "
                          f"{len(windows['groups'])}"],
        "anomalies": ["finding(s) in"],
        "gpu": [f"Correlations over {gpu['buckets']:,} buckets"],
        "rollouts": [f"Verdict: {rollout['verdict']}"],
        "data": [f"Request summaries: {report['totals']['requests']:,}"],
    }
    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            for path, figures in expected.items():
                page.goto(f"{url}/{path}")
                text = _drawn(page)
                for figure in figures:
                    assert figure in text, (path or "overview", figure, text)
                shot = tmp_path / f"app-{path or 'overview'}.png"
                page.screenshot(path=str(shot))
                assert shot.stat().st_size > 10_000  # a drawn page, not a blank one
            if update_golden:
                README_PICTURE.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tmp_path / "app-overview.png", README_PICTURE)
            _hostile_labels_show_as_written(page, url)
        finally:
            browser.close()
    assert not dialogs, f"a label ran as script: {dialogs}"
    assert README_PICTURE.stat().st_size < PICTURE_MAX_BYTES


def _hostile_labels_show_as_written(page: Any, url: str) -> None:
    """The model filter lists the hostile names as written; choosing one narrows the page to its rows and
    names it, still as written."""
    page.goto(url)
    _drawn(page)
    page.locator('[data-testid="stMultiSelect"]').filter(has_text="Model").locator("input").click()
    options = page.get_by_role("option").all_inner_texts()
    assert {HOSTILE[0], HOSTILE[1], "red\\x1b[31mtext"} <= {o.strip() for o in options}, options
    page.get_by_role("option", name=HOSTILE[0], exact=True).click()
    page.keyboard.press("Escape")
    page.get_by_text(f"model in {{{HOSTILE[0]}}}").wait_for(timeout=30_000)
    text = _drawn(page)
    assert f"model in {{{HOSTILE[0]}}}" in text and "Attempted\n\n5" in text.replace("\n\n\n", "\n\n")

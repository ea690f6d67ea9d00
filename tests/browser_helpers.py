"""Headless Chromium for the attention page's browser tests (tests/viz, tests/commands)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def _chromium(browser: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=5000",
    ]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=120, check=True)


def browser_report(page, tmp_path, screenshot=None) -> dict:
    """Open `page` in headless Chromium: the report its script wrote (and a screenshot)."""
    browser = _browser()
    if browser is None:
        if os.environ.get("TFORMER_REQUIRE_BROWSER"):  # `make test-all` installed one: it must run
            pytest.fail(f"TFORMER_REQUIRE_BROWSER is set but none of {BROWSERS} is on PATH")
        pytest.skip("no Chromium installed (apt-get install chromium; `make test-all` does)")
    dom = _chromium(browser, tmp_path, "--dump-dom", page.as_uri()).stdout
    found = re.search(r'<pre id="report"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, f"no report in the page's DOM: {dom[:2000]}"
    report = json.loads(found.group(1))
    assert report["ok"], report.get("error")
    if screenshot is not None:
        _chromium(
            browser,
            tmp_path,
            "--window-size=1400,1000",
            f"--screenshot={screenshot}",
            page.as_uri() + "#layer=1&head=2&query=2",
        )
        assert screenshot.stat().st_size > 20_000
    return report

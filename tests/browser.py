"""Debian's headless Chromium for the report tests: load a page, read its console, take and check a screenshot."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")

needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing: apt-get install -y "
                                                                  "chromium (.ci/run installs it)")


def chromium(url: str, tmp: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on `url` with `mode` (`--dump-dom`, `--screenshot=PATH`); a fresh profile in `tmp`."""
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0", "--window-size=1280,2400"]
    return subprocess.run([str(CHROMIUM), *flags, *mode, url], capture_output=True, text=True, timeout=180)


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Uncaught" in line or re.search(r"CONSOLE.*(Error|error)", line)]


def screenshot(page: Path, tmp: Path) -> Path:
    """A 1280x2400 screenshot of the local file `page`, checked to be drawn without console errors."""
    shot = tmp / "report.png"
    result = chromium(page.as_uri(), tmp, f"--screenshot={shot}")
    assert result.returncode == 0 and shot.stat().st_size > 10_000, result.stderr[-2000:]
    assert not console_errors(result.stderr)
    assert_drawn(shot)
    return shot


def assert_drawn(png: Path) -> None:
    """Not blank: varied pixels, and the red best-so-far line (no text on the page is red) is on screen."""
    import matplotlib.image

    image = matplotlib.image.imread(png)[..., :3]
    assert image.shape[:2] == (2400, 1280)
    assert image.std() > 0.05 and (image.mean(axis=2) < 0.9).mean() > 0.02
    red = (image[..., 0] > 0.7) & (image[..., 1] < 0.3) & (image[..., 2] < 0.3)
    assert red.sum() > 200, "no red best-so-far line in the screenshot"

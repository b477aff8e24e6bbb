"""The HTML report opened in headless Chromium: the DOM has the sections, table and images, and the
embedded PNGs really decode and paint (screenshot pixels, and each <img>'s natural size).

Skipped when no Chromium is installed (``apt-get install -y chromium``; CI installs it). Every Chromium
call runs in its own process group under a 60 s limit, and the group is killed afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fastlm.reporting.html_report import Section, render_html
from fastlm.reporting.plots import loss_figure, throughput_figure
from tests.support.browser import find_chromium, run_chromium

pytestmark = pytest.mark.e2e

WINDOW = (1200, 2000)
# Matplotlib's default colours C0 (blue) and C1 (orange): the two lines of both figures. Finding them in
# bulk inside each image's box on the screenshot means the embedded PNG was decoded and painted.
C0, C1 = (31, 119, 180), (255, 127, 14)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip(
            "headless Chromium not found (no `chromium` on PATH nor /usr/bin/chromium); "
            "install it with `apt-get install -y chromium` to run this browser test"
        )
    return path


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> Path:
    steps = np.arange(1, 201, 10)
    history = pd.DataFrame(
        {
            "step": steps,
            "loss": 5.0 - 2.0 * np.log1p(steps) / np.log1p(steps[-1]),
            "tokens_per_s": np.r_[150.0, np.full(len(steps) - 1, 1300.0)],
            "real_tokens_per_s": np.r_[120.0, np.full(len(steps) - 1, 1100.0)],
        }
    )
    eval_history = pd.DataFrame({"step": [100, 191], "val_loss": [3.9, 3.4]})
    table = pd.DataFrame({"metric": ["tokens/s", "<b>not bold</b>"], "value": [1100.5, 0.25]})
    sections = [
        Section("Summary", text="A short run.", table=table, items=["one finding"]),
        Section(
            "Curves",
            figures={"loss": loss_figure(history, eval_history), "throughput": throughput_figure(history)},
        ),
    ]
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(
        render_html(title="Browser check", subtitle="two figures and a table", sections=sections),
        encoding="utf-8",
    )
    return path


def test_dom_has_sections_table_and_images(chromium, report_file, tmp_path):
    result = run_chromium(chromium, tmp_path / "profile", "--dump-dom", report_file.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert re.search(r'<section id="summary"', dom) and re.search(r'<section id="curves"', dom)
    assert dom.count("<table") == 1 and 'class="dataframe report-table"' in dom
    assert "&lt;b&gt;not bold&lt;/b&gt;" in dom and "<b>not bold" not in dom  # still escaped once parsed
    images = re.findall(r"<img [^>]*>", dom)
    assert len(images) == 2
    for image, name in zip(images, ["loss", "throughput"], strict=True):
        assert f'id="fig-{name}"' in image and f'alt="{name}"' in image
        assert 'src="data:image/png;base64,' in image


@pytest.fixture(scope="module")
def painted_images(chromium, report_file, tmp_path_factory) -> dict[str, dict]:
    """Per image: whether it loaded, its natural size and its box on the page, read from the DOM of a
    test-only copy of the report with a probe script (the report itself has no script and forbids one)."""
    folder = tmp_path_factory.mktemp("probe")
    probe = folder / "probe.html"
    script = (
        "<script>window.addEventListener('load', () => { document.body.setAttribute('data-images',"
        " [...document.images].map(i => { const r = i.getBoundingClientRect();"
        " return [i.id, i.complete, i.naturalWidth, i.naturalHeight,"
        " Math.round(r.left), Math.round(r.top), Math.round(r.width), Math.round(r.height)].join(':'); })"
        ".join(' ')); });</script>"
    )
    document = report_file.read_text(encoding="utf-8")
    document = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", document)  # let the probe run
    probe.write_text(document.replace("</body>", script + "</body>"), encoding="utf-8")
    result = run_chromium(
        chromium,
        folder / "profile",
        "--virtual-time-budget=5000",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--dump-dom",
        probe.as_uri(),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.search(r'data-images="([^"]*)"', result.stdout)
    assert match, "the probe script did not run"
    images = {}
    for entry in match.group(1).split():
        name, complete, *numbers = entry.split(":")
        width, height, left, top, box_width, box_height = map(int, numbers)
        images[name] = {
            "complete": complete == "true",
            "natural": (width, height),
            "box": (left, top, box_width, box_height),
        }
    return images


def test_images_decode_in_the_browser(painted_images):
    assert list(painted_images) == ["fig-loss", "fig-throughput"]
    for image in painted_images.values():
        assert image["complete"] and image["natural"] == (770, 385)  # 7 x 3.5 in at 110 dpi
        left, top, width, height = image["box"]
        assert width > 300 and height > 150 and top + height <= WINDOW[1], "image not laid out in the window"


def test_screenshot_shows_the_rendered_figures(chromium, report_file, painted_images, tmp_path):
    shot = tmp_path / "shot.png"
    result = run_chromium(
        chromium,
        tmp_path / "profile",
        f"--screenshot={shot}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        report_file.as_uri(),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 20_000, "screenshot missing or trivially small"

    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]  # floats in [0, 1]
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    assert pixels.std() > 0.05, "screenshot is (nearly) a single flat colour"

    # Inside each image's box: a real plot (not blank, not a broken-image icon) with both line colours.
    for name, image in painted_images.items():
        left, top, width, height = image["box"]
        region = np.rint(pixels[top : top + height, left : left + width] * 255).astype(int)
        assert region.std() > 20, f"{name}: the image region is blank"
        for colour in (C0, C1):
            near = (np.abs(region - np.array(colour)).max(axis=-1) <= 40).sum()
            assert near > 300, f"{name}: only {near} pixels of the colour {colour} in the image region"
    if os.environ.get("FASTLM_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["FASTLM_KEEP_SCREENSHOT"])

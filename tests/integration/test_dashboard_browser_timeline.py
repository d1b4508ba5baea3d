"""Issue #35 item 4 in headless Chromium at 1280 px: the Timeline page of the a100 example draws its CPU-thread
and GPU-stream tracks, host stall and bands, without an error or sideways scrolling, and offers the Perfetto
download (screenshot: tests/artifacts/dashboard-timeline-1280.png)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import test_dashboard_browser as tb

pytestmark = tb.pytestmark


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    runs = tb._runs_dir(tmp_path_factory.mktemp("served-timeline"))
    with tb.serving(runs, tmp_path_factory.mktemp("dash-timeline")) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with tb.chromium(tmp_path_factory.mktemp("chromium-profile-timeline"), "1280,1000") as driver:
        yield driver


def test_timeline_page_at_1280px(server: str, browser: object) -> None:
    browser.set_window_size(1280, 1000)
    tb._open(browser, server, "timeline", 1)
    tb._select(browser, "Trace", "ingest-a100-hostbound")
    tb._settle(browser, 1)
    assert not tb._errors(browser)
    text = browser.find_element("css selector", '[data-testid="stMain"]').text
    assert "boxes drawn" in text and "ui.perfetto.dev" in text
    ticks = {e.text for e in tb._find(browser, ".js-plotly-plot .ytick text")}
    assert {"steps", "phases", "GPU 0 · stream 7", "GPU 0 · host stall"} <= ticks, ticks
    assert any(t.startswith("CPU pid") for t in ticks), ticks
    assert tb._find(browser, ".js-plotly-plot .bars path")  # boxes drawn
    buttons = [b.text for b in tb._find(browser, '[data-testid="stDownloadButton"] button')]
    assert any("Perfetto" in b for b in buttons), buttons
    wide = browser.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]');return m.scrollWidth > m.clientWidth + 1;"
    )
    assert not wide, "the page scrolls sideways at 1280 px"
    tb._shot(browser, "timeline-1280", 1280)


def test_a_timeline_link_restores_the_view_in_chromium(server: str, browser: object) -> None:
    """Open a link with trace, rank, step and window: the page shows them, the address bar keeps the window
    exactly (the slider does not snap it), and a reload draws the same chart."""
    from urllib.parse import parse_qs, urlsplit

    browser.set_window_size(1280, 1000)
    query = "trace=ingest-2rank&rank=rank-1&window=100.5,300.25"
    tb._open(browser, server, f"timeline?{query}", 1)
    assert not tb._errors(browser)
    picked = [
        tb._labelled(browser, "stSelectbox", label)
        .find_element("css selector", "input")
        .get_attribute("value")
        for label in ("Trace", "Rank")
    ]
    assert picked == ["ingest-2rank", "rank-1"], picked
    title = tb._find(browser, ".js-plotly-plot .gtitle")[0].text
    assert "ingest-2rank · events/rank-1.parquet: 100.5 – 300.2 ms" in title, title
    thumbs = [e.text for e in tb._find(browser, '[data-testid="stSliderThumbValue"]')]
    assert thumbs == ["100.50", "300.25"] or thumbs == ["100.5", "300.25"], thumbs
    kept = parse_qs(urlsplit(browser.current_url).query)
    assert kept["window"] == ["100.5,300.25"] and kept["trace"] == ["ingest-2rank"], browser.current_url
    boxes = len(tb._find(browser, ".js-plotly-plot .bars path"))
    browser.refresh()
    tb._settle(browser, 1)
    assert tb._find(browser, ".js-plotly-plot .gtitle")[0].text == title
    assert len(tb._find(browser, ".js-plotly-plot .bars path")) == boxes
    assert parse_qs(urlsplit(browser.current_url).query) == kept

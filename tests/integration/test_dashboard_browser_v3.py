"""Issue #35 in headless Chromium, on a copy of examples/runs plus a fit made by today's ``mxperf fit`` (so
fits.json carries the three-line answer): the answer card above the fold at 1280 x 800 on Overview and
Breakeven, and a view restored from its URL. Screenshots go to ``tests/artifacts/`` (look at them).

Helpers and the Chromium set-up are test_dashboard_browser's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_dashboard_answer as ta
import test_dashboard_browser as tb

pytestmark = tb.pytestmark

FOLD = 800


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ta.EXAMPLES / "sweep-tiny-dense" / "manifest.json").is_file():
        pytest.skip("examples/runs lacks sweep-tiny-dense")
    return ta.make_answer_runs(tmp_path_factory.mktemp("served-v3") / "runs")


@pytest.fixture(scope="module")
def server(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with tb.serving(runs, tmp_path_factory.mktemp("dash-v3")) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with tb.chromium(tmp_path_factory.mktemp("chromium-profile-v3"), "1280,800") as driver:
        yield driver


def _viewport(driver: object, width: int, height: int) -> None:
    """Make the page area (not the window) ``width`` x ``height``."""
    driver.set_window_size(width, height)
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight];")
    driver.set_window_size(width + (width - inner[0]), height + (height - inner[1]))


def _card_box(driver: object) -> dict:
    tb._wait_for(driver, ".st-key-answer-card")
    return driver.execute_script(
        "const r = document.querySelector('.st-key-answer-card').getBoundingClientRect();"
        "return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, h: window.innerHeight,"
        " w: window.innerWidth, text: document.querySelector('.st-key-answer-card').innerText};"
    )


@pytest.mark.parametrize("page", ["overview", "breakeven"])
def test_the_answer_card_is_above_the_fold_at_1280x800(
    server: str, browser: object, runs: Path, page: str
) -> None:
    doc = json.loads((runs / ta.STEP_FIT / "fits.json").read_text())
    _viewport(browser, 1280, FOLD)
    tb._open(browser, server, page, 2 if page == "breakeven" else 0)
    assert not tb._errors(browser)
    browser.execute_script("window.scrollTo(0, 0);")
    box = _card_box(browser)
    assert box["w"] == 1280 and box["h"] == FOLD, box
    ARTIFACTS = tb.ARTIFACTS
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / f"dashboard-answer-{page}-1280x800.png"))  # the first screen
    for line in doc["answer"]:
        assert line in box["text"], line  # the lines of fits.json, as they read
    assert "emulated" in box["text"]  # the mark: CPU runs
    assert box["top"] >= 0 and box["bottom"] <= FOLD, f"{page}: answer card at {box}, below the fold"
    assert box["right"] <= 1280


def _sidebar_link(driver: object) -> str:
    """Open the sidebar's *Share this view* popover and read the link in its code box (which has a copy
    button); closes the popover again."""
    from selenium.webdriver.common.keys import Keys

    tb._wait_for(driver, '[data-testid="stSidebar"] [data-testid="stPopover"] button').click()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        code = tb._find(driver, '[data-testid="stPopoverBody"] [data-testid="stCode"] code')
        if code and "?" in code[0].text:
            link = code[0].text.strip()
            assert tb._find(driver, '[data-testid="stPopoverBody"] [data-testid="stCode"] button'), (
                "no copy button"
            )
            driver.find_element("css selector", "body").send_keys(Keys.ESCAPE)
            return link
        time.sleep(0.2)
    raise AssertionError("no link in the sidebar's Share this view")


def test_a_view_round_trips_through_its_url_in_chromium(server: str, browser: object, runs: Path) -> None:
    """Pick a fit and a knob, read the address bar and the link to copy, reload: the same view."""
    from urllib.parse import parse_qs, urlsplit

    _viewport(browser, 1600, 1000)
    tb._open(browser, server, "breakeven", 2)
    tb._select(browser, "Fit output", "fit-verl-sim")
    tb._settle(browser, 2)
    tb._select(browser, "Model, phase and precision", "unlabelled-v32000-h1024 / update: mxfp8 vs bf16")
    tb._settle(browser, 2)
    toggle = tb._find(browser, '[data-testid="stCheckbox"] label')[0]
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", toggle)
    toggle.click()  # weight_quant=per_step
    tb._settle(browser, 2)
    query = parse_qs(urlsplit(browser.current_url).query)
    assert query["fit"] == ["fit-verl-sim"] and query["weight_quant"] == ["1"], browser.current_url
    assert query["entry"] == ["unlabelled-v32000-h1024 / update: mxfp8 vs bf16"]
    link = _sidebar_link(browser)
    assert parse_qs(urlsplit(link).query) == query and urlsplit(link).path.endswith("/breakeven")
    browser.get(link)  # a new session: the shared link, or a reload
    tb._settle(browser, 2)
    assert not tb._errors(browser)
    fit = tb._labelled(browser, "stSelectbox", "Fit output").find_element("css selector", "input")
    assert fit.get_attribute("value") == "fit-verl-sim"
    entry = tb._labelled(browser, "stSelectbox", "Model, phase").find_element("css selector", "input")
    assert entry.get_attribute("value") == "unlabelled-v32000-h1024 / update: mxfp8 vs bf16"
    assert "What-if" in browser.find_element("css selector", '[data-testid="stMain"]').text  # the knob is on
    assert parse_qs(urlsplit(browser.current_url).query) == query
    tb._shot(browser, "share-restored-1600", 1600)


# Elements of the main area that must lie whole inside the page; the columns of a row must not overlap.
LAYOUT = """
const w = window.innerWidth, out = [];
const sel = '.js-plotly-plot, [data-testid="stDataFrame"], [data-testid="stMetric"], [data-testid="stAlert"],'
  + ' [data-testid="stSelectbox"], [data-testid="stSlider"], [data-testid="stDownloadButton"], .st-key-answer-card';
for (const el of document.querySelectorAll('[data-testid="stMain"] :is(' + sel + ')')) {
  const r = el.getBoundingClientRect();
  if (r.width && (r.left < -1 || r.right > w + 1)) out.push(`${el.dataset.testid || el.className}: ${r.left}-${r.right}`);
}
for (const row of document.querySelectorAll('[data-testid="stMain"] [data-testid="stHorizontalBlock"]')) {
  const cols = [...row.children].map(c => c.getBoundingClientRect()).filter(r => r.width > 0);
  for (const a of cols) for (const b of cols)
    if (a !== b && a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1)
      out.push(`columns overlap: ${a.left}-${a.right} and ${b.left}-${b.right}`);
}
return {cut: out, scroll: document.documentElement.scrollWidth, inner: w,
        mainScroll: document.querySelector('[data-testid="stMain"]').scrollWidth,
        mainClient: document.querySelector('[data-testid="stMain"]').clientWidth};
"""


@pytest.mark.parametrize(("page", "charts"), [("overview", 0), ("kernels", 1), ("diff", 1), ("timeline", 1)])
def test_the_newer_pages_fit_1600px(server: str, browser: object, page: str, charts: int) -> None:
    """At 1600 px: nothing scrolls sideways, no chart / table / card / widget reaches past the page's edge, the
    columns of a row do not overlap, no label or picked value is cut (test_dashboard_browser's check), and
    Overview's answer card is on the first screen."""
    _viewport(browser, 1600, 1000)
    tb._open(browser, server, page, charts)
    assert not tb._errors(browser)
    browser.execute_script("window.scrollTo(0, 0);")
    if page == "overview":
        box = _card_box(browser)
        assert box["top"] >= 0 and box["bottom"] <= 1000 and box["left"] >= 0 and box["right"] <= 1600, box
        assert box["text"].strip()
    layout = browser.execute_script(LAYOUT)
    assert layout["scroll"] <= layout["inner"], f"{page}: the page scrolls sideways at 1600 px: {layout}"
    assert layout["mainScroll"] <= layout["mainClient"] + 1, (
        f"{page}: the main area scrolls sideways: {layout}"
    )
    assert not layout["cut"], f"{page}: past the edge or overlapping at 1600 px: {layout['cut']}"
    cut = browser.execute_script(tb.CUT)
    assert not cut, f"{page}: cut off at 1600 px: {cut}"
    tb._shot(browser, f"{page}-1600-v3", 1600)

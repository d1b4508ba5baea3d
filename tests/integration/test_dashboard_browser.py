"""The dashboard in a real browser: `mxperf dash` served on localhost, every page in headless Chromium.

Opens every page (checks plotly drew its SVG and no exception box shows), changes every widget (slow test),
uploads a trace on Add a trace and finds it listed on Runs, downloads a table, checks that labels and picked
values are not cut at 1280 px, and that the server refuses a foreign Host (DNS rebinding) and Origin. Saves a
screenshot of every page (1600 and 1280 px wide) and the page load times to ``tests/artifacts/`` (look at
them: a user must be able to read each page without help). Needs Debian's ``chromium`` and
``chromium-driver`` (``.ci/browser-deps.sh`` installs them); skipped with the command to run when absent.
The server runs on a copy of ``examples/runs`` (uploads must not land in the repository);
``MXPERF_DASH_TEST_RUNS=DIR`` points it at another folder of outputs (copied too).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
EXAMPLES = REPO / "examples" / "runs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# (url path, charts the page must draw at least)
PAGES: tuple[tuple[str, int], ...] = (
    ("overview", 0),
    ("runs", 0),
    ("step_time", 2),
    ("breakeven", 2),
    ("host_stall", 1),
    ("timeline", 1),
    ("kernels", 1),
    ("diff", 1),
    ("consistency", 1),
    ("weight_sync", 1),
    ("add_trace", 0),
)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
)
LOAD_TIMES: dict[str, list[float]] = {}

pytestmark = pytest.mark.skipif(
    not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
    reason="needs chromium and chromedriver: sudo apt-get install -y chromium chromium-driver",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _runs_dir(tmp: Path) -> Path:
    src = Path(os.environ.get("MXPERF_DASH_TEST_RUNS") or EXAMPLES)
    if any(src.glob("*/manifest.json")):
        shutil.copytree(src, tmp / "runs", symlinks=True)
        return tmp / "runs"
    sys.path.insert(0, str(REPO / "tests"))
    import dash_fixtures

    return dash_fixtures.make_runs_dir(tmp / "runs")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _runs_dir(tmp_path_factory.mktemp("served"))


@contextlib.contextmanager
def serving(runs: Path, log_dir: Path) -> Iterator[str]:
    """``mxperf dash RUNS`` on a free port, up (its health check answers) for the block: yields its URL."""
    port = _free_port()
    log = log_dir / "dash.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mxperf.cli", "dash", str(runs), "--port", str(port)],
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mxperf dash did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def chromium(profile: Path, size: str = "1600,1000", downloads: Path | None = None) -> Iterator[object]:
    """A headless Chromium (``size``: "width,height"; ``downloads``: where downloads go) for the block."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--window-size={size}"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    if downloads is not None:
        opts.add_experimental_option(
            "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
        )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def server(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        with serving(runs, tmp_path_factory.mktemp("dash")) as url:
            yield url
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "dashboard-load-times.json").write_text(json.dumps(LOAD_TIMES, indent=1) + "\n")


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory, downloads: Path) -> Iterator[object]:
    with chromium(tmp_path_factory.mktemp("chromium-profile"), downloads=downloads) as driver:
        yield driver


# --------------------------------------------------------------------------------------------- helpers
def _find(driver: object, css: str) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def _errors(driver: object) -> list[str]:
    return [e.text[:500] for e in _find(driver, '[data-testid="stException"]')]


def _settle(driver: object, min_charts: int = 0, timeout_s: float = 60) -> float:
    """Wait until the script run is over (no status widget for 0.6 s) and ``min_charts`` plotly charts drew
    their SVG; returns the seconds waited."""
    t0 = time.monotonic()
    quiet = None
    while time.monotonic() - t0 < timeout_s:
        busy = bool(_find(driver, '[data-testid="stStatusWidget"]')) or not _find(driver, "h1")
        drawn = len(_find(driver, ".js-plotly-plot .main-svg")) >= min_charts
        if busy or not drawn:
            quiet = None
        elif quiet is None:
            quiet = time.monotonic()
        elif time.monotonic() - quiet > 0.6:
            return quiet - t0
        time.sleep(0.1)
    return time.monotonic() - t0


def _open(driver: object, server: str, page: str, min_charts: int = 0) -> float:
    driver.get(f"{server}/{'' if page == 'overview' else page}")  # the default page lives at /
    return _settle(driver, min_charts)


def _shot(driver: object, name: str, width: int) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]') || document.body;"
        "return Math.max(m.scrollHeight, document.body.scrollHeight);"
    )
    driver.set_window_size(width, min(max(int(height) + 100, 800), 8000))
    time.sleep(0.5)
    driver.save_screenshot(str(ARTIFACTS / f"dashboard-{name}.png"))
    driver.set_window_size(width, 1000)


# --------------------------------------------------------------------------------------------- pages
@pytest.mark.parametrize(("page", "min_charts"), PAGES, ids=[p for p, _ in PAGES])
def test_page_renders_charts_in_chromium(server: str, browser: object, page: str, min_charts: int) -> None:
    browser.set_window_size(1600, 1000)
    first = _open(browser, server, page, min_charts)
    again = _open(browser, server, page, min_charts)  # warm: what a user navigating back sees
    LOAD_TIMES[page] = [round(first, 2), round(again, 2)]
    _shot(browser, page, 1600)
    errors = _errors(browser)
    assert not errors, f"{page}: exception box shown: {errors[0]}"
    dialogs = [d.text for d in _find(browser, '[role="dialog"]')]
    assert not dialogs, f"{page}: a dialog covers the page: {dialogs[0][:200]}"
    plots = len(_find(browser, ".js-plotly-plot"))
    assert plots >= min_charts, f"{page}: {plots} plotly charts rendered, expected >= {min_charts}"
    assert _find(browser, '[data-testid="stExpander"]'), "the glossary is reachable from every page"


CUT = """
const cut = [];
const sel = '[data-testid="stWidgetLabel"] p, input[role="combobox"], button p, [data-testid="stMetricValue"] div';
for (const el of document.querySelectorAll(sel)) {
  if (el.offsetParent === null) continue;
  const text = el.value !== undefined && el.tagName === 'INPUT' ? el.value : el.textContent;
  if (el.scrollWidth > el.clientWidth + 1) cut.push(text);
}
return cut;
"""


@pytest.mark.slow  # ~40 s: every page again at 1280 px
def test_labels_and_picked_values_are_not_cut_at_1280px(server: str, browser: object, runs: Path) -> None:
    browser.set_window_size(1280, 800)
    cut = {}
    for page, charts in PAGES:
        _open(browser, server, page, charts)
        _shot(browser, f"{page}-1280", 1280)
        browser.set_window_size(1280, 800)
        found = browser.execute_script(CUT)
        if found:
            cut[page] = found
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth > window.innerWidth + 1;"
        )
        assert not overflow, f"{page}: the page scrolls sideways at 1280 px"
    longest = "run-tiny-dense-mxfp8-learner-bf16-sampler"
    if (runs / longest).is_dir():  # the longest name, picked by hand: shown by its start and end
        _open(browser, server, "step_time", 2)
        _select(browser, "Pair", "Choose two outputs…")
        _select(browser, "Compared", f"{longest[:14]}…{longest[-14:]}")
        found = browser.execute_script(CUT)
        if found:
            cut["step_time (picked by hand)"] = found
    browser.set_window_size(1600, 1000)
    assert not cut, f"labels or picked values cut off at 1280 px: {cut}"


# --------------------------------------------------------------------------------------------- add a trace
def _wait_for(driver: object, css: str, timeout_s: float = 30) -> object:
    """The first element matching ``css`` once the page drew it."""
    deadline = time.monotonic() + timeout_s
    while not (found := _find(driver, css)):
        assert time.monotonic() < deadline, f"{css} never appeared"
        time.sleep(0.2)
    return found[0]


def _table_text(driver: object, needle: str, timeout_s: float = 30) -> str:
    """The text of the page's tables once it holds ``needle`` (the data grid fills its accessible table
    after it first paints), or whatever it holds when the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = " ".join(
            e.get_attribute("textContent") or "" for e in _find(driver, '[data-testid="stDataFrame"]')
        )
        if needle in text or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def test_upload_a_trace_and_find_it_listed(
    server: str, browser: object, runs: Path, tmp_path: Path, downloads: Path
) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    import dash_fixtures
    from selenium.webdriver.common.keys import Keys

    traces = [dash_fixtures.kineto_trace(tmp_path / f"rank-{r}.json.gz", r, slow=1 + 0.3 * r) for r in (0, 1)]
    _open(browser, server, "add_trace")
    upload = _wait_for(browser, '[data-testid="stFileUploader"] input[type="file"]')
    upload.send_keys("\n".join(str(t) for t in traces))  # two ranks at once: one trace set
    _settle(browser)
    name = _wait_for(browser, '[data-testid="stTextInput"] input')
    name.send_keys(Keys.CONTROL, "a")
    name.send_keys("ingest-uploaded-2rank", Keys.ENTER)
    _settle(browser)
    _wait_for(browser, '[data-testid="stBaseButton-primary"]:not([disabled])').click()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
        "is now listed" in e.text for e in _find(browser, '[data-testid="stAlertContentSuccess"]')
    ):
        assert not _find(browser, '[data-testid="stAlertContentError"]'), _find(
            browser, '[data-testid="stAlertContentError"]'
        )[0].text
        time.sleep(0.5)
    _shot(browser, "add_trace-done", 1600)
    assert (runs / "ingest-uploaded-2rank" / "manifest.json").is_file()
    uploads = sorted(p.name for p in (runs / "uploads").iterdir())
    assert len(uploads) == 1 and sorted(p.name for p in (runs / "uploads" / uploads[0]).iterdir()) == [
        "rank-0.json.gz",
        "rank-1.json.gz",
    ]
    _open(browser, server, "runs")
    assert "ingest-uploaded-2rank" in _table_text(browser, "ingest-uploaded-2rank")
    assert dash_fixtures.GPU_NAME in _table_text(browser, dash_fixtures.GPU_NAME)  # the GPU its trace names
    _find(browser, '[data-testid="stDownloadButton"] button')[0].click()  # the Runs table as CSV
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not list(downloads.glob("runs*.csv")):
        time.sleep(0.2)
    (csv,) = list(downloads.glob("runs*.csv"))
    assert "ingest-uploaded-2rank" in csv.read_text()


# --------------------------------------------------------------------------------------------- security
def _status(server: str, host: str | None = None, origin: str | None = None, ws: bool = False) -> int:
    port = int(server.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Host": host or f"127.0.0.1:{port}"}
    if origin:
        headers["Origin"] = origin
    if ws:
        headers |= {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        }
    conn.request("GET", "/_stcore/stream" if ws else "/", headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_server_refuses_foreign_host_and_origin(server: str) -> None:
    port = server.rsplit(":", 1)[1]
    assert _status(server) == 200
    assert _status(server, host=f"localhost:{port}") == 200
    assert _status(server, host=f"evil.example:{port}") == 403  # DNS rebinding
    assert _status(server, ws=True, origin=f"http://evil.example:{port}") == 403
    assert _status(server, ws=True, host=f"evil.example:{port}", origin=f"http://evil.example:{port}") == 403
    assert _status(server, ws=True, origin=f"http://127.0.0.1:{port}") == 101  # the page's own socket


# --------------------------------------------------------------------------------------------- every widget
def _pick_option(driver: object, combobox: object, multi: bool, text: str | None = None) -> bool | None:
    """Pick ``text``, or any option other than the current one; None when there is no other option."""
    from selenium.webdriver.common.keys import Keys

    current = combobox.get_attribute("value") or ""
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", combobox)
    combobox.click()
    time.sleep(0.4)
    options = [o for o in _find(driver, '[role="option"]') if o.is_displayed()]
    if text is not None:
        choice = next((o for o in options if o.text.strip() == text), None)
        assert choice is not None, f"no option {text!r} in {[o.text for o in options]}"
    else:
        choice = next((o for o in options if o.text.strip() not in ("", current, "Select all")), None)
    if choice is None:
        combobox.send_keys(Keys.ESCAPE)
        return None
    choice.click()
    if multi:
        time.sleep(0.2)
        combobox.send_keys(Keys.ESCAPE)
    return True


def _nudge_slider(driver: object, thumb: object) -> bool:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    before = thumb.get_attribute("value")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].focus();", thumb)
    for key in (Keys.ARROW_LEFT, Keys.ARROW_RIGHT, Keys.ARROW_RIGHT):
        ActionChains(driver).send_keys(key).perform()
        time.sleep(0.3)
        if thumb.get_attribute("value") != before:
            return True
    return False


# The element of each widget kind that takes the interaction.
WIDGETS: dict[str, str] = {
    "select": '[data-testid="stSelectbox"] input[role="combobox"]',
    "multi": '[data-testid="stMultiSelect"] input[role="combobox"]',
    "slider": '[data-testid="stSlider"] input[type="range"]',
    "radio": '[data-testid="stRadio"]',
    "toggle": '[data-testid="stCheckbox"] label',
    "text": '[data-testid="stTextInput"] input',
    "number": '[data-testid="stNumberInput"] input',
    "expander": '[data-testid="stExpander"] summary',
}


def _widgets(driver: object, sidebar: bool) -> list[tuple[str, int]]:
    """(kind, index) of every interactive widget now on the page, main area (and sidebar when asked)."""
    out = []
    for kind, css in WIDGETS.items():
        for i, el in enumerate(_find(driver, css)):
            in_sidebar = bool(
                driver.execute_script("return !!arguments[0].closest('[data-testid=\"stSidebar\"]')", el)
            )
            if sidebar or not in_sidebar:
                out.append((kind, i))
    return out


def _select(driver: object, label: str, text: str) -> None:
    """Pick ``text`` in the selectbox labelled ``label`` and wait for the rerun."""
    for box in _find(driver, '[data-testid="stSelectbox"]'):
        if box.find_element("css selector", '[data-testid="stWidgetLabel"]').text.strip() == label:
            _pick_option(driver, box.find_element("css selector", 'input[role="combobox"]'), False, text)
            _settle(driver)
            return
    raise AssertionError(f"no selectbox labelled {label!r}")


def _change(driver: object, kind: str, index: int) -> bool | None:
    from selenium.webdriver.common.keys import Keys

    els = _find(driver, WIDGETS[kind])
    if index >= len(els):  # an earlier change took it off the page (e.g. another fit without that choice)
        return None
    el = els[index]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
    if kind in ("select", "multi"):
        return _pick_option(driver, el, kind == "multi")
    if kind == "slider":
        return _nudge_slider(driver, el)
    if kind == "radio":
        options = el.find_elements("css selector", '[data-testid="stRadioOption"]')
        if len(options) < 2:  # one choice (e.g. a fit with the wall basis only): nothing to change
            return None
        other = [o for o in options if o.get_attribute("data-selected") != "true"]
        if other:
            other[0].click()
        return bool(other)
    if kind in ("toggle", "expander"):
        el.click()
        return True
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys("0.5" if kind == "number" else "tiny", Keys.ENTER)
    return True


@pytest.mark.slow
def test_every_widget_on_every_page_changes_without_an_error(
    server: str, browser: object, runs: Path
) -> None:
    browser.set_window_size(1600, 1000)
    changed: dict[str, list[str]] = {}
    single: dict[str, list[str]] = {}  # widgets with a single choice: nothing to change to
    for n, (page, charts) in enumerate(PAGES):
        _open(browser, server, page, charts)
        if page == "step_time" and (runs / "ingest-2rank").is_dir():  # the multi-rank widgets too
            _select(browser, "Pair", "Choose two outputs…")
            _select(browser, "Baseline", "ingest-2rank")
            _select(browser, "Compared", "ingest-a100-hostbound")
        kinds = _widgets(browser, sidebar=(n == 0))  # the sidebar's picker once, on the first page
        for kind, index in kinds:
            did = _change(browser, kind, index)
            _settle(browser)
            errors = _errors(browser)
            assert not errors, f"{page}: changing {kind} #{index} raised: {errors[0]}"
            (changed if did else single).setdefault(page, []).append(f"{kind}#{index}")
            assert did is not False, f"{page}: {kind} #{index} could not be changed"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    report = {"changed": changed, "single choice": single}
    (ARTIFACTS / "dashboard-widgets-changed.json").write_text(json.dumps(report, indent=1) + "\n")
    assert set(changed) >= {"runs", "step_time", "breakeven", "host_stall", "weight_sync", "add_trace"}, (
        report
    )
    assert any(k.startswith("select") for k in changed["step_time"]), report  # the rank picker


# --------------------------------------------------------------------------------------------- issue 35
def _labelled(driver: object, kind: str, label: str) -> object:
    for box in _find(driver, f'[data-testid="{kind}"]'):
        found = box.find_elements("css selector", '[data-testid="stWidgetLabel"]')
        if found and found[0].text.strip().startswith(label):
            return box
    raise AssertionError(f"no {kind} labelled {label!r}")


@pytest.mark.parametrize("width", [1600, 1280])
def test_breakeven_widgets_follow_the_picked_fit(
    server: str, browser: object, runs: Path, width: int
) -> None:
    """W1 in the browser: after switching Fit output, N and the other phases are the new fit's (fits.json)."""
    rels = ("fit-tiny-dense", "fit-verl-sim")
    if not all((runs / rel / "fits.json").is_file() for rel in rels):
        pytest.skip("needs the examples' two fits")
    fits = {rel: json.loads((runs / rel / "fits.json").read_text()) for rel in rels}
    browser.set_window_size(width, 800)
    _open(browser, server, "breakeven", 1)
    for rel in ("fit-tiny-dense", "fit-verl-sim", "fit-tiny-dense"):
        _select(browser, "Fit output", rel)
        _settle(browser, 1)
        doc = fits[rel]
        n_box = _labelled(browser, "stSlider", "Global batch")
        shown_n = n_box.find_element("css selector", '[data-testid="stSliderThumbValue"]').text
        other = _labelled(browser, "stNumberInput", "Other phases").find_element("css selector", "input")
        expected_other = [  # the baseline's: shared other phases plus its own (fits.json step section)
            sum(((m.get("step") or {}).get("other_phases_s") or {}).values())
            + sum(
                (
                    ((m.get("step") or {}).get("other_phases_by_precision_s") or {}).get(m["baseline"]) or {}
                ).values()
            )
            for m in doc["models"]
        ]
        shown_other = float(other.get_attribute("value"))  # the field shows two decimals
        assert int(shown_n.replace(",", "")) == doc["global_batch_tokens"], (rel, shown_n)
        assert any(abs(shown_other - e) <= 0.005 for e in expected_other), (rel, shown_other, expected_other)
    _shot(browser, f"breakeven-w1-{width}", width)
    browser.set_window_size(width, 800)
    assert not _errors(browser)

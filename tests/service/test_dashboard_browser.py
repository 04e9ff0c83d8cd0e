"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by
Selenium against a real uvicorn server on a free port. The map's points are drawn and a hover names a subgraph's
kind; the job page's chart has its bars; no page logs a console error; hostile names stay text.

Skipped, with the reason, where Chromium, its driver or Selenium is missing; under ``CI=true`` that is a failure.
"""

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from tests.service.dashboard_data import HOSTILE, KINDS, Seeded, app_for, seed

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,900")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for program, package in (("chromium", "chromium"), ("chromedriver", "chromium-driver")):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install -y {package})"
    return None


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Seeded:  # noqa: ANN001
    return seed(tmp_path_factory.mktemp("dashboard-browser"))


@pytest.fixture(scope="module")
def server(seeded: Seeded) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the port is held from here on: no race for a "free" one
    config = uvicorn.Config(app_for(seeded.database), log_level="warning", lifespan="off")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    uv.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def browser():  # noqa: ANN201
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the browser test: {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(browser, url: str, canvas: str | None = None) -> None:  # noqa: ANN001
    """Load ``url`` and, when given, wait until Chart.js drew on the canvas with that id."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    if canvas is not None:
        script = "return !!(window.Chart && Chart.getChart(arguments[0]))"
        WebDriverWait(browser, 20).until(lambda b: b.execute_script(script, canvas))


def console_errors(browser) -> list[str]:  # noqa: ANN001
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def test_home_page_loads_without_console_errors(browser, server):
    open_page(browser, server + "/")
    assert browser.find_element("id", "jobs").is_displayed()
    assert HOSTILE in browser.find_element("id", "jobs").text  # shown as text ...
    assert browser.execute_script("return document.querySelectorAll('#jobs img, #models img').length") == 0
    assert console_errors(browser) == []  # ... and no script ran, nothing failed to load


def test_map_draws_every_point_and_hover_names_its_kind(browser, server, seeded):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, server + "/map", canvas="map-chart")
    drawn = browser.execute_script("""
        const chart = Chart.getChart('map-chart');
        return chart.data.datasets.map((d, i) => ({kind: d.label, points: chart.getDatasetMeta(i).data.map(
            (e, j) => ({x: e.x, y: e.y, hash: d.data[j].structural_hash}))}));""")
    assert sorted(d["kind"] for d in drawn) == sorted(KINDS)
    assert sum(len(d["points"]) for d in drawn) == 12
    area = browser.execute_script("const a = Chart.getChart('map-chart').chartArea; return [a.left, a.top, "
                                  "a.right, a.bottom]")
    for d in drawn:
        for p in d["points"]:
            assert area[0] - 1 <= p["x"] <= area[2] + 1 and area[1] - 1 <= p["y"] <= area[3] + 1
    canvas = browser.find_element("id", "map-chart")
    painted = browser.execute_script("""
        const c = arguments[0], x = Math.round(arguments[1] * devicePixelRatio), y = Math.round(arguments[2] *
            devicePixelRatio);
        return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data);""", canvas, drawn[0]["points"][0]["x"],
        drawn[0]["points"][0]["y"])
    colour = browser.execute_script("return Chart.getChart('map-chart').data.datasets[0].backgroundColor")
    assert painted == [int(colour[i: i + 2], 16) for i in (1, 3, 5)] + [255]  # its centre has its kind's colour

    hostile = next(d for d in drawn if d["kind"] == KINDS[2])
    for target in (drawn[-1], hostile):  # two datasets: the hover finds the point in the right one
        point = target["points"][0]
        size = canvas.size
        ActionChains(browser).move_to_element_with_offset(
            canvas, int(point["x"] - size["width"] / 2), int(point["y"] - size["height"] / 2)).perform()
        detail = browser.find_element("id", "map-detail")
        WebDriverWait(browser, 10).until(lambda _, d=detail, k=target["kind"]: d.text.startswith(k))
        assert point["hash"][:12] in detail.text
        recipe = seeded.best.get(point["hash"], ("",))[0]
        assert recipe in detail.text
        tooltip = browser.execute_script("const t = Chart.getChart('map-chart').tooltip; "
                                         "return [t.opacity, t.title]")
        assert tooltip == [1, [target["kind"]]]
    assert browser.execute_script("return document.querySelectorAll('#map-detail img, #map-detail script').length") == 0
    assert console_errors(browser) == []


def test_job_page_chart_has_its_bars(browser, server, seeded):
    open_page(browser, f"{server}/jobs/{seeded.optimize_job}", canvas="job-chart")
    bars = browser.execute_script("""
        const chart = Chart.getChart('job-chart');
        return chart.data.datasets.map((d, i) => ({label: d.label,
            heights: chart.getDatasetMeta(i).data.map((e) => e.skip ? null : e.base - e.y)}));""")
    assert [b["label"] for b in bars] == ["eager", "tuned kernel"]
    eager, tuned = bars[0]["heights"], bars[1]["heights"]
    assert len(eager) == len(tuned) == 3
    assert all(h > 0 for h in tuned) and eager[0] > 0 and eager[1] > 0 and not eager[2]  # NaN eager: no bar
    assert eager[0] / tuned[0] == pytest.approx(500 / 200, rel=0.02)  # heights in proportion to the times
    assert tuned[2] / tuned[0] == pytest.approx(1000 / 200, rel=0.02)
    labels = browser.execute_script("return Chart.getChart('job-chart').scales.x.ticks.map((t) => t.label)")
    assert labels[:2] == ["softmax_0", "gelu_1"]
    assert console_errors(browser) == []

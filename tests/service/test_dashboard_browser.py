"""The dashboard in a real browser: Debian's headless ``chromium`` driven by Playwright against the real app (API
keys, the admin scope, Basic sign-in) in a uvicorn server on a free port. A browser without the key is refused and
one that answers the Basic challenge with it gets the pages; a revoked key is refused on the next load; the map's
points are drawn in their kind's colour and a hover names a subgraph's kind and best recipe; the job page's chart has
its bars in proportion to the times; no page logs a console error; hostile names stay text.

Skipped, with the reason, where Chromium or Playwright is missing; under ``CI=true`` that is a failure. Playwright's
own browsers are never used (``playwright install`` is not needed): the test launches ``/usr/bin/chromium``. With
``DASHBOARD_SCREENSHOTS=<folder>`` the pages are also saved there as PNG (docs/screenshots/ holds those of the README).
"""

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from db.repositories.api_keys import issue_api_key, revoke_api_key
from service.http.app import create_app
from service.http.config import ServerConfig
from tests.service.dashboard_data import HOSTILE, KINDS, Seeded, seed

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 900}


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]'; never `playwright install`)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (apt-get install -y chromium)"
    return None


@dataclass(frozen=True)
class Server:
    url: str
    seeded: Seeded
    admin: str  # the secret of an admin key
    read: str  # the secret of a read key


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:  # noqa: ANN001
    folder = tmp_path_factory.mktemp("dashboard-browser")
    seeded = seed(folder)
    with seeded.database.scope() as session:
        admin, read = (issue_api_key(session, name=s, scopes=[s])[1] for s in ("admin", "read"))
    config = ServerConfig(database_url=seeded.database.url, data_dir=folder, index_dir=folder / "index",
                          executor="none", backend="cpu")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the port is held from here on: no race for a "free" one
    uv = uvicorn.Server(uvicorn.Config(create_app(config, database=seeded.database), log_level="warning",
                                       lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield Server(f"http://127.0.0.1:{sock.getsockname()[1]}", seeded, admin, read)
    uv.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def chromium():  # noqa: ANN201
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs the browser test: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


class Tab:
    """A page of its own browser context (signed in with ``password`` as the Basic password, or not at all) that
    records every console error and uncaught exception."""

    def __init__(self, chromium, password: str | None) -> None:  # noqa: ANN001
        credentials = None if password is None else {"username": "admin", "password": password}
        self.context = chromium.new_context(viewport=VIEWPORT, http_credentials=credentials)
        self.context.set_default_timeout(20_000)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, url: str, canvas: str | None = None) -> int:
        """Load ``url`` (its status) and, when given, wait until Chart.js drew on the canvas with that id."""
        response = self.page.goto(url)
        if canvas is not None:
            self.page.wait_for_function("(id) => !!(window.Chart && Chart.getChart(id))", arg=canvas)
        return response.status

    def screenshot(self, name: str) -> None:
        folder = os.environ.get("DASHBOARD_SCREENSHOTS")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


@pytest.fixture
def tab(chromium, server: Server) -> Iterator[Tab]:  # noqa: ANN001
    tab = Tab(chromium, server.admin)
    yield tab
    tab.context.close()


def _refused(tab: Tab, url: str) -> str:
    """How the browser was refused ``url``: the status of the page it shows, or that it was asked for credentials
    (a Basic challenge) and had none."""
    from playwright.sync_api import Error

    try:
        status = tab.open(url)
    except Error as e:  # challenged, the browser had no credentials to give
        assert "ERR_INVALID_AUTH_CREDENTIALS" in e.message, e.message
        return "no credentials to give"
    assert tab.page.locator("#jobs").count() == 0
    return str(status)


def test_the_dashboard_asks_a_browser_for_the_key_and_refuses_it_once_revoked(chromium, server):
    for password, refusal in ((None, "no credentials to give"), ("tb_not-a-key", "401"), (server.read, "403")):
        refused = Tab(chromium, password)  # no credentials, an unknown key, a key without the admin scope
        assert _refused(refused, server.url + "/") == refusal, password
        refused.context.close()
    anonymous = chromium.new_context()
    answer = anonymous.request.get(server.url + "/")  # what made the browser ask: a Basic challenge
    assert answer.status == 401 and answer.headers["www-authenticate"] == 'Basic realm="tunebank"'
    anonymous.close()
    with server.seeded.database.scope() as session:
        key, secret = issue_api_key(session, name="soon revoked", scopes=["admin"])
        key_id = key.id
    signed_in = Tab(chromium, secret)
    assert signed_in.open(server.url + "/") == 200  # the browser was challenged and answered with the key
    assert signed_in.page.locator("#jobs").is_visible()
    assert signed_in.errors == []
    with server.seeded.database.scope() as session:
        revoke_api_key(session, key_id)
    assert _refused(signed_in, server.url + "/") == "401"  # the browser still sends the key: refused at once
    signed_in.context.close()


def test_home_page_loads_without_console_errors(tab, server):
    assert tab.open(server.url + "/") == 200
    jobs = tab.page.locator("#jobs")
    assert jobs.is_visible()
    assert HOSTILE in jobs.inner_text()  # shown as text ...
    assert tab.page.locator("#jobs img, #models img").count() == 0
    tab.screenshot("home")
    assert tab.errors == []  # ... and no script ran, nothing failed to load


def test_map_draws_every_point_and_hover_names_its_kind(tab, server):
    page = tab.page
    assert tab.open(server.url + "/map", canvas="map-chart") == 200
    drawn = page.evaluate("""() => {
        const chart = Chart.getChart('map-chart');
        return chart.data.datasets.map((d, i) => ({kind: d.label, points: chart.getDatasetMeta(i).data.map(
            (e, j) => ({x: e.x, y: e.y, hash: d.data[j].structural_hash}))}));}""")
    assert sorted(d["kind"] for d in drawn) == sorted(KINDS)
    assert sum(len(d["points"]) for d in drawn) == 12
    area = page.evaluate("() => { const a = Chart.getChart('map-chart').chartArea; "
                         "return [a.left, a.top, a.right, a.bottom]; }")
    for d in drawn:
        for p in d["points"]:
            assert area[0] - 1 <= p["x"] <= area[2] + 1 and area[1] - 1 <= p["y"] <= area[3] + 1
    first = drawn[0]["points"][0]
    painted = page.evaluate("""([x, y]) => {
        const c = document.getElementById('map-chart');
        return Array.from(c.getContext('2d').getImageData(Math.round(x * devicePixelRatio),
                                                          Math.round(y * devicePixelRatio), 1, 1).data);}""",
                            [first["x"], first["y"]])
    colour = page.evaluate("() => Chart.getChart('map-chart').data.datasets[0].backgroundColor")
    assert painted == [int(colour[i: i + 2], 16) for i in (1, 3, 5)] + [255]  # its centre has its kind's colour

    canvas = page.locator("#map-chart")
    canvas.scroll_into_view_if_needed()
    hostile = next(d for d in drawn if d["kind"] == KINDS[2])
    for target in (drawn[-1], hostile):  # two datasets: the hover finds the point in the right one
        point = target["points"][0]
        box = canvas.bounding_box()
        page.mouse.move(box["x"] + point["x"], box["y"] + point["y"])
        page.wait_for_function("(kind) => document.getElementById('map-detail').textContent.startsWith(kind)",
                               arg=target["kind"])
        detail = page.locator("#map-detail").inner_text()
        assert point["hash"][:12] in detail
        recipe = server.seeded.best.get(point["hash"], ("",))[0]
        assert recipe in detail
        tooltip = page.evaluate("() => { const t = Chart.getChart('map-chart').tooltip; return [t.opacity, t.title]; }")
        assert tooltip == [1, [target["kind"]]]
        if target is drawn[-1]:
            tab.screenshot("map")
    assert page.locator("#map-detail img, #map-detail script").count() == 0
    assert tab.errors == []


def test_job_page_chart_has_its_bars(tab, server):
    page = tab.page
    assert tab.open(f"{server.url}/jobs/{server.seeded.optimize_job}", canvas="job-chart") == 200
    bars = page.evaluate("""() => {
        const chart = Chart.getChart('job-chart');
        return chart.data.datasets.map((d, i) => ({label: d.label,
            heights: chart.getDatasetMeta(i).data.map((e) => e.skip ? null : e.base - e.y)}));}""")
    assert [b["label"] for b in bars] == ["eager", "tuned kernel"]
    eager, tuned = bars[0]["heights"], bars[1]["heights"]
    assert len(eager) == len(tuned) == 3
    assert all(h > 0 for h in tuned) and eager[0] > 0 and eager[1] > 0 and not eager[2]  # NaN eager: no bar
    assert eager[0] / tuned[0] == pytest.approx(500 / 200, rel=0.02)  # heights in proportion to the times
    assert tuned[2] / tuned[0] == pytest.approx(1000 / 200, rel=0.02)
    labels = page.evaluate("() => Chart.getChart('job-chart').scales.x.ticks.map((t) => t.label)")
    assert labels[:2] == ["softmax_0", "gelu_1"]
    tab.screenshot("job")
    assert tab.errors == []

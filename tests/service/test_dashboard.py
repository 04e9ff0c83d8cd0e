"""The dashboard's pages over a real database (SQLite, migrated, filled through the repositories), read back as
HTML: what they count, which jobs they list, what the charts get, and that text from the database stays text."""

import html
import json
import re
from html.parser import HTMLParser

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.dashboard.embedding_map import project
from tests.service.dashboard_data import HOSTILE, KINDS, app_for, empty_database, seed


class Tables(HTMLParser):
    """Rows of cell texts of every <table id=...>, and the text of <script type="application/json" id=...>."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.json: dict[str, object] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._script: str | None = None
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("id"):
            self._table = a["id"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []
        elif tag == "script" and a.get("type") == "application/json":
            self._script = a["id"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._script is not None:
            self.json[self._script] = json.loads(data)


def raw_markup_absent(page: str) -> None:
    """The hostile string never appears as markup; only escaped."""
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "onerror=alert(1)&gt;" in page or "onerror=alert(1)\\u003e" in page


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):  # noqa: ANN001, ANN201
    return seed(tmp_path_factory.mktemp("dashboard"))


@pytest.fixture(scope="module")
def client(seeded):  # noqa: ANN001, ANN201
    return TestClient(app_for(seeded.database))


def test_empty_database_renders_every_page(tmp_path):
    client = TestClient(app_for(empty_database(tmp_path)))
    home = client.get("/")
    assert home.status_code == 200
    assert re.search(r'data-count="subgraphs">0<', home.text) and 'id="no-jobs"' in home.text
    assert 'id="no-subgraphs"' in home.text and 'id="no-models"' in home.text
    space = client.get("/map")
    assert space.status_code == 200 and 'id="no-embeddings"' in space.text
    missing = client.get("/jobs/1")
    assert missing.status_code == 404 and "There is no job 1" in missing.text


def test_home_counts_coverage_per_kind_and_device(client, seeded):
    page = client.get("/")
    assert page.status_code == 200
    counts = dict(re.findall(r'data-count="(\w+)">(\d+)<', page.text))
    assert counts["subgraphs"] == "12" and counts["models"] == "1" and counts["devices"] == "2"
    assert counts["measurements"] == str(11 * 3 + 4) and counts["embeddings"] == "15"
    rows = Tables(page.text).tables["coverage"]
    assert rows[0] == ["kind", "subgraphs", "measured ok", "cpu:test", "cuda:h200"]
    by_kind = {row[0]: row[1:] for row in rows[1:]}
    # 12 subgraphs over 3 kinds; the last one (a hostile-kind subgraph) has no measurement; the first four have a
    # cuda:h200 measurement (two reductions, one pointwise, one hostile kind)
    assert by_kind == {"reduction": ["4", "4", "4", "2"], "pointwise": ["4", "4", "4", "1"],
                       KINDS[2]: ["4", "3", "3", "1"]}
    devices = {row[0]: row[1:] for row in Tables(page.text).tables["devices"][1:]}
    assert devices["cpu:test"] == ["cpu:test", "11", "33 (22)", "12"]
    raw_markup_absent(page.text)


def test_home_lists_recent_jobs_with_status_and_speedup(client, seeded):
    page = client.get("/")
    rows = Tables(page.text).tables["jobs"][1:]
    assert [row[0] for row in rows] == [f"#{seeded.queued_job}", f"#{seeded.crawl_job}", f"#{seeded.failed_job}",
                                        f"#{seeded.optimize_job}"]  # newest first; the crawl lock row is no job
    jobs = {row[0]: row for row in rows}
    optimize = jobs[f"#{seeded.optimize_job}"]
    assert optimize[1:3] == ["optimize", "succeeded"] and optimize[3] == f"zoo:{HOSTILE}"
    assert optimize[4] == "cpu:test" and optimize[5] == "1.25x"
    assert optimize[6] == "2 of 3 subgraphs run a tuned kernel"
    assert jobs[f"#{seeded.failed_job}"][2] == "failed"
    assert jobs[f"#{seeded.failed_job}"][6] == f"ModelError: {HOSTILE} is not an ONNX file"
    assert jobs[f"#{seeded.crawl_job}"][6] == "tuned 7 of 9 subgraphs, 28 measurements"
    assert jobs[f"#{seeded.queued_job}"][2:6] == ["queued", "zoo:queued_model", "—", "—"]
    assert f'href="/jobs/{seeded.optimize_job}"' in page.text
    models = Tables(page.text).tables["models"]
    assert models[1][:3] == [f"m{HOSTILE}", "upload", "5"]
    raw_markup_absent(page.text)


def test_job_page_has_the_per_subgraph_report_and_chart_data(client, seeded):
    page = client.get(f"/jobs/{seeded.optimize_job}")
    assert page.status_code == 200
    parsed = Tables(page.text)
    rows = parsed.tables["subgraphs"][1:]
    assert [row[:4] for row in rows] == [["softmax_0", "reduction", "transfer", "kernel"],
                                         ["gelu_1", "pointwise", "hit", "eager"],
                                         [f"n{HOSTILE}", "matmul", "transfer", "kernel"]]
    assert rows[0][4:] == ["500 µs", "200 µs", "2.50x", "fuse(all);reduce(r0,warp)"]
    assert rows[2][4] == "—"  # eager time NaN in the report: shown as missing, not "nan"
    assert parsed.tables["model-times"][1] == ["1.25 ms", "1 ms", "1.25x"]
    chart = parsed.json["job-chart-data"]
    assert chart == {"labels": ["softmax_0", "gelu_1", f"n{HOSTILE}"], "eager": [5e-4, 3.1e-4, None],
                     "tuned": [2e-4, 3e-4, 1e-3]}
    assert "</script><img" not in page.text.split('id="job-chart-data">')[1].split("</script>")[0]
    raw_markup_absent(page.text)
    assert page.headers["content-security-policy"].startswith("default-src 'self'; script-src 'self'")


def test_job_pages_of_failed_crawl_and_queued_jobs(client, seeded):
    failed = client.get(f"/jobs/{seeded.failed_job}")
    assert failed.status_code == 200 and "is not an ONNX file" in failed.text and 'id="job-chart"' not in failed.text
    raw_markup_absent(failed.text)
    crawl = Tables(client.get(f"/jobs/{seeded.crawl_job}").text).tables
    assert ["tuned", "7"] in crawl["result"] and ["backend", '"cpu"'] in crawl["params"]
    queued = client.get(f"/jobs/{seeded.queued_job}")
    assert queued.status_code == 200 and "zoo:queued_model" in queued.text


@pytest.mark.parametrize(("url", "status"), [("/jobs/999", 404), ("/jobs/0", 422), (f"/jobs/{2**70}", 422),
                                              ("/jobs/abc", 422), ("/jobs/1", 404)])
def test_unknown_jobs_and_lock_rows_are_not_found(client, url, status):
    assert client.get(url).status_code == status  # job 1 is the crawl lock row: no job


def test_map_projects_embeddings_coloured_by_kind_with_best_recipes(client, seeded):
    page = client.get("/map")
    assert page.status_code == 200
    points = Tables(page.text).json["map-data"]
    assert len(points) == 12  # the largest index (cpu:test, static v1); cuda-h200 holds 3
    assert {p["kind"] for p in points} == set(KINDS)
    for p in points:
        assert seeded.subgraphs[p["structural_hash"]] == p["kind"] and p["device"] == "cpu:test"
        assert (p["recipe"], p["median_s"]) == seeded.best.get(p["structural_hash"], (None, None))
    # three clusters of four: points of one kind lie close together, far from the other kinds'
    xy = {kind: np.array([[p["x"], p["y"]] for p in points if p["kind"] == kind]) for kind in KINDS}
    centres = {kind: v.mean(axis=0) for kind, v in xy.items()}
    spread = max(np.abs(v - centres[kind]).max() for kind, v in xy.items())
    gaps = [np.linalg.norm(centres[a] - centres[b]) for a in KINDS for b in KINDS if a < b]
    assert min(gaps) > 10 * spread
    assert re.search(r"12 of 12 embeddings of cpu:test", page.text)
    legend = re.findall(r'<li data-kind="([^"]*)"', page.text)
    assert sorted(html.unescape(k) for k in legend) == sorted(KINDS)
    raw_markup_absent(page.text)


def test_map_of_another_index_and_of_one_that_does_not_exist(client):
    other = client.get("/map", params={"device_class": "cuda-h200"})
    points = Tables(other.text).json["map-data"]
    assert other.status_code == 200 and len(points) == 3 and {p["device"] for p in points} == {"cuda:h200"}
    assert {p["recipe"] for p in points} == {"fuse(all)"}
    missing = client.get("/map", params={"device_class": "<b>nope</b>", "encoder": "static"})
    assert missing.status_code == 404 and "&lt;b&gt;nope&lt;/b&gt;" in missing.text and "<b>nope" not in missing.text


def test_projection_of_degenerate_sets():
    assert project(np.zeros((0, 4), np.float32))[0].shape == (0, 2)
    assert project(np.ones((1, 4), np.float32))[0].tolist() == [[0.0, 0.0]]
    assert project(np.ones((3, 4), np.float32))[0].tolist() == [[0.0, 0.0]] * 3  # no variance at all
    line = np.array([[0.0], [1.0], [2.0]], np.float32)  # one dimension: y stays 0
    coords, explained = project(line)
    assert np.allclose(np.abs(coords[:, 0]), [1, 0, 1]) and np.allclose(coords[:, 1], 0) and explained == [1.0]


def test_static_files_are_only_the_shipped_ones(client):
    script = client.get("/static/dashboard/vendor/chart.umd.min.js")
    assert script.status_code == 200 and "Chart.js v4" in script.text[:200]
    assert "javascript" in script.headers["content-type"]
    assert client.get("/static/dashboard/dashboard.css").status_code == 200
    for path in ("/static/dashboard/../router.py", "/static/dashboard/..%2Frouter.py",
                 "/static/dashboard/%2e%2e/%2e%2e/views.py", "/static/dashboard/nope.js"):
        response = client.get(path)
        assert response.status_code == 404 and "dashboard_router" not in response.text


def test_a_prefix_and_an_auth_dependency(seeded):
    from fastapi import Depends, HTTPException, Request

    def admin_only(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer admin":
            raise HTTPException(401, "no key")

    client = TestClient(app_for(seeded.database, prefix="/dashboard", dependencies=[Depends(admin_only)]))
    assert client.get("/dashboard/").status_code == 401
    page = client.get("/dashboard/", headers={"authorization": "Bearer admin"})
    assert page.status_code == 200 and 'href="/dashboard/jobs/' in page.text
    assert 'src="/dashboard/static/dashboard/vendor/chart.umd.min.js"' in page.text
    for name in ("vendor/chart.umd.min.js", "dashboard.js", "dashboard.css"):  # the package's files: public
        assert client.get(f"/dashboard/static/dashboard/{name}").status_code == 200
    assert client.get("/dashboard/map").status_code == 401 and client.get("/dashboard/jobs/2").status_code == 401

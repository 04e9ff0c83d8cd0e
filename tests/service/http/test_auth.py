"""API keys at the edge: missing, unknown and revoked keys (401), scopes (403), the rate limit (429), open access only
while no key exists, and a key that sees only its own jobs (404 for another's)."""

import base64
import importlib.util

import pytest

from db.repositories import jobs
from db.repositories.api_keys import revoke_api_key
from tests.service.http.conftest import Api


def _error(response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error", "detail"} and body["detail"], body
    return response.status_code, body["error"]


def test_no_key_unknown_key_and_malformed_header_are_401_with_how_to_fix(api: Api) -> None:
    api.key("read")
    assert _error(api.client.get("/v1/stats")) == (401, "unauthorized")
    response = api.client.get("/v1/stats", headers={"Authorization": "Bearer tb_not-a-key"})
    assert _error(response) == (401, "unauthorized") and "unknown API key" in response.json()["detail"]
    assert response.headers["www-authenticate"] == "Bearer"
    assert _error(api.client.get("/v1/stats", headers={"Authorization": "Basic abc"}))[0] == 401


def test_a_revoked_key_is_refused_on_its_next_request(api: Api) -> None:
    headers = api.key("read")
    assert api.client.get("/v1/stats", headers=headers).status_code == 200
    with api.database.scope() as session:
        revoke_api_key(session, int(headers["x-key-id"]))
    response = api.client.get("/v1/stats", headers=headers)
    assert _error(response) == (401, "unauthorized") and "revoked" in response.json()["detail"]


def test_each_route_needs_its_scope_and_admin_holds_them_all(api: Api) -> None:
    read, ingest, admin = api.key("read"), api.key("ingest"), api.key("admin")
    body = {"measurements": []}
    response = api.client.post("/v1/measurements", json=body, headers=read)
    assert _error(response) == (403, "forbidden") and "'ingest'" in response.json()["detail"]
    assert _error(api.client.get("/v1/stats", headers=ingest)) == (403, "forbidden")
    assert _error(api.client.post("/v1/optimize", files={"model": ("m.json", b"{}")}, headers=read))[0] == 403
    assert api.client.post("/v1/measurements", json=body, headers=ingest).status_code == 200
    assert api.client.post("/v1/measurements", json=body, headers=admin).status_code == 200
    assert api.client.get("/v1/stats", headers=admin).status_code == 200


def test_open_access_serves_the_local_user_only_while_no_live_key_exists(make_api) -> None:
    api = make_api(open_access=True)
    assert api.client.get("/v1/stats").status_code == 200
    headers = api.key("read")
    assert api.client.get("/v1/stats").status_code == 401  # a key exists now: every request needs one
    assert api.client.get("/v1/stats", headers=headers).status_code == 200
    closed = make_api()  # not on loopback: never open, even with no key at all
    with closed.database.scope() as session:
        revoke_api_key(session, int(headers["x-key-id"]))
    assert closed.client.get("/v1/stats").status_code == 401


def test_the_rate_limit_is_per_key_and_says_when_to_retry(make_api) -> None:
    api = make_api(rate_limit_per_minute=3)
    first, second = api.key("read"), api.key("read")
    assert [api.client.get("/v1/stats", headers=first).status_code for _ in range(3)] == [200] * 3
    response = api.client.get("/v1/stats", headers=first)
    assert _error(response) == (429, "rate limited") and int(response.headers["retry-after"]) >= 1
    assert api.client.get("/v1/stats", headers=second).status_code == 200  # another key has its own budget


def test_a_key_sees_only_its_own_jobs(api: Api) -> None:
    alice, bob = api.key("read", "optimize"), api.key("read")
    with api.database.scope() as session:
        mine = jobs.enqueue(session, "optimize", {"model": "x.json", "filename": "x.json"})
        mine.owner_key_id = int(alice["x-key-id"])
        session.flush()
        job_id = mine.id
    assert api.client.get(f"/v1/jobs/{job_id}", headers=alice).json()["id"] == job_id
    assert [j["id"] for j in api.client.get("/v1/jobs", headers=alice).json()["jobs"]] == [job_id]
    assert _error(api.client.get(f"/v1/jobs/{job_id}", headers=bob)) == (404, "not found")
    assert _error(api.client.get(f"/v1/jobs/{job_id}/plan", headers=bob)) == (404, "not found")
    assert api.client.get("/v1/jobs", headers=bob).json() == {"jobs": [], "total": 0, "limit": 20, "offset": 0,
                                                              "next_offset": None}


def _dashboard_or_skip() -> None:
    if importlib.util.find_spec("jinja2") is None or importlib.util.find_spec("service.dashboard") is None:
        pytest.skip("the dashboard (service.dashboard, Jinja2) is not installed")


def _basic(secret: str, user: str = "anyone") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()}


def _secret(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


def test_the_dashboard_is_mounted_at_the_root_behind_the_admin_scope(api: Api) -> None:
    _dashboard_or_skip()
    admin, read = api.key("admin"), api.key("read")
    assert api.client.get("/").status_code == 401
    assert api.client.get("/", headers=read).status_code == 403
    page = api.client.get("/", headers=admin)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_a_browser_signs_in_to_the_dashboard_with_the_key_as_basic_password(api: Api) -> None:
    _dashboard_or_skip()
    admin, read = api.key("admin"), api.key("read")
    refused = api.client.get("/")
    assert _error(refused) == (401, "unauthorized") and "password" in refused.json()["detail"]
    assert refused.headers["www-authenticate"] == 'Basic realm="tunebank"'  # the browser asks for a user and key
    for user in ("admin", "", "ü ber"):  # any user name; the key is the password
        page = api.client.get("/", headers=_basic(_secret(admin), user))
        assert page.status_code == 200 and 'data-count="subgraphs"' in page.text
    assert api.client.get("/map", headers=_basic(_secret(admin))).status_code == 200
    assert _error(api.client.get("/", headers=_basic(_secret(read)))) == (403, "forbidden")
    assert api.client.get("/", headers=admin).status_code == 200  # Bearer still works (a proxy, a script)
    for header in ("Basic " + base64.b64encode(b"admin:tb_not-a-key").decode(),  # unknown key
                   "Basic " + base64.b64encode(_secret(admin).encode()).decode(),  # no colon: no password
                   "Basic " + base64.b64encode(b"admin:").decode(), "Basic %%%", "Basic", "Digest abc"):
        response = api.client.get("/", headers={"Authorization": header})
        assert _error(response) == (401, "unauthorized"), header
        assert response.headers["www-authenticate"] == 'Basic realm="tunebank"', header


def test_a_revoked_key_no_longer_opens_the_dashboard(api: Api) -> None:
    _dashboard_or_skip()
    admin = api.key("admin")
    assert api.client.get("/", headers=_basic(_secret(admin))).status_code == 200
    with api.database.scope() as session:
        revoke_api_key(session, int(admin["x-key-id"]))
    response = api.client.get("/", headers=_basic(_secret(admin)))
    assert _error(response) == (401, "unauthorized") and "revoked" in response.json()["detail"]
    assert response.headers["www-authenticate"] == 'Basic realm="tunebank"'


def test_the_api_takes_bearer_keys_only(api: Api) -> None:
    admin = api.key("admin")
    response = api.client.get("/v1/stats", headers=_basic(_secret(admin)))
    assert _error(response) == (401, "unauthorized") and response.headers["www-authenticate"] == "Bearer"
    assert api.client.get("/v1/stats", headers=admin).status_code == 200


def test_the_dashboards_static_files_are_public_and_cost_no_rate_limit(make_api) -> None:
    _dashboard_or_skip()
    api = make_api(rate_limit_per_minute=2)
    admin = _basic(_secret(api.key("admin")))
    for path in ("/static/dashboard/vendor/chart.umd.min.js", "/static/dashboard/dashboard.css",
                 "/static/dashboard/dashboard.js"):
        for headers in ({}, admin, admin):  # what a browser loads with each page, signed in or not
            assert api.client.get(path, headers=headers).status_code == 200, path
    assert [api.client.get("/", headers=admin).status_code for _ in range(3)] == [200, 200, 429]  # pages count

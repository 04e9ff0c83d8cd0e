"""The read and ingest routes over a crawled database (synthetic timings): subgraphs, search, idempotent ingest,
stats; health, readiness and metrics; errors always ``{"error", "detail"}``."""

from pathlib import Path

import pytest
from sqlalchemy import func, select

from db.models import Measurement
from embed.subgraph import Subgraph
from service.crawl import crawl
from service.embeddings import EncoderStore, embed_subgraphs, fit_encoder, profiled_subgraphs
from tests.service.conftest import DEVICE, synthetic_measurer
from tests.service.http.conftest import Api


@pytest.fixture
def crawled(api: Api, tiny_subgraphs: list[Subgraph]) -> Api:
    """Two tiny models crawled on DEVICE (class cpu:test), embedded with a promoted ``static`` encoder."""
    crawl(api.database, tiny_subgraphs, synthetic_measurer(), backend="cpu", budget=4)
    with api.database.scope() as session:
        ids = profiled_subgraphs(session, 1)
        encoder = fit_encoder(session, "static", device_id=1, subgraph_ids=ids, backend="cpu")
        embed_subgraphs(session, encoder, device_id=1, subgraph_ids=ids)
    store = EncoderStore(api.config.data_dir / "encoders")
    store.save(encoder)
    store.promote("static", encoder.version)
    return api


def test_a_subgraph_by_id_or_hash_with_its_best_recipe_per_device(crawled: Api,
                                                                   tiny_subgraphs: list[Subgraph]) -> None:
    headers = crawled.key("read")
    h = tiny_subgraphs[0].structural_hash
    by_hash = crawled.client.get(f"/v1/subgraphs/{h}", headers=headers).json()
    assert crawled.client.get(f"/v1/subgraphs/{by_hash['id']}", headers=headers).json() == by_hash
    assert by_hash["structural_hash"] == h and by_hash["kind"] == tiny_subgraphs[0].kind.value
    assert by_hash["ir"]["nodes"] and by_hash["features"]
    [best] = by_hash["best"]
    assert (best["device"], best["device_class"], best["toolchain"]) == (DEVICE.name, "cpu:test", "synthetic")
    assert best["recipe"] and 1e-3 <= best["median_s"] <= 2e-3
    assert crawled.client.get(f"/v1/subgraphs/{'f' * 64}", headers=headers).status_code == 404
    assert crawled.client.get("/v1/subgraphs/99999", headers=headers).status_code == 404


def test_search_finds_stored_neighbours_of_the_same_kind_never_the_query_itself(
        crawled: Api, tiny_subgraphs: list[Subgraph]) -> None:
    headers = crawled.key("read")
    query = tiny_subgraphs[0]
    body = {"subgraph": query.structural_hash, "device_class": "cpu:test", "k": 3}
    found = crawled.client.post("/v1/search", json=body, headers=headers).json()
    assert (found["device_class"], found["encoder"]) == ("cpu:test", "static")
    [result] = found["results"]
    same_kind = {s.structural_hash for s in tiny_subgraphs if s.kind == query.kind} - {query.structural_hash}
    assert {n["structural_hash"] for n in result["neighbours"]} == same_kind
    assert all(n["kind"] == query.kind.value and n["recipe"] and n["distance"] >= 0 for n in result["neighbours"])
    ir = crawled.client.post("/v1/search", json={"ir": query.graph.model_dump(mode="json"),
                                                 "device_class": "cpu:test", "k": 1}, headers=headers).json()
    assert [r["query"]["structural_hash"] for r in ir["results"]] == [query.structural_hash]
    bad = crawled.client.post("/v1/search", json={"ir": {"nodes": "x"}, "device_class": "cpu:test"}, headers=headers)
    assert bad.status_code == 422 and set(bad.json()) == {"error", "detail"}


def test_search_reads_the_promoted_encoder_once_and_follows_a_new_promotion(
        crawled: Api, tiny_subgraphs: list[Subgraph], monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str | None] = []
    load = EncoderStore.load
    monkeypatch.setattr(EncoderStore, "load", lambda store, name, version=None: read.append(version) or load(
        store, name, version))
    headers, body = crawled.key("read"), {"subgraph": tiny_subgraphs[0].structural_hash, "device_class": "cpu:test"}
    first = [crawled.client.post("/v1/search", json=body, headers=headers).json() for _ in range(3)]
    assert len(read) == 1 and len({f["encoder_version"] for f in first}) == 1
    with crawled.database.scope() as session:  # a new version, fitted on fewer subgraphs, embedded and promoted
        ids = profiled_subgraphs(session, 1)
        newer = fit_encoder(session, "static", device_id=1, subgraph_ids=ids[:-1], backend="cpu")
        embed_subgraphs(session, newer, device_id=1, subgraph_ids=ids)
    store = EncoderStore(crawled.config.data_dir / "encoders")
    store.save(newer)
    store.promote("static", newer.version)
    after = crawled.client.post("/v1/search", json=body, headers=headers).json()
    assert after["encoder_version"] == newer.version != first[0]["encoder_version"] and read == [read[0], newer.version]


def test_search_before_any_encoder_is_a_conflict_that_says_what_to_do(api: Api) -> None:
    response = api.client.post("/v1/search", json={"subgraph": "1", "device_class": "cpu:test"},
                               headers=api.key("read"))
    assert response.status_code == 409 and "crawl or optimize" in response.json()["detail"]


def test_ingest_is_idempotent_and_refuses_unknown_subgraphs(crawled: Api, tiny_subgraphs: list[Subgraph]) -> None:
    headers = crawled.key("ingest")
    device = {"name": "remote-h200", "device_class": "cuda:sm_90", "arch": "sm_90"}
    records = [{"subgraph": s.structural_hash, "recipe": "fuse(all)", "device": "remote-h200", "toolchain": "nvrtc",
                "median_s": 1e-5 * (n + 1), "repeats": 10} for n, s in enumerate(tiny_subgraphs[:2])]
    records.append({**records[0], "recipe": "fuse(none)", "ok": False, "median_s": None, "error_kind": "wrong"})
    body = {"devices": [device], "measurements": records}

    def stored() -> int:
        with crawled.database.scope() as session:
            return session.scalar(select(func.count()).select_from(Measurement)
                                  .where(Measurement.toolchain == "nvrtc")) or 0

    first = crawled.client.post("/v1/measurements", json=body, headers=headers)
    assert first.json() == {"received": 3, "inserted": 3, "duplicates": 0}
    again = crawled.client.post("/v1/measurements", json=body, headers=headers)
    assert again.json() == {"received": 3, "inserted": 0, "duplicates": 3}
    assert stored() == 3
    unknown = {"measurements": [{**records[0], "subgraph": "e" * 64}]}
    response = crawled.client.post("/v1/measurements", json=unknown, headers=headers)
    assert response.status_code == 422 and "unknown subgraph" in response.json()["detail"]
    for bad in ({**records[0], "median_s": -1.0}, {**records[0], "surprise": 1},
                {**records[0], "ok": True, "median_s": None}, {**records[0], "recipe": "tile(p0,"}):
        response = crawled.client.post("/v1/measurements", json={"measurements": [bad]}, headers=headers)
        assert response.status_code == 422 and set(response.json()) == {"error", "detail"}, bad
    assert stored() == 3


def test_stats_count_what_the_database_holds(crawled: Api) -> None:
    stats = crawled.client.get("/v1/stats", headers=crawled.key("read")).json()
    assert stats["tables"]["subgraphs"] == 4 and stats["tables"]["measurements"] > 0
    assert [d["device"] for d in stats["devices"]] == [DEVICE.name]


def test_readyz_says_why_it_is_not_ready(api: Api, tmp_path: Path) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    assert api.client.get("/readyz").json() == {"status": "ready"}
    api.config.index_dir.rmdir() if api.config.index_dir.exists() else None
    api.config.index_dir.write_text("not a folder")
    response = api.client.get("/readyz")
    assert response.status_code == 503 and "index folder" in response.json()["detail"]
    api.config.index_dir.unlink()
    with api.database.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0002'")
    response = api.client.get("/readyz")
    assert response.status_code == 503 and "database" in response.json()["detail"]


def test_metrics_count_requests_and_jobs(api: Api) -> None:
    headers = api.key("read", "optimize")
    api.client.get("/v1/stats", headers=headers)
    api.client.get("/v1/jobs/12345", headers=headers)
    text = api.client.get("/metrics").text
    assert 'tunebank_http_requests_total{method="GET",route="/v1/stats",status="200"} 1.0' in text
    assert 'tunebank_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="404"} 1.0' in text
    assert "tunebank_http_request_seconds_bucket" in text
    api.client.post("/v1/optimize", files={"model": ("m.json", b'{"bad": 1}')}, headers=headers)
    from db.repositories import jobs

    with api.database.scope() as session:
        jobs.enqueue(session, "optimize", {"model": "x"})
    assert 'tunebank_jobs{kind="optimize",status="queued"} 1.0' in api.client.get("/metrics").text


def test_every_error_is_error_and_detail(api: Api) -> None:
    headers = api.key("read")
    for response in (api.client.get("/v1/nothing-here", headers=headers),
                     api.client.get("/v1/jobs/not-a-number", headers=headers),
                     api.client.get("/v1/jobs?limit=1000", headers=headers),
                     api.client.delete("/v1/stats", headers=headers),
                     api.client.post("/v1/search", content=b"{not json", headers={**headers,
                                                                                  "Content-Type": "application/json"})):
        assert 400 <= response.status_code < 500 and set(response.json()) == {"error", "detail"}, response.text


def test_a_request_that_takes_too_long_ends_with_504(make_api) -> None:
    api = make_api(request_timeout_s=0.2)

    async def slow() -> dict:
        import asyncio

        await asyncio.sleep(5)
        return {}

    api.client.app.add_api_route("/v1/slow", slow)
    response = api.client.get("/v1/slow")
    assert response.status_code == 504 and "TUNEBANK_REQUEST_TIMEOUT_S" in response.json()["detail"]
    assert api.client.get("/healthz").status_code == 200

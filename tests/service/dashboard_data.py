"""A small database for the dashboard tests, filled through the real repositories: two devices, subgraphs of three
kinds (one kind named like markup), measurements, embeddings in two clusters, a model with a hostile name, and jobs
of every status (an optimize job whose result is a real ``OptimizeReport``), plus a crawl lock row."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from fastapi import FastAPI

from db.migrate import upgrade
from db.repositories.devices import DeviceIn, upsert_device
from db.repositories.embeddings import EmbeddingIn, add_embeddings
from db.repositories.jobs import JobStatus, acquire_lock, enqueue, finish
from db.repositories.measurements import MeasurementIn, ingest_measurements
from db.repositories.model_catalog import add_model
from db.repositories.subgraphs import SubgraphIn, add_subgraphs, subgraph_ids
from db.session import Database
from service.dashboard import dashboard_router
from service.optimize_report import OptimizeReport, SubgraphReport

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
KINDS = ("reduction", "pointwise", f"k{HOSTILE}")  # a kind is a string column too


@dataclass(frozen=True)
class Seeded:
    database: Database
    optimize_job: int
    failed_job: int
    crawl_job: int
    queued_job: int
    subgraphs: dict[str, str]  # structural hash -> kind
    best: dict[str, tuple[str, float]]  # structural hash -> (best recipe, its median) on the first device


def empty_database(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'dashboard.db'}")
    upgrade(database.engine)
    return database


def app_for(database: Database, **kwargs: object) -> FastAPI:
    app = FastAPI()
    app.include_router(dashboard_router(database, **kwargs))
    return app


def report() -> OptimizeReport:
    rows = [
        SubgraphReport(name="softmax_0", kind="reduction", structural_hash="a" * 64, ops=["softmax"], occurrences=2,
                       source="transfer", choice="kernel", recipe="fuse(all);reduce(r0,warp)", kernel_s=2e-4,
                       eager_s=5e-4),
        SubgraphReport(name="gelu_1", kind="pointwise", structural_hash="b" * 64, ops=["gelu"], occurrences=1,
                       source="hit", choice="eager", recipe="fuse(all)", kernel_s=3e-4, eager_s=3.1e-4),
        SubgraphReport(name=f"n{HOSTILE}", kind="matmul", structural_hash="c" * 64, ops=["matmul"], occurrences=1,
                       source="transfer", choice="kernel", recipe="tile_m(64)", kernel_s=1e-3, eager_s=float("nan")),
    ]
    return OptimizeReport(model=f"zoo:{HOSTILE}", backend="cpu", device="cpu:test", toolchain="gcc-12",
                          subgraphs=rows, stages_s={"tune": 1.5}, model_s=1.0e-3, eager_model_s=1.25e-3)


def seed(tmp_path: Path) -> Seeded:
    database = empty_database(tmp_path)
    rng = np.random.default_rng(0)
    subgraphs: dict[str, str] = {}
    best: dict[str, tuple[str, float]] = {}
    with database.scope() as session:
        cpu = upsert_device(session, DeviceIn("cpu:test", "cpu:test", "x86_64"))
        gpu = upsert_device(session, DeviceIn("cuda:h200", "cuda-h200", "sm_90"))
        records = []
        for i in range(12):
            kind = KINDS[i % 3]
            digest = f"{i:02d}" + "f" * 62
            subgraphs[digest] = kind
            records.append(SubgraphIn(digest, f"fam{i % 3}", kind, "{}"))
        add_subgraphs(session, records)
        measurements = []
        for i, (digest, _kind) in enumerate(subgraphs.items()):
            if i == 11:
                continue  # one subgraph with no measurement at all
            fast, slow = 1e-4 * (i + 1), 2e-4 * (i + 1)
            best[digest] = (f"tile(p0,{64 * (i + 1)})", fast)
            measurements += [
                MeasurementIn(digest, f"tile(p0,{64 * (i + 1)})", "cpu:test", "gcc", fast, repeats=5),
                MeasurementIn(digest, "fuse(all)", "cpu:test", "gcc", slow, repeats=5),
                MeasurementIn(digest, "vectorize(p0,4)", "cpu:test", "gcc", None, ok=False, error_kind="wrong"),
            ]
            if i < 4:
                measurements.append(MeasurementIn(digest, "fuse(all)", "cuda:h200", "nvrtc", 1e-5, repeats=9))
        ingest_measurements(session, measurements)
        ids = subgraph_ids(session, subgraphs)
        centre = {kind: rng.normal(size=8) * 10 for kind in KINDS}
        add_embeddings(session, [EmbeddingIn(ids[d], cpu.id, "static", "v1", centre[k] + rng.normal(size=8) * 0.1)
                                 for d, k in subgraphs.items()])
        add_embeddings(session, [EmbeddingIn(ids[d], gpu.id, "static", "v1", rng.normal(size=4))
                                 for d in list(subgraphs)[:3]])
        add_model(session, name=f"m{HOSTILE}", content_hash="1" * 64, subgraph_hashes=list(subgraphs)[:5],
                  source="upload")

        acquire_lock(session, "crawl", owner="crawler-1", lease_s=600)  # a lock row in the jobs table
        optimize = enqueue(session, "optimize", {"model": f"zoo:{HOSTILE}", "backend": "cpu"})
        finish(session, optimize.id, owner=None, status=JobStatus.SUCCEEDED,
               result={"report": report().to_json(), "plan": "/data/plans/job-1.tbplan"})
        failed = enqueue(session, "optimize", {"model": "broken.onnx"})
        finish(session, failed.id, owner=None, status=JobStatus.FAILED,
               error=f"Traceback ...\nModelError: {HOSTILE} is not an ONNX file")
        crawl = enqueue(session, "crawl", {"models": ["lm_head-h64-v256-t32"], "backend": "cpu"})
        finish(session, crawl.id, owner=None, status=JobStatus.SUCCEEDED,
               result={"models": ["lm_head-h64-v256-t32"], "subgraphs": 9, "tuned": 7, "skipped": 2,
                       "measured": 28, "device": "cpu:test"})
        queued = enqueue(session, "optimize", {"model": "zoo:queued_model"})
        job_ids = (optimize.id, failed.id, crawl.id, queued.id)
    return Seeded(database, *job_ids, subgraphs=subgraphs, best=best)


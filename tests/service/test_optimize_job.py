"""The optimize job kind, run by the embedded executor over the jobs table: a report and a plan file that runs."""

from pathlib import Path

import torch

from db.migrate import upgrade
from db.repositories import jobs
from db.session import Database
from embed import zoo
from service.jobs import Executor, JobContext, submit
from service.weights import decode_weights
from transforms.plan import read_plan
from transforms.plan_runtime import PlanModule

MODEL = "lm_head-h64-v256-t32"


def test_an_optimize_job_stores_its_report_and_a_plan_that_computes_what_the_model_computes(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'tb.db'}")
    upgrade(database.engine)
    try:
        job_id = submit(database, "optimize", {"model": f"zoo:{MODEL}", "backend": "cpu", "k": 1})
        Executor(JobContext(database, tmp_path, tmp_path / "index"), kinds=["optimize"], lease_s=60).run_until_idle()
        with database.scope() as session:
            job = jobs.get_job(session, job_id)
            status, result, error = job.status, job.result, job.error
    finally:
        database.dispose()
    assert status == "succeeded", error
    assert result["report"]["model"] == f"zoo:{MODEL}" and result["report"]["measured"] > 0
    plan, weights = read_plan(result["plan"])
    assert weights is not None
    module = PlanModule(plan, decode_weights(weights, "plan"), cache_dir=tmp_path / "kernels")
    torch.manual_seed(0)  # the zoo model's weights, as the job drew them
    reference, inputs = zoo.build(MODEL, device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(module(*inputs), reference(*inputs), rtol=1e-4, atol=1e-5)

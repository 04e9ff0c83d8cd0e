"""``POST /v1/optimize``: uploads checked before a job exists (size, format, limits: 400/413/422 with a message, never
a 500), one job per owner, model bytes, device class and toolchain, and the plan route before the plan exists."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from sqlalchemy import func, select

from db.models import Job
from embed import zoo
from tests.service.http.conftest import Api

IR = zoo.load("lm_head-h64-v256-t32").to_json().encode()


def _onnx(shape: list[int | str] | None = None) -> bytes:
    shape = shape or [4, 8]
    weight = numpy_helper.from_array(np.ones((8, 8), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _jobs(api: Api) -> int:
    with api.database.scope() as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


def _error(response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"} and body["detail"]
    return body["detail"]


def test_the_same_model_for_the_same_device_is_one_job_per_key(api: Api) -> None:
    alice, bob = api.key("optimize", "read"), api.key("optimize", "read")
    first = api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, headers=alice)
    assert first.status_code == 202 and first.json()["created"] is True
    job_id = first.json()["job_id"]
    assert first.headers["location"] == f"/v1/jobs/{job_id}"
    again = api.client.post("/v1/optimize", files={"model": ("renamed.json", IR)}, data={"k": "2"}, headers=alice)
    assert again.status_code == 200 and again.json() == {**first.json(), "created": False}
    other = api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, headers=bob)
    assert other.status_code == 202 and other.json()["job_id"] != job_id  # bob cannot see alice's job
    onnx = api.client.post("/v1/optimize", files={"model": ("tiny.onnx", _onnx())}, headers=alice)
    assert onnx.status_code == 202 and onnx.json()["job_id"] not in (job_id, other.json()["job_id"])
    assert _jobs(api) == 3
    job = api.client.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert (job["status"], job["model"], job["report"], job["plan_url"]) == ("queued", "lm.json", None, None)
    detail = _error(api.client.get(f"/v1/jobs/{job_id}/plan", headers=alice), 409)
    assert "queued" in detail


def test_a_failed_job_is_not_reused(api: Api) -> None:
    headers = api.key("optimize")
    job_id = api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, headers=headers).json()["job_id"]
    with api.database.scope() as session:
        session.get(Job, job_id).status = "failed"
    again = api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, headers=headers)
    assert again.status_code == 202 and again.json()["job_id"] != job_id


def test_an_upload_over_the_limit_is_413_before_a_job_exists(make_api) -> None:
    api = make_api(max_model_bytes=len(IR) - 1)
    headers = api.key("optimize")
    detail = _error(api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, headers=headers), 413)
    assert "TUNEBANK_MAX_MODEL_BYTES" in detail

    def chunks():  # no Content-Length: the limit applies to the bytes as they arrive
        yield b"--x\r\nContent-Disposition: form-data; name=\"model\"; filename=\"m.json\"\r\n\r\n"
        for _ in range(64):
            yield b"{" * 65536

    response = api.client.post("/v1/optimize", content=chunks(),
                               headers={**headers, "Content-Type": "multipart/form-data; boundary=x"})
    assert "the request body is" in _error(response, 413)  # refused as it arrived, before it was parsed
    assert _jobs(api) == 0


def test_a_json_body_over_the_request_limit_is_413(make_api) -> None:
    api = make_api(max_request_bytes=1000)
    body = {"measurements": [{"subgraph": "0" * 64, "recipe": "x" * 900, "device": "d", "toolchain": "t",
                              "median_s": 1.0}]}
    headers = api.key("ingest")
    _error(api.client.post("/v1/measurements", json=body, headers=headers), 413)
    declared = api.client.post("/v1/measurements", content=b"{}", headers={  # refused on its word, before reading
        **headers, "Content-Type": "application/json", "Content-Length": "123456789"})
    assert "123456789 bytes" in _error(declared, 413)


def test_a_model_with_more_nodes_than_allowed_is_413(make_api) -> None:
    api = make_api(max_nodes=1)
    detail = _error(api.client.post("/v1/optimize", files={"model": ("t.onnx", _onnx())},
                                    headers=api.key("optimize")), 413)
    assert "TUNEBANK_MAX_NODES" in detail


@pytest.mark.parametrize(("name", "data", "statuses"), [
    ("garbage.onnx", b"\x08\x07not a protobuf at all\xff\xfe", {400}),
    ("truncated.onnx", _onnx()[:40], {400}),
    ("broken.json", b'{"name": "x", "tensors": ', {400, 422}),
    ("wrong.json", b'{"nodes": [1, 2, 3]}', {422}),
    ("nested.json", b"[" * 100_000 + b"]" * 100_000, {400, 422}),
    ("dynamic.onnx", _onnx(["N", 8]), {400, 422}),
    ("empty.onnx", b"", {400}),
])
def test_a_malformed_model_is_refused_with_a_message_never_a_500(api: Api, name: str, data: bytes,
                                                                  statuses: set[int]) -> None:
    response = api.client.post("/v1/optimize", files={"model": (name, data)}, headers=api.key("optimize"))
    assert response.status_code in statuses, response.text
    assert set(response.json()) == {"error", "detail"} and response.json()["detail"]
    assert _jobs(api) == 0


def test_bad_form_fields_are_422(api: Api) -> None:
    headers = api.key("optimize")
    _error(api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, data={"k": "0"}, headers=headers), 422)
    _error(api.client.post("/v1/optimize", data={"k": "3"}, headers=headers), 422)
    detail = _error(api.client.post("/v1/optimize", files={"model": ("lm.json", IR)},
                                    data={"device_class": "cuda:sm_90"}, headers=headers), 422)
    assert "cuda:sm_90" in detail
    _error(api.client.post("/v1/optimize", files={"model": ("m", IR)}, data={"format": "pickle"}, headers=headers),
           422)
    assert _jobs(api) == 0


class _Broker:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list[int], str]] = []

    def send_task(self, name: str, args: list[int], queue: str) -> None:
        self.sent.append((name, args, queue))


def test_with_celery_a_job_goes_to_the_queue_of_its_device_class(make_api) -> None:
    api = make_api(executor="celery", default_queue="cuda-h200")
    broker = api.client.app.state.tunebank.celery = _Broker()
    headers = api.key("optimize")
    first = api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, headers=headers).json()["job_id"]
    other = api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, data={"device_class": "cuda-h100"},
                            headers=headers).json()["job_id"]
    again = api.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, data={"device_class": "cuda-h100"},
                            headers=headers)
    assert again.status_code == 200 and again.json()["job_id"] == other
    assert [(args, queue) for _, args, queue in broker.sent] == [([first], "cuda-h200"), ([other], "cuda-h100")]
    with api.database.scope() as session:
        assert session.get(Job, other).params["_queue"] == "cuda-h100"  # the embedded executor leaves it alone
    no_queue = make_api(executor="celery")
    detail = _error(no_queue.client.post("/v1/optimize", files={"model": ("lm.json", IR)}, headers=headers), 422)
    assert "device_class" in detail


def test_two_identical_submissions_at_once_make_one_job(api: Api) -> None:
    from concurrent.futures import ThreadPoolExecutor

    headers = api.key("optimize")
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: api.client.post("/v1/optimize", files={"model": ("lm.json", IR)},
                                                          headers=headers), range(4)))
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 202]
    assert len({a.json()["job_id"] for a in answers}) == 1 and _jobs(api) == 1

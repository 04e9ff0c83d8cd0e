"""``POST /v1/optimize``: a model (multipart: ONNX file or IR document) in, a job id out."""

from typing import Annotated

from fastapi import APIRouter, File, Form, Response, UploadFile

from service.http.auth import OptimizeKey
from service.http.state import StateDep
from service.http.submit import submit_optimize
from service.http.uploads import accept_model

router = APIRouter(prefix="/v1", tags=["optimize"])


@router.post("/optimize", status_code=202, operation_id="optimize",
             responses={200: {"description": "the same model, device and toolchain was sent before: its job"},
                        202: {"description": "a new job was queued"}})
def optimize(
    response: Response, principal: OptimizeKey, state: StateDep,
    model: Annotated[UploadFile, File(description="an ONNX model (.onnx) or a tunebank IR document (.json)")],
    format: Annotated[str | None, Form(description="'onnx' or 'ir' (default: from the file name or content)")] = None,
    device_class: Annotated[str | None, Form(description="device class to tune for (default: the server's)")] = None,
    k: Annotated[int, Form(ge=1, le=64, description="neighbours whose recipes are tried per subgraph")] = 5,
    margin: Annotated[float, Form(ge=0.0, le=10.0, description="how much faster than eager a kernel must be")] = 0.05,
) -> dict:
    """Queue an optimize job for the model; the same model bytes for the same device class and toolchain return
    the job already made (200) instead of tuning again. Poll ``GET /v1/jobs/{id}``."""
    upload = accept_model(model.file.read(), model.filename or "", format, state.config)
    done = submit_optimize(state, principal, upload, device_class=device_class, options={"k": k, "margin": margin},
                           filename=model.filename or upload.path.name)
    if not done.created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{done.job_id}"
    return {"job_id": done.job_id, "created": done.created, "job_url": f"/v1/jobs/{done.job_id}"}

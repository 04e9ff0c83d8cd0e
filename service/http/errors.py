"""Errors at the HTTP edge: one small hierarchy, mapped to a status and ``{"error": ..., "detail": ...}`` in one place.

``error`` is a short fixed phrase a client can switch on; ``detail`` says what was wrong and how to fix it.
"""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from db.errors import DbError, InvalidRecordError, NotFoundError, SchemaOutOfDateError

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error a client caused (4xx) or the service cannot help now (503); ``status`` and ``error`` by class."""

    status = 500
    error = "internal error"

    def __init__(self, detail: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail, self.headers = detail, headers


class BadRequest(ApiError):
    status, error = 400, "bad request"


class Unauthorized(ApiError):
    status, error = 401, "unauthorized"

    def __init__(self, detail: str, *, challenge: str = "Bearer") -> None:
        super().__init__(detail, headers={"WWW-Authenticate": challenge})


class Forbidden(ApiError):
    status, error = 403, "forbidden"


class NotFound(ApiError):
    status, error = 404, "not found"


class Conflict(ApiError):
    status, error = 409, "conflict"


class PayloadTooLarge(ApiError):
    status, error = 413, "payload too large"


class Unprocessable(ApiError):
    status, error = 422, "unprocessable"


class RateLimited(ApiError):
    status, error = 429, "rate limited"

    def __init__(self, detail: str, retry_after_s: float) -> None:
        super().__init__(detail, headers={"Retry-After": str(max(1, round(retry_after_s)))})


class Unavailable(ApiError):
    status, error = 503, "unavailable"


class TimedOut(ApiError):
    status, error = 504, "timed out"


def error_response(status: int, error: str, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def _validation_detail(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts) or "the request does not match the schema (see /docs)"


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves the app as ``{"error", "detail"}``; an unexpected one is logged and is a plain 500."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.error, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid request", _validation_detail(exc))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        error = {404: "not found", 405: "method not allowed"}.get(exc.status_code, "bad request")
        return error_response(exc.status_code, error, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(NotFoundError)
    async def _missing(_: Request, exc: NotFoundError) -> JSONResponse:
        return error_response(404, "not found", str(exc))

    @app.exception_handler(InvalidRecordError)
    async def _record(_: Request, exc: InvalidRecordError) -> JSONResponse:
        return error_response(422, "unprocessable", str(exc))

    @app.exception_handler(SchemaOutOfDateError)
    async def _schema(_: Request, exc: SchemaOutOfDateError) -> JSONResponse:
        return error_response(503, "unavailable", str(exc))

    @app.exception_handler(DbError)
    async def _db(_: Request, exc: DbError) -> JSONResponse:
        return error_response(503, "unavailable", str(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, "internal error", f"{type(exc).__name__}; the server log has the details")

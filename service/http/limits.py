"""Request limits, as ASGI middleware: a body larger than allowed is refused with 413 as soon as its size is known
(a Content-Length over the limit before a byte is read, a longer body when it reaches the limit), and a request that
takes longer than ``timeout_s`` ends with 504."""

import asyncio
from collections.abc import Callable
from typing import Any

from service.http.errors import PayloadTooLarge, TimedOut, error_response

Scope = dict[str, Any]
ASGIApp = Callable[..., Any]


class BodyLimit:
    """``limit_for(path) -> bytes``: the largest body accepted on ``path``."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app, self.limit_for = app, limit_for

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await error_response(413, PayloadTooLarge.error, _too_large(int(length), limit))(scope, receive, send)
            return
        seen, refused = 0, False

        async def limited() -> dict[str, Any]:  # past the limit: answer 413, and the app sees the client leave
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    refused = True
                    await error_response(413, PayloadTooLarge.error, _too_large(seen, limit))(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: dict[str, Any]) -> None:
            if not refused:
                await send(message)

        await self.app(scope, limited, guarded)


def _too_large(size: int, limit: int) -> str:
    return (f"the request body is {size} bytes or more, over the limit of {limit} bytes "
            "(TUNEBANK_MAX_MODEL_BYTES for models, TUNEBANK_MAX_REQUEST_BYTES for other requests)")


class Timeout:
    """Ends a request whose response has not started within ``timeout_s`` with 504 (work already handed to a thread
    finishes on its own); a response that started (a plan download) is left to finish."""

    def __init__(self, app: ASGIApp, timeout_s: float) -> None:
        self.app, self.timeout_s = app, timeout_s

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or self.timeout_s <= 0:
            await self.app(scope, receive, send)
            return
        started = asyncio.Event()

        async def tracking(message: dict[str, Any]) -> None:
            started.set()
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, tracking))
        waiter = asyncio.ensure_future(started.wait())
        await asyncio.wait({task, waiter}, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not task.done() and not started.is_set():
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, so never logged as lost
            detail = f"the request took longer than {self.timeout_s:g} s (TUNEBANK_REQUEST_TIMEOUT_S)"
            await error_response(504, TimedOut.error, detail)(scope, receive, send)
            return
        await task

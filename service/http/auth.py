"""API keys at the edge: ``Authorization: Bearer <secret>``, the secret's SHA-256 compared in constant time with the
stored one, scopes per route, revocation effective on the next request (keys are read on every request), and a
rate limit per key.

``admin`` holds every scope. With ``open_access`` (a server bound to loopback) and no live key in the database, a
request without a key acts as the local user (every scope; it owns the jobs submitted without a key)."""

import datetime as dt
import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import exists, select

from db.models import ApiKey
from db.repositories.api_keys import hash_secret
from service.http.config import SCOPES
from service.http.errors import Forbidden, RateLimited, Unauthorized
from service.http.state import AppState, get_state

LAST_USED_EVERY_S = 60.0  # last_used_at is written at most this often per key (a write per request would not scale)


@dataclass(frozen=True)
class Principal:
    """Who sends a request: an API key (``key_id``), or the local user of an open server (``key_id`` None)."""

    key_id: int | None
    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


LOCAL = Principal(None, "local", frozenset(SCOPES))
HOW_TO = "send 'Authorization: Bearer <key>'; an admin creates keys with `tunebank keys create`"


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, secret = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized(f"malformed Authorization header; {HOW_TO}")
    return secret.strip()


def authenticate(state: AppState, header: str | None) -> Principal:
    """The principal of a request's Authorization header; ``Unauthorized`` for a missing, unknown or revoked key."""
    secret = _bearer(header)
    with state.database.scope() as session:
        if secret is None:
            if state.config.open_access and not session.scalar(select(exists().where(ApiKey.revoked.is_(False)))):
                return LOCAL
            raise Unauthorized(f"this request needs an API key; {HOW_TO}")
        local = state.config.local_token
        if local is not None and hmac.compare_digest(secret.encode(), local.encode()):
            return LOCAL
        digest = hash_secret(secret)
        key = session.scalar(select(ApiKey).where(ApiKey.secret_hash == digest))
        if key is None or not hmac.compare_digest(key.secret_hash.encode(), digest.encode()):
            raise Unauthorized(f"unknown API key; {HOW_TO}")
        if key.revoked:
            raise Unauthorized(f"API key {key.id} ({key.name}) was revoked; ask an admin for a new one")
        now = dt.datetime.now(dt.UTC)
        if state.last_used.get(key.id, 0.0) + LAST_USED_EVERY_S < now.timestamp():
            state.last_used[key.id] = now.timestamp()
            key.last_used_at = now
        return Principal(key.id, key.name, frozenset(str(s) for s in key.scopes))


def require(scope: str) -> object:
    """A dependency: the request's principal, when it holds ``scope`` and is within its rate limit."""
    assert scope in SCOPES, scope

    def dependency(request: Request, state: Annotated[AppState, Depends(get_state)]) -> Principal:
        principal = authenticate(state, request.headers.get("authorization"))
        if not principal.allows(scope):
            raise Forbidden(f"API key {principal.key_id} ({principal.name}) lacks scope {scope!r} "
                            f"(it has {', '.join(sorted(principal.scopes)) or 'none'})")
        if principal.key_id is not None:
            wait = state.limiter.take(principal.key_id)
            if wait > 0:
                raise RateLimited(f"API key {principal.key_id} is over its limit of "
                                  f"{state.config.rate_limit_per_minute} requests a minute; retry in {wait:.1f} s",
                                  wait)
        request.state.principal = principal
        return principal

    return Depends(dependency)


ReadKey = Annotated[Principal, require("read")]
OptimizeKey = Annotated[Principal, require("optimize")]
IngestKey = Annotated[Principal, require("ingest")]
AdminKey = Annotated[Principal, require("admin")]

"""API keys at the edge: ``Authorization: Bearer <secret>``, the secret's SHA-256 compared in constant time with the
stored one, scopes per route, revocation effective on the next request (keys are read on every request), and a
rate limit per key.

Pages a person opens in a browser (the dashboard: ``require(scope, browser=True)``) also take HTTP Basic credentials
with the API key as the password (any user name), and answer 401 with ``WWW-Authenticate: Basic realm="tunebank"`` so
the browser asks for them. The key is then checked exactly as a Bearer key is, on every request. ``/v1`` takes Bearer
only.

``admin`` holds every scope. With ``open_access`` (a server bound to loopback) and no live key in the database, a
request without a key acts as the local user (every scope; it owns the jobs submitted without a key)."""

import base64
import binascii
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
BROWSER_HOW_TO = ("sign in with any user name and an API key as the password (or send 'Authorization: Bearer "
                  "<key>'); an admin creates keys with `tunebank keys create`")
BASIC_CHALLENGE = 'Basic realm="tunebank"'


def _refusal(detail: str, *, basic: bool, how_to: bool = True) -> Unauthorized:
    if how_to:
        detail = f"{detail}; {BROWSER_HOW_TO if basic else HOW_TO}"
    return Unauthorized(detail, challenge=BASIC_CHALLENGE if basic else "Bearer")


def _secret(header: str | None, *, basic: bool) -> str | None:
    """The API key in an Authorization header: a Bearer token, or (``basic``) the password of Basic credentials."""
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return value
    if basic and scheme.lower() == "basic":
        try:
            _user, colon, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            colon = password = ""
        if colon and password:
            return password
    raise _refusal("malformed Authorization header", basic=basic)


def authenticate(state: AppState, header: str | None, *, basic: bool = False) -> Principal:
    """The principal of a request's Authorization header; ``Unauthorized`` for a missing, unknown or revoked key.

    ``basic``: Basic credentials are taken too (the key is the password) and a refusal challenges for them."""
    secret = _secret(header, basic=basic)
    with state.database.scope() as session:
        if secret is None:
            if state.config.open_access and not session.scalar(select(exists().where(ApiKey.revoked.is_(False)))):
                return LOCAL
            raise _refusal("this request needs an API key", basic=basic)
        local = state.config.local_token
        if local is not None and hmac.compare_digest(secret.encode(), local.encode()):
            return LOCAL
        digest = hash_secret(secret)
        key = session.scalar(select(ApiKey).where(ApiKey.secret_hash == digest))
        if key is None or not hmac.compare_digest(key.secret_hash.encode(), digest.encode()):
            raise _refusal("unknown API key", basic=basic)
        if key.revoked:
            raise _refusal(f"API key {key.id} ({key.name}) was revoked; ask an admin for a new one", basic=basic,
                           how_to=False)
        now = dt.datetime.now(dt.UTC)
        if state.last_used.get(key.id, 0.0) + LAST_USED_EVERY_S < now.timestamp():
            state.last_used[key.id] = now.timestamp()
            key.last_used_at = now
        return Principal(key.id, key.name, frozenset(str(s) for s in key.scopes))


def require(scope: str, *, browser: bool = False) -> object:
    """A dependency: the request's principal, when it holds ``scope`` and is within its rate limit.

    ``browser``: a page people open in a browser, which also takes HTTP Basic credentials (see the module)."""
    assert scope in SCOPES, scope

    def dependency(request: Request, state: Annotated[AppState, Depends(get_state)]) -> Principal:
        principal = authenticate(state, request.headers.get("authorization"), basic=browser)
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

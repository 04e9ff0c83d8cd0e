"""API keys: only a SHA-256 of the secret is stored; the secret is shown once, when the key is issued."""

import hashlib
import secrets
from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import ApiKey
from db.repositories._get import get_or_raise

SECRET_PREFIX = "tb_"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def issue_api_key(session: Session, *, name: str, scopes: Collection[str]) -> tuple[ApiKey, str]:
    """A new key and its secret (the only time the secret is available)."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(name=name, secret_hash=hash_secret(secret), scopes=sorted(scopes), revoked=False)
    session.add(key)
    session.flush()
    return key, secret


def authenticate(session: Session, secret: str) -> ApiKey | None:
    """The live (not revoked) key with this secret, else ``None``."""
    query = select(ApiKey).where(ApiKey.secret_hash == hash_secret(secret), ApiKey.revoked.is_(False))
    return session.scalar(query)


def revoke_api_key(session: Session, key_id: int) -> None:
    key = get_or_raise(session, ApiKey, key_id, "API key")
    key.revoked = True
    session.flush()


def list_api_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.id)))

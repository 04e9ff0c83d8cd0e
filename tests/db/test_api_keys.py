import pytest

from db.errors import NotFoundError
from db.models import ApiKey
from db.repositories.api_keys import authenticate, hash_secret, issue_api_key, list_api_keys, revoke_api_key
from db.session import Database


def test_keys_authenticate_until_revoked_and_only_the_hash_is_stored(database: Database) -> None:
    with database.scope() as session:
        key, secret = issue_api_key(session, name="ci", scopes={"write", "read"})
        other, _ = issue_api_key(session, name="other", scopes=[])
    with database.scope() as session:
        found = authenticate(session, secret)
        assert found is not None and (found.id, found.name, found.scopes) == (key.id, "ci", ["read", "write"])
        assert authenticate(session, secret + "x") is None
        stored = session.get(ApiKey, key.id)
        assert stored is not None and stored.secret_hash == hash_secret(secret) and secret not in stored.secret_hash
        revoke_api_key(session, key.id)
    with database.scope() as session:
        assert authenticate(session, secret) is None
        assert [(k.name, k.revoked) for k in list_api_keys(session)] == [("ci", True), ("other", False)]
        with pytest.raises(NotFoundError):
            revoke_api_key(session, 999)

"""Encoder versions over the database: ``tunebank embed train`` stores a new version beside the old one, and the
old one stays in use until the new one is promoted."""

from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from db.migrate import upgrade
from db.models import Embedding
from db.session import Database
from embed.subgraph import Subgraph
from service.crawl import crawl
from service.embeddings import EncoderStore
from tests.service.conftest import DEVICE, synthetic_measurer
from tunebank.cli.embed import app


def test_embed_train_then_promote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  tiny_subgraphs: list[Subgraph]) -> None:
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(tmp_path))
    database = Database(f"sqlite:///{tmp_path / 'tunebank.db'}")
    upgrade(database.engine)
    crawl(database, tiny_subgraphs, synthetic_measurer(), backend="cpu", budget=4)
    runner = CliRunner()
    store = EncoderStore(tmp_path / "encoders")

    first = runner.invoke(app, ["train", "--device", DEVICE.name, "--encoder", "static", "--backend", "cpu",
                                "--promote"])
    assert first.exit_code == 0, first.output
    (v1,) = store.versions("static")
    assert f"static version {v1}: 4 subgraphs embedded; promoted" in first.output

    learned = runner.invoke(app, ["train", "--device", DEVICE.name, "--backend", "cpu"])
    assert learned.exit_code == 0, learned.output
    (v2,) = store.versions("learned")
    assert "not promoted (in use: none)" in learned.output and store.promoted("learned") is None
    with database.scope() as session:
        counts = dict(session.execute(select(Embedding.encoder, func.count()).group_by(Embedding.encoder)).all())
    assert counts == {"profile": 4, "static": 4, "learned": 4}
    assert runner.invoke(app, ["promote", "learned", v2]).exit_code == 0
    assert store.load("learned").version == v2

    bad = runner.invoke(app, ["train", "--device", "nope", "--backend", "cpu"])
    assert bad.exit_code == 2 and "unknown device 'nope'" in bad.output
    unknown = runner.invoke(app, ["promote", "learned", "0000"])
    assert unknown.exit_code == 2 and "no stored version '0000'" in unknown.output


def test_store_refuses_unknown_versions(tmp_path: Path) -> None:
    store = EncoderStore(tmp_path)
    with pytest.raises(LookupError, match="no promoted version of encoder 'static'"):
        store.load("static")

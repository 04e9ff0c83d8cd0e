"""Encoders: registry, fit/encode, versions that follow the fitted state, save/load round trips, and a learned
encoder that moves good transfer partners closer."""

from pathlib import Path

import numpy as np
import pytest

from embed.encoders import EncoderError, FeatureSet, TransferPairs, create, encoders, load
from embed.registry import UnknownNameError


def _features(n: int = 24, seed: int = 0) -> FeatureSet:
    rng = np.random.default_rng(seed)
    return FeatureSet(rng.normal(size=(n, 73)), rng.normal(size=(n, 30)))


def test_registry_lists_the_three_encoders() -> None:
    assert encoders.names() == ["learned", "static", "static+profiled"]
    with pytest.raises(UnknownNameError, match="choose one of: learned, static, static\\+profiled"):
        create("nope")


@pytest.mark.parametrize("name", ["static", "static+profiled"])
def test_pca_encoders_are_deterministic_and_round_trip(name: str, tmp_path: Path) -> None:
    features = _features()
    encoder = create(name).fit(features)
    vectors = encoder.encode(features)
    assert vectors.shape == (24, 16) and vectors.dtype == np.float32
    assert encoder.version == create(name).fit(features).version
    assert encoder.version != create(name).fit(_features(seed=1)).version
    again = load(encoder.save(tmp_path / "e.npz"))
    assert again.name == name and again.version == encoder.version
    np.testing.assert_array_equal(again.encode(features), vectors)


def test_static_encoder_preserves_distances_of_its_training_rows() -> None:
    features = FeatureSet(np.random.default_rng(3).normal(size=(10, 73)))
    encoder = create("static", dim=16).fit(features)  # 10 rows: rank 9 < 16, so PCA keeps all the variance
    z = (features.static - encoder.state()["mean"]) / encoder.state()["scale"]
    v = encoder.encode(features).astype(np.float64)
    np.testing.assert_allclose(np.linalg.norm(v[0] - v[1:], axis=1), np.linalg.norm(z[0] - z[1:], axis=1), rtol=1e-4)


def test_encoders_reject_what_they_cannot_use() -> None:
    with pytest.raises(EncoderError, match="not fitted"):
        create("static").encode(_features())
    with pytest.raises(EncoderError, match="needs profiled features"):
        create("static+profiled").fit(FeatureSet(np.zeros((4, 73))))
    with pytest.raises(EncoderError, match="transfer pairs"):
        create("learned").fit(_features())
    with pytest.raises(EncoderError, match="fitted on 73 features"):
        create("static").fit(_features()).encode(FeatureSet(np.zeros((2, 5))))


def test_learned_encoder_ranks_good_transfer_partners_nearer(tmp_path: Path) -> None:
    # Two hidden groups that PCA cannot see (the group is a small feature among large noisy ones): recipes transfer
    # within a group (loss 0) and not across (loss 3). Training must put same-group rows nearer.
    rng = np.random.default_rng(0)
    n = 30
    group = np.arange(n) % 2
    static = rng.normal(size=(n, 73)) * 5
    static[:, 0] = group * 0.5
    features = FeatureSet(static)
    a, b = np.array([(i, j) for i in range(n) for j in range(n) if i != j]).T
    pairs = TransferPairs(a, b, np.where(group[a] == group[b], 0.0, 3.0))

    def separation(v: np.ndarray) -> float:
        d = np.linalg.norm(v[:, None] - v[None, :], axis=2)
        same, other = group[:, None] == group[None, :], group[:, None] != group[None, :]
        np.fill_diagonal(same, False)
        return float(d[other].mean() / d[same].mean())

    static_sep = separation(create("static").fit(features).encode(features))
    learned = create("learned", seed=0).fit(features, pairs)
    assert separation(learned.encode(features)) > 1.5 * static_sep
    assert static_sep < 1.1
    again = load(learned.save(tmp_path / "l.npz"))
    np.testing.assert_array_equal(again.encode(features), learned.encode(features))
    assert again.version == learned.version == create("learned", seed=0).fit(features, pairs).version

"""The encoder interface: fit on a set of subgraphs (and, for trained encoders, measured transfer losses), then
map feature rows to embeddings. Plain NumPy in and out: encoders never see database rows.

An encoder's ``version`` is a hash of its name and fitted state, so two fits on the same data give the same
version and embeddings stored under a version always came from the same function.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

import numpy as np

from embed.arrays_file import load_arrays, save_arrays, state_digest
from embed.errors import EmbedError

FORMAT = "tunebank-encoder-1"


class EncoderError(EmbedError):
    """An encoder was used before fitting, or given features it cannot take."""


@dataclass(frozen=True)
class FeatureSet:
    """One row per subgraph: static features (n x 73) and, where measured, profiled features (n x P)."""

    static: np.ndarray
    profiled: np.ndarray | None = None

    def __post_init__(self) -> None:
        static = np.atleast_2d(np.asarray(self.static, dtype=np.float64))
        object.__setattr__(self, "static", static)
        if self.profiled is not None:
            profiled = np.atleast_2d(np.asarray(self.profiled, dtype=np.float64))
            if profiled.shape[0] != static.shape[0]:
                raise EncoderError(f"{static.shape[0]} static rows but {profiled.shape[0]} profiled rows")
            object.__setattr__(self, "profiled", profiled)

    def __len__(self) -> int:
        return int(self.static.shape[0])


@dataclass(frozen=True)
class TransferPairs:
    """Measured cross-applications over rows of a FeatureSet: ``loss[i] = log2(time of row a[i] with row b[i]'s
    best recipe / time of a[i] with its own best)`` (0 = the recipe transfers perfectly)."""

    a: np.ndarray
    b: np.ndarray
    loss: np.ndarray

    def __post_init__(self) -> None:
        for name, dtype in (("a", np.int64), ("b", np.int64), ("loss", np.float64)):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=dtype).reshape(-1))
        if not len(self.a) == len(self.b) == len(self.loss):
            raise EncoderError("transfer pairs need equally long a, b and loss")

    def __len__(self) -> int:
        return len(self.a)


class Encoder(ABC):
    """Maps feature rows to embeddings; L2 distance between embeddings is what neighbour search uses."""

    name: ClassVar[str]
    uses_profile: ClassVar[bool] = False  # reads FeatureSet.profiled
    learns: ClassVar[bool] = False  # fits on TransferPairs; takes a ``seed`` option

    @abstractmethod
    def fit(self, features: FeatureSet, pairs: TransferPairs | None = None) -> Self:
        """Fit on ``features`` (and ``pairs`` where the encoder learns from transfer losses); returns self."""

    @abstractmethod
    def encode(self, features: FeatureSet) -> np.ndarray:
        """float32 embeddings, one row per feature row."""

    _state: dict[str, np.ndarray] | None = None  # set by fit / from_state

    def state(self) -> dict[str, np.ndarray]:
        """The fitted state as named arrays (EncoderError when not fitted)."""
        if self._state is None:
            raise EncoderError(f"encoder {self.name!r} is not fitted")
        return self._state

    @classmethod
    @abstractmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> Self:
        """An encoder with this fitted state."""

    @property
    def version(self) -> str:
        return state_digest(f"{FORMAT}|{self.name}", self.state())

    def save(self, path: Path) -> Path:
        """Write the fitted state to ``path`` (.npz); returns ``path``."""
        return save_arrays(path, {"format": FORMAT, "name": self.name, "version": self.version}, self.state())

    @staticmethod
    def read(path: Path) -> tuple[str, dict[str, np.ndarray]]:
        """(encoder name, state) from a file written by ``save``."""
        try:
            header, state = load_arrays(path, FORMAT, "encoder file")
        except ValueError as e:
            raise EncoderError(str(e)) from None
        return str(header["name"]), state


def standardize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and scale of the columns of ``x`` (scale 1 for constant columns)."""
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    return mean, np.where(scale > 1e-12, scale, 1.0)

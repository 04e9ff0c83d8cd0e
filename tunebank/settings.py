"""Settings: read from ``TUNEBANK_*`` environment variables, only at entry points (CLI, app, workers)."""

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TUNEBANK_", extra="ignore")

    data_dir: Path = Field(default=Path.home() / ".tunebank", description="database, index files, kernel cache")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default: SQLite in data_dir")
    index_factory: str = Field(default="Flat", description="FAISS factory string for the vector index")
    index_metric: str = Field(default="l2", description="'l2' or 'ip' (inner product)")
    index_search_params: str = Field(default="", description="FAISS search parameters, e.g. 'efSearch=256'")
    max_model_bytes: int = Field(default=512 * 2**20, description="largest model file accepted")
    max_tensor_elements: int = Field(default=2**31, gt=0, description="most elements one tensor of a model may have")
    max_nodes: int = Field(default=20_000, gt=0, description="most nodes a model may have")
    max_problem_bytes: int = Field(default=2 * 2**30, gt=0,
                                   description="most memory one tuning problem may take (inputs, outputs, reference)")
    max_kernel_nodes: int = Field(default=256, gt=0, description="most nodes one tuned subgraph (a kernel) may fuse")

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir_given(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            raise ValueError("is empty; unset it to use ~/.tunebank, or give a folder")
        return value

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'tunebank.db'}"

    @property
    def index_dir(self) -> Path:
        """Where vector index files live: beside the SQLite file, or under data_dir for PostgreSQL."""
        return self.data_dir / "index"

    crawl_dirs: str = Field(default="", description="folders of .onnx models the crawler tunes, ':'-separated")
    job_lease_s: float = Field(default=60.0, gt=0, description="job lease: a dead worker's job is taken over after it")
    broker_url: str = Field(default="redis://127.0.0.1:6379/0", description="Celery broker of `tunebank worker`")

    @property
    def crawl_dir_list(self) -> list[str]:
        return [d for d in self.crawl_dirs.split(":") if d.strip()]

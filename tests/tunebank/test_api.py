"""The public API on the cpu backend: tunebank.compile, save and load (in a new process), the torch.compile backend,
and plan files that are truncated, tampered or foreign."""

import json
import os
import sqlite3
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import tunebank
from transforms import codegen
from transforms.plan import PlanError
from tunebank.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
FAST = {"k": 2, "repeats": 3, "model_calls": 3, "backend": "cpu"}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.norm, self.down = torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.norm(self.up(x)))) + x


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tunebank")


@pytest.fixture(scope="module")
def compiled(data_dir: Path) -> tuple[torch.nn.Module, tunebank.PlanModule, torch.Tensor]:
    torch.manual_seed(0)
    module, x = Block().eval(), torch.randn(8, 32)
    # a negative margin keeps every validated kernel, so the plan runs generated code
    fast = tunebank.compile(module, (x,), margin=-1.0, time_model=False, settings=Settings(data_dir=data_dir), **FAST)
    return module, fast, x


def test_compile_runs_generated_kernels_and_matches_eager(compiled: tuple) -> None:
    module, fast, x = compiled
    assert fast.plan.kernels > 0
    with torch.no_grad():
        torch.testing.assert_close(fast(x), module(x), rtol=1e-4, atol=1e-5)


def test_measurements_of_another_code_generator_are_measured_again(compiled: tuple, data_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    module, _, x = compiled
    settings = Settings(data_dir=data_dir)
    again = tunebank.optimize(module, (x,), time_model=False, settings=settings, **FAST)
    assert again.report.measured == 0 and "hit" in {s.source for s in again.report.subgraphs}
    monkeypatch.setattr(codegen, "CODEGEN_VERSION", codegen.CODEGEN_VERSION + 1)  # recipes now make other kernels
    bumped = tunebank.optimize(module, (x,), time_model=False, settings=settings, **FAST)
    assert bumped.report.measured > 0 and "hit" not in {s.source for s in bumped.report.subgraphs}
    assert "transfer" in {s.source for s in bumped.report.subgraphs}  # the old measurements still lend recipes


def test_a_saved_plan_loads_in_a_new_process_and_matches_eager(compiled: tuple, data_dir: Path,
                                                               tmp_path: Path) -> None:
    module, fast, x = compiled
    path = tunebank.save(fast, tmp_path / "block.tbplan")
    np.save(tmp_path / "x.npy", x.numpy())
    with torch.no_grad():
        expected = module(x).numpy()
    script = ("import sys, numpy as np, torch, tunebank; plan = tunebank.load(sys.argv[1]); "
              "out = plan(torch.from_numpy(np.load(sys.argv[2]))); np.save(sys.argv[3], out.numpy())")
    env = {**os.environ, "TUNEBANK_DATA_DIR": str(data_dir)}
    subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "x.npy"), str(tmp_path / "out.npy")],
                   check=True, cwd=ROOT, env=env, timeout=120)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-4, atol=1e-5)


def _rewrite(path: Path, edit) -> None:  # noqa: ANN001 (edit: dict -> None)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    document = json.loads(members["plan.json"])
    edit(document)
    members["plan.json"] = json.dumps(document).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _first_kernel(document: dict) -> dict:
    return next(s for s in document["steps"] if s["impl"] == "kernel")


TAMPERING = {
    "kernel source": lambda d: _first_kernel(d).update(code=_first_kernel(d)["code"].replace("{", "{ system(0);", 1)),
    "launch": lambda d: _first_kernel(d)["launches"][0].update(entry="main"),
    "recipe": lambda d: _first_kernel(d).update(recipe="fuse(none)"),
    "graph": lambda d: d["graph"]["tensors"][d["graph"]["inputs"][0]].update(shape=[8, 33]),
    "format": lambda d: d.update(version=99),
    "steps": lambda d: d["steps"].pop(),
}


@pytest.mark.parametrize("what", list(TAMPERING))
def test_a_tampered_plan_is_refused_before_anything_runs(compiled: tuple, data_dir: Path, tmp_path: Path,
                                                         what: str) -> None:
    path = tunebank.save(compiled[1], tmp_path / "p.tbplan")
    _rewrite(path, TAMPERING[what])
    with pytest.raises(PlanError):
        tunebank.load(path, settings=Settings(data_dir=data_dir))


def test_truncated_corrupt_and_foreign_plan_files_are_refused(compiled: tuple, data_dir: Path,
                                                              tmp_path: Path) -> None:
    path = tunebank.save(compiled[1], tmp_path / "p.tbplan")
    settings = Settings(data_dir=data_dir)
    data = path.read_bytes()
    (tmp_path / "cut.tbplan").write_bytes(data[: len(data) // 2])
    with pytest.raises(PlanError, match="truncated or corrupt"):
        tunebank.load(tmp_path / "cut.tbplan", settings=settings)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("kernel.so", b"\x7fELF")
    with pytest.raises(PlanError, match="unexpected member"):
        tunebank.load(path, settings=settings)
    path = tunebank.save(compiled[1], tmp_path / "q.tbplan")
    with zipfile.ZipFile(path) as archive:
        plan_json = archive.read("plan.json")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("plan.json", plan_json)
        archive.writestr("weights.safetensors", b"not safetensors")
    with pytest.raises(PlanError, match="weights are unreadable"):
        tunebank.load(path, settings=settings)
    foreign = json.loads(plan_json)
    foreign["target"]["backend"] = "cuda"
    _rewrite(path, lambda d: d.update(foreign))
    if not torch.cuda.is_available():
        with pytest.raises(PlanError, match="no GPU"):
            tunebank.load(path, params=dict(compiled[1].params), settings=settings)


def test_torch_compile_backend_is_registered_and_matches_eager(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "tunebank" in torch._dynamo.list_backends()
    monkeypatch.setenv("TUNEBANK_DATA_DIR", str(data_dir))
    torch.manual_seed(1)
    module, x = Block().eval(), torch.randn(8, 32)
    torch._dynamo.reset()
    fast = torch.compile(module, backend="tunebank", options={"margin": -1.0, "time_model": False, **FAST})
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fast(x)
        expected = module(x)
    assert not [w for w in caught if "runs in eager PyTorch" in str(w.message)], "the graph fell back to eager"
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    with sqlite3.connect(data_dir / "tunebank.db") as conn:  # the captured graph was optimized, not passed through
        assert conn.execute("SELECT count(*) FROM models WHERE name LIKE 'GraphModule%'").fetchone()[0] >= 1


def test_optimize_starts_its_worker_before_it_captures_the_model(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import tunebank.api

    events = []

    class RecordingWorker(tunebank.api.Worker):
        def warm(self, load=()):  # noqa: ANN001
            events.append(("warm", self._proc is None))
            super().warm(load)

    capture = tunebank.api.import_model
    monkeypatch.setattr(tunebank.api, "Worker", RecordingWorker)
    monkeypatch.setattr(tunebank.api, "import_model", lambda *a, **o: events.append(("capture", None)) or capture(
        *a, **o))
    tunebank.optimize(Block().eval(), (torch.randn(8, 32),), time_model=False, settings=Settings(data_dir=tmp_path),
                      **FAST)
    assert events[:2] == [("warm", True), ("capture", None)]  # the process started first, then the capture


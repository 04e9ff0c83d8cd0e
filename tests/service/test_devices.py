"""service.devices: the toolchain id stored with every measurement and baseline fits the database's columns (a longer
one is refused by PostgreSQL, while SQLite stores it silently)."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from db.models import Baseline, Measurement
from service.devices import toolchain
from tests.gpu import needs_gpu
from transforms import codegen
from transforms.compilers import cpu

ROOT = Path(__file__).resolve().parents[2]
COLUMN = min(Measurement.__table__.c.toolchain.type.length, Baseline.__table__.c.toolchain.type.length)


@pytest.fixture
def fresh_ids() -> Iterator[None]:
    cpu.toolchain_id.cache_clear()
    yield
    cpu.toolchain_id.cache_clear()


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_this_machines_toolchain_ids_fit_the_column(backend: str) -> None:
    assert 0 < len(toolchain(backend)) <= COLUMN and "\n" not in toolchain(backend)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_the_toolchain_names_the_code_generators_version(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = toolchain(backend)
    assert now.endswith(f" codegen {codegen.CODEGEN_VERSION}")
    monkeypatch.setattr(codegen, "CODEGEN_VERSION", codegen.CODEGEN_VERSION + 1)
    assert toolchain(backend) != now and toolchain(backend).rpartition(" codegen ")[0] == now.rpartition(" codegen ")[0]


def test_the_cpu_id_is_the_compilers_first_version_line_the_codegen_flags_and_the_cpu(fresh_ids: None) -> None:
    tid = cpu.toolchain_id()
    assert tid.split("|")[1] == "-O3 -march=native -fopenmp" and len(tid.split("|")) == 4
    assert "Copyright" not in tid and "model name" not in tid


def _compiler(tmp_path: Path, name: str, first_line: str) -> str:
    fake = tmp_path / name
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{first_line}' '{'legal text ' * 40}' '{'more ' * 60}'\n")
    fake.chmod(0o755)
    return str(fake)


def test_a_verbose_compiler_on_a_long_named_cpu_still_fits_stays_distinct_and_is_stable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_ids: None) -> None:
    monkeypatch.setattr(cpu, "_cpu_model", lambda: "Some Vendor(R) Processor " * 12)
    long_line = "verbosecc " + "x" * 250
    a, b = (_compiler(tmp_path, n, f"{long_line} {v}") for n, v in (("a", "1.0"), ("b", "1.1")))
    ids = [cpu.toolchain_id(a), cpu.toolchain_id(b)]
    assert all(len(t) <= COLUMN for t in ids) and ids[0] != ids[1]
    assert all(t.startswith("verbosecc xxx") for t in ids)
    cpu.toolchain_id.cache_clear()
    assert [cpu.toolchain_id(a), cpu.toolchain_id(b)] == ids  # the same compiler and CPU: the same id


def test_a_recorded_long_cpu_id_reads_as_todays_id_and_others_are_left_alone(fresh_ids: None) -> None:
    recorded = ("cc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\nThis is "
                "free software; see the source for copying conditions.  There is NO\nwarranty; not even for "
                "MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.|x86_64|model name\t: AMD EPYC")
    today = "cc (Debian 12.2.0-14+deb12u1) 12.2.0|-O3 -march=native -fopenmp|x86_64|AMD EPYC"
    assert cpu.from_recorded(recorded) == today
    assert len(cpu.from_recorded(recorded + "x" * 400)) <= COLUMN
    short = cpu.toolchain_id()
    assert cpu.from_recorded(short) == short and cpu.from_recorded("nvrtc 13.0") == "nvrtc 13.0"


def test_the_device_is_measured_once_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import service.devices

    measured = []
    monkeypatch.setattr(service.devices, "cpu_device", lambda: measured.append(1) or "the cpu")
    service.devices.detect_device.cache_clear()
    try:
        assert [service.devices.detect_device("cpu") for _ in range(3)] == ["the cpu"] * 3 and measured == [1]
        with pytest.raises(ValueError, match="unknown backend"):
            service.devices.detect_device("tpu")
    finally:
        service.devices.detect_device.cache_clear()


@needs_gpu
def test_the_gpus_peaks_are_measured_without_compiling_a_cupy_kernel(tmp_path: Path) -> None:
    # in a process of its own, on an empty CuPy kernel cache: a kernel CuPy compiled would be written there
    measure = ("from service.devices import cuda_device; import dataclasses, json; print("
               "json.dumps(dataclasses.asdict(cuda_device(repeats=2))))")
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "CUPY_CACHE_DIR": str(tmp_path / "cupy"), "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not any(p.is_file() for p in (tmp_path / "cupy").rglob("*"))
    spec = json.loads(done.stdout.strip().splitlines()[-1])
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    assert spec["name"] == f"cuda:{props['name'].decode()}" and spec["l2_bytes"] == props["l2CacheSize"]
    assert spec["compute_units"] == props["multiProcessorCount"]
    # an H100 / H200 copies at 2-5 TB/s and multiplies fp16 at 300-1000 TFLOP/s dense
    assert 1_000 < spec["bandwidth_gbps"] < 6_000 and 200_000 < spec["peak_gflops"] < 1_200_000

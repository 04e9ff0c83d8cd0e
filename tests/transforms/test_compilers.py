import ctypes
from pathlib import Path

import pytest

from transforms.compilers import cpu, cuda

ADD_ONE = "int add_one(int x) { return x + 1; }"
CUDA_ADD = """extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}"""


def test_cpu_compiles_loads_and_caches(tmp_path):
    first = cpu.compile_c(ADD_ONE, cache_dir=tmp_path)
    assert first.ok and not first.cached and first.artifact.endswith(".so")
    assert Path(first.artifact).parent == tmp_path / "cpu"
    library = cpu.load(first.artifact)
    library.add_one.restype = ctypes.c_int
    assert library.add_one(41) == 42
    again = cpu.compile_c(ADD_ONE, cache_dir=tmp_path)
    assert again.cached and again.artifact == first.artifact
    other_flags = cpu.compile_c(ADD_ONE, cache_dir=tmp_path, options=("-DVARIANT=1",))
    assert other_flags.ok and other_flags.artifact != first.artifact
    assert sorted(p.name for p in (tmp_path / "cpu").iterdir() if p.suffix != ".sha256") == sorted(
        Path(r.artifact).name for r in (first, other_flags)
    )  # no temporary files left behind


def test_cpu_compile_error_is_a_value_with_the_compiler_message(tmp_path):
    result = cpu.compile_c("int f(void) { return oops; }", cache_dir=tmp_path)
    assert not result.ok and result.error_kind == "compile" and result.artifact is None
    assert "oops" in result.error and "kernel.c" in result.error and str(tmp_path) not in result.error


def test_missing_compiler_is_a_compile_error(tmp_path):
    result = cpu.compile_c(ADD_ONE, cache_dir=tmp_path, compiler="no-such-cc")
    assert result.error_kind == "compile" and "not found" in result.error


def test_slow_compiler_times_out(tmp_path):
    fake = tmp_path / "slowcc"
    fake.write_text('#!/bin/sh\ncase "$1" in --version) echo slowcc 1.0;; *) sleep 5;; esac\n')
    fake.chmod(0o755)
    result = cpu.compile_c(ADD_ONE, cache_dir=tmp_path, compiler=str(fake), timeout_s=0.3)
    assert result.error_kind == "timeout" and "0.3 s" in result.error


def test_another_compiler_version_is_another_cache_entry(tmp_path):
    wrapper = tmp_path / "othercc"
    wrapper.write_text('#!/bin/sh\ncase "$1" in --version) echo othercc 99.1;; *) exec cc "$@";; esac\n')
    wrapper.chmod(0o755)
    ours = cpu.compile_c(ADD_ONE, cache_dir=tmp_path)
    theirs = cpu.compile_c(ADD_ONE, cache_dir=tmp_path, compiler=str(wrapper))
    assert ours.ok and theirs.ok and not theirs.cached and ours.artifact != theirs.artifact
    assert cpu.toolchain_id(str(wrapper)).startswith("othercc 99.1|")


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_cuda_compiles_to_ptx_without_a_gpu(tmp_path, compiler):
    if not cuda.available(compiler):
        pytest.skip(f"{compiler} is not installed")
    result = cuda.compile_cuda(CUDA_ADD, cache_dir=tmp_path, compiler=compiler)
    assert result.ok and result.artifact.endswith(".ptx"), result.error
    ptx = Path(result.artifact).read_text()
    assert ".entry vadd(" in ptx and ".target sm_90" in ptx
    assert cuda.compile_cuda(CUDA_ADD, cache_dir=tmp_path, compiler=compiler).cached


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_cuda_compiles_to_a_cubin_for_a_real_arch(tmp_path, compiler):
    if not cuda.available(compiler):
        pytest.skip(f"{compiler} is not installed")
    result = cuda.compile_cuda(CUDA_ADD, cache_dir=tmp_path, compiler=compiler, arch="sm_90")
    assert result.ok and result.artifact.endswith(".cubin"), result.error
    binary = Path(result.artifact).read_bytes()
    assert binary.startswith(b"\x7fELF") and b"vadd" in binary
    assert cuda.compile_cuda(CUDA_ADD, cache_dir=tmp_path, compiler=compiler, arch="compute_90").artifact.endswith(
        ".ptx")


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_cuda_compile_error_is_a_value(tmp_path, compiler):
    if not cuda.available(compiler):
        pytest.skip(f"{compiler} is not installed")
    result = cuda.compile_cuda(CUDA_ADD.replace("a[i] +", "undefined_x[i] +"), cache_dir=tmp_path, compiler=compiler)
    assert result.error_kind == "compile" and 'identifier "undefined_x" is undefined' in result.error


def test_nvrtc_and_nvcc_artifacts_do_not_share_a_cache_entry(tmp_path):
    if not (cuda.available("nvrtc") and cuda.available("nvcc")):
        pytest.skip("needs both NVRTC and nvcc")
    a = cuda.compile_cuda(CUDA_ADD, cache_dir=tmp_path, compiler="nvrtc")
    b = cuda.compile_cuda(CUDA_ADD, cache_dir=tmp_path, compiler="nvcc")
    assert a.artifact != b.artifact


def test_device_arch_is_a_cubin_target_only_for_a_gpu_nvrtc_supports(monkeypatch):
    cupy = pytest.importorskip("cupy")
    if cuda._nvrtc() is None:
        pytest.skip("NVRTC is not installed")
    for capability, expected in (("90", "sm_90"), ("999", cuda.DEFAULT_ARCH)):
        monkeypatch.setattr(cupy.cuda, "Device", lambda index, c=capability: type("Device", (), {
            "compute_capability": c})())
        cuda.device_arch.cache_clear()
        assert cuda.device_arch() == expected
    cuda.device_arch.cache_clear()


def test_a_build_of_what_another_thread_is_building_waits_for_it_and_shares_its_result(tmp_path):
    import threading
    import time

    from transforms.compilers.cache import cached_build

    building, release, produced, results = threading.Event(), threading.Event(), [], {}

    def produce(workdir: Path) -> Path:
        produced.append(threading.current_thread().name)
        building.set()
        release.wait(5)
        (workdir / "artifact.bin").write_bytes(b"built once")
        return workdir / "artifact.bin"

    def build(name: str) -> None:
        results[name] = cached_build(backend="cpu", cache_dir=tmp_path, key=("same",), suffix=".bin", produce=produce)

    first = threading.Thread(target=build, args=("first",), name="first")
    first.start()
    assert building.wait(5)
    second = threading.Thread(target=build, args=("second",), name="second")
    second.start()
    time.sleep(0.3)  # the second build asks while the first one's compile is under way
    release.set()
    first.join(5)
    second.join(5)
    assert produced == ["first"]
    assert results["first"].ok and not results["first"].cached
    assert results["second"].artifact == results["first"].artifact and results["second"].cached
    assert Path(results["first"].artifact).read_bytes() == b"built once"

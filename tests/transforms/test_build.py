import threading

import pytest

from transforms import build as build_module
from transforms.build import Source, build, build_each
from transforms.compilers import cuda
from transforms.results import BuildResult


def test_build_returns_one_result_per_source_in_order(tmp_path):
    sources = [Source(f"int f{i}(void) {{ return {i}; }}") for i in range(6)]
    sources.insert(3, Source("int broken(void) { return }"))
    results = build(sources, cache_dir=tmp_path, jobs=4)
    assert [r.ok for r in results] == [True, True, True, False, True, True, True]
    assert results[3].error_kind == "compile" and "expected" in results[3].error
    assert len({r.artifact for r in results if r.ok}) == 6


def test_build_mixes_backends(tmp_path):
    if not cuda.available():
        pytest.skip("neither NVRTC nor nvcc is installed")
    results = build([Source("void k(void) {}"), Source('extern "C" __global__ void k() {}', backend="cuda")],
                    cache_dir=tmp_path, jobs=2)
    assert [r.backend for r in results] == ["cpu", "cuda"]
    assert results[0].artifact.endswith(".so") and results[1].artifact.endswith(".ptx")


def test_an_unwritable_cache_is_a_failed_build_not_an_exception(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    [result] = build([Source("void k(void) {}")], cache_dir=blocker)
    assert result.error_kind == "compile" and "Error" in result.error


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(ValueError, match="choose one of: cpu, cuda"):
        Source("", backend="metal")


def test_build_each_gives_the_first_result_while_the_later_sources_still_compile(tmp_path, monkeypatch):
    last_may_finish = threading.Event()

    def compile_c(code, **_):
        if "last" in code:  # the last source compiles only once the caller holds the first result
            assert last_may_finish.wait(10), "the first result never came while the last source compiled"
        return BuildResult("cpu", artifact=code)

    monkeypatch.setitem(build_module.COMPILERS, "cpu", compile_c)
    results = build_each([Source("first"), Source("middle"), Source("last")], cache_dir=tmp_path, jobs=3)
    assert next(results).artifact == "first"
    last_may_finish.set()
    assert [r.artifact for r in results] == ["middle", "last"]

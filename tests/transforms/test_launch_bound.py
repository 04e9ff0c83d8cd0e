"""The launch bound: a generated cuda kernel takes at least its subgraph's flops over what the lanes of its
widest launch can do (at most 128 a block), and a candidate far over the fastest time known is not compiled or run
(error kind "slow")."""

import math

import pytest

from embed.features import static_features
from embed.profile import work
from tests.transforms.kernels import single
from transforms import tune
from transforms.codegen import Kernel
from transforms.launch_bound import LANE_FLOPS_PER_S, fewest_seconds
from transforms.recipe import parse
from transforms.run import Buffer, Launch
from transforms.space import default_recipe
from transforms.tune import evaluator, kernels, make_task, out_of_reach

ARGS = (Buffer("x", (8,), "float32"), Buffer("y", (8,), "float32", kind="output"))


def _kernel(*launches: Launch, code: str = "") -> Kernel:
    return Kernel("cuda", code, launches)


def test_the_widest_launch_sets_the_bound_and_libraries_or_tensor_cores_get_none() -> None:
    narrow = Launch("k0", ARGS, grid=(2, 1, 1), block=(64, 1, 1))  # 128 threads
    wide = Launch("k1", ARGS, grid=(4, 2, 1), block=(32, 2, 1))  # 512 threads
    flops = 512 * LANE_FLOPS_PER_S * 1e-3  # 1 ms of work for 512 lanes
    assert abs(fewest_seconds(_kernel(narrow, wide), flops) - 1e-3) < 1e-12
    assert abs(fewest_seconds(_kernel(narrow), flops) - 4e-3) < 1e-12
    assert fewest_seconds(_kernel(wide, Launch("cublas_gemm", ARGS, library="cublas_gemm")), flops) is None
    assert fewest_seconds(_kernel(wide, code='asm("mma.sync.aligned.m16n8k16 ...");'), flops) is None


def test_a_block_does_arithmetic_on_at_most_one_multiprocessors_lanes() -> None:
    flops = 128 * LANE_FLOPS_PER_S * 1e-3  # 1 ms of work for 128 lanes
    one_block = Launch("k", ARGS, grid=(1, 1, 1), block=(1024, 1, 1))  # one multiprocessor: 128 lanes
    assert abs(fewest_seconds(_kernel(one_block), flops) - 1e-3) < 1e-12
    two_blocks = Launch("k", ARGS, grid=(2, 1, 1), block=(512, 1, 1))  # 256 lanes
    assert abs(fewest_seconds(_kernel(two_blocks), flops) - 0.5e-3) < 1e-12
    many = Launch("k", ARGS, grid=(64, 1, 1), block=(64, 1, 1))  # 4096 threads, all lanes of 64 multiprocessors
    assert abs(fewest_seconds(_kernel(many), flops) - 1e-3 / 32) < 1e-12


def test_a_candidate_is_out_of_reach_only_past_four_times_the_fastest_known() -> None:
    kernel = _kernel(Launch("k", ARGS, grid=(1, 1, 1), block=(100, 1, 1)))
    flops = 100 * LANE_FLOPS_PER_S * 1e-3  # at least 1 ms
    assert out_of_reach(kernel, flops, 0.3e-3) is None  # 1 ms is within 4 x 0.3 ms
    slow = out_of_reach(kernel, flops, 0.2e-3)
    assert slow is not None and slow.error_kind == "slow" and "at least 1000 us" in slow.error


def test_a_cuda_candidate_out_of_reach_is_neither_compiled_nor_run(tmp_path) -> None:
    task = make_task(single("reduce_sum", [("x", (512, 4096), "float32")], (512,), "float32", axes=[1]))
    recipe = parse("fuse(all);reduce(thread);rows_per_block(1);threads(32);unroll(1)")
    (kernel,) = kernels(task.program, [recipe], "cuda")
    assert isinstance(kernel, Kernel)
    flops = work(static_features(task.program))[0]
    threads = max(math.prod(launch.grid) * math.prod(launch.block) for launch in kernel.launches)
    bound = flops / (LANE_FLOPS_PER_S * threads)
    (result,) = evaluator(task, backend="cuda", cache_dir=tmp_path, best_s=bound / 5)([recipe])
    assert result.error_kind == "slow" and not list(tmp_path.iterdir())  # nothing compiled into the cache


def test_the_default_recipe_runs_however_slow_its_launch(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = make_task(single("reduce_sum", [("x", (512, 4096), "float32")], (512,), "float32", axes=[1]))
    default = default_recipe(task.program, "cuda")
    (kernel,) = kernels(task.program, [default], "cuda")
    bound = fewest_seconds(kernel, work(static_features(task.program))[0])
    assert bound is not None
    compiled = []  # what the evaluator hands the compiler (which compiles nothing here)
    monkeypatch.setattr(tune, "build_each", lambda sources, **_: compiled.extend(sources) or iter(()))
    with pytest.raises(ValueError):  # no build came back for the kernel it meant to run
        evaluator(task, backend="cuda", cache_dir=tmp_path, best_s=bound / 100)([default])
    assert len(compiled) == 1

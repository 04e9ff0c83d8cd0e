"""Whole-model timing: models compared are timed in turn, so a drifting machine favours none of them."""

import itertools
import math
import time

import torch

from service.model_timing import compare


def test_a_drifting_machine_favours_neither_of_two_identical_models() -> None:
    ticks = itertools.count()

    def drifting() -> None:  # each call slower than the one before, whichever model makes it
        time.sleep(2e-4 * (1 + next(ticks) / 10))

    a, b = (lambda x: drifting()), (lambda x: drifting())
    first, second = compare([a, b], [torch.ones(1)], calls=20, warmup=1)
    # timed one after the other, the second model's calls would all come later: >= 2x slower
    assert abs(first - second) / first < 0.25


def test_a_failing_model_has_no_time_and_the_others_still_do() -> None:
    def broken(x: torch.Tensor) -> None:
        raise RuntimeError("no kernel")

    good, bad = compare([lambda x: x + 1, broken], [torch.ones(4)], calls=3)
    assert good > 0 and math.isnan(bad)

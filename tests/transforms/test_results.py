import math

import pytest

from transforms.results import ERROR_KINDS, BuildResult, RunResult


def test_error_kinds_are_the_documented_six():
    assert ERROR_KINDS == ("compile", "launch", "timeout", "wrong", "nan", "slow")


def test_failure_scores_infinity_and_ok_scores_its_median():
    assert RunResult.failure("nan", "bad").score == math.inf
    assert RunResult(ok=True, median_s=2e-6, min_s=1e-6, repeats=5).score == 2e-6


def test_ok_and_error_kind_must_agree():
    with pytest.raises(ValueError, match="exactly when"):
        RunResult(ok=True, error_kind="wrong")
    with pytest.raises(ValueError, match="unknown error kind"):
        RunResult(ok=False, error_kind="oops")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly when"):
        BuildResult("cpu")  # neither an artifact nor an error


def test_json_round_trip_is_strict_json():
    import json

    for result in (RunResult.failure("timeout", "slow"), RunResult(ok=True, median_s=1.5, min_s=1.0, repeats=3)):
        text = json.dumps(result.to_json(), allow_nan=False)
        assert RunResult.from_json(json.loads(text)) == result

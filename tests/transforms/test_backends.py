import pytest
from typer.testing import CliRunner

from transforms.backends import BackendUnavailableError, gpu_available, resolve_backend
from tunebank.cli import app


def test_auto_picks_cuda_exactly_when_a_gpu_is_visible():
    assert resolve_backend("auto") == ("cuda" if gpu_available() else "cpu")
    assert resolve_backend("cpu") == "cpu"


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(ValueError, match="choose one of: auto, cpu, cuda"):
        resolve_backend("tpu")


@pytest.mark.skipif(gpu_available(), reason="checks the behaviour on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_before_any_work():
    with pytest.raises(BackendUnavailableError, match="use --backend cpu"):
        resolve_backend("cuda")
    result = CliRunner().invoke(app, ["tune", "zoo:gpt_decoder-h64-s32-b1", "--backend", "cuda"])
    assert result.exit_code == 2
    assert "needs an NVIDIA GPU" in result.output

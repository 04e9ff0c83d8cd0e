"""``needs_gpu``: marks a test as a GPU test and skips it, with a reason, where CuPy sees no GPU."""

import pytest


def _gpu_available() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except ImportError:
        return False


def needs_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not _gpu_available(), reason="needs an NVIDIA GPU with CuPy")(test))

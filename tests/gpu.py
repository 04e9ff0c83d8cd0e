"""``needs_gpu``: marks a test as a GPU test and skips it, with a reason, where CuPy sees no GPU."""

import pytest

from transforms.backends import gpu_available


def needs_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not gpu_available(), reason="needs an NVIDIA GPU with CuPy")(test))

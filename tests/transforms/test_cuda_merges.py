"""The merge helpers of the generated CUDA row kernels (``k_welford``: Chan's merge of (count, mean, M2);
``k_online``: the online softmax's (max, sum of exp)), cut from a generated kernel's source, compiled for the host
with the system C++ compiler and checked against NumPy: their arithmetic without a GPU."""

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from embed.lower import lower
from tests.transforms.kernels import single
from transforms.codegen import generate
from transforms.space import default_recipe
from transforms.transformation import apply_recipe

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
D = ctypes.c_double
P = ctypes.POINTER(ctypes.c_double)


@pytest.fixture(scope="module")
def merges(tmp_path_factory) -> ctypes.CDLL:
    program = lower(single("softmax", [("x", (4, 300), "float64")], (4, 300), "float64", axis=-1))
    code = generate(apply_recipe(default_recipe(program, "cuda"), program), "cuda").code
    helpers = re.findall(r"__device__ static inline void k_(?:online|welford)\(.*?\n\}", code, re.S)
    assert len(helpers) == 2, code[:2000]
    source = "#include <cmath>\nusing std::exp;\n" + "\n".join(h.replace("__device__ ", "") for h in helpers) + """
extern "C" void welford(double* n, double* m, double* q, double n2, double m2, double q2) { k_welford(*n, *m, *q, n2, m2, q2); }
extern "C" void online(double* m, double* s, double m2, double s2) { k_online(*m, *s, m2, s2); }
"""  # noqa: E501
    folder = tmp_path_factory.mktemp("merges")
    (folder / "merges.cc").write_text(source)
    subprocess.run(["c++", "-O1", "-shared", "-fPIC", "-o", str(folder / "merges.so"), str(folder / "merges.cc")],
                   check=True, capture_output=True)
    library = ctypes.CDLL(str(folder / "merges.so"))
    library.welford.argtypes, library.online.argtypes = [P, P, P, D, D, D], [P, P, D, D]
    return library


def chunks(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 3 + rng.uniform(-5, 5)
    cuts = np.sort(rng.choice(np.arange(1, n), size=rng.integers(1, 8), replace=False))
    return np.split(x, cuts)


@pytest.mark.parametrize("seed", range(6))
def test_welford_merges_give_the_mean_and_squared_deviations_of_the_whole_row(merges, seed: int) -> None:
    parts = chunks(seed, 200)
    n, m, q = D(0.0), D(0.0), D(0.0)
    for part in [parts[0], np.array([]), *parts[1:]]:  # an empty chunk (a lane past the row's end) changes nothing
        mean = part.mean() if part.size else 0.0
        merges.welford(ctypes.byref(n), ctypes.byref(m), ctypes.byref(q), part.size, mean, ((part - mean) ** 2).sum())
    x = np.concatenate(parts)
    assert (n.value, m.value, q.value) == pytest.approx((x.size, x.mean(), ((x - x.mean()) ** 2).sum()), rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("largest", ["first", "last", "anywhere"])
def test_online_merges_give_the_max_and_the_sum_of_exp_below_it(merges, seed: int, largest: str) -> None:
    parts = chunks(seed, 200)
    if largest != "anywhere":  # the running max changes at the first merge (rescaled sums) or never again
        at = 0 if largest == "first" else -1
        parts[at] = parts[at] + 50
    m, s = D(-np.inf), D(0.0)
    for part in parts:
        merges.online(ctypes.byref(m), ctypes.byref(s), part.max(), np.exp(part - part.max()).sum())
    x = np.concatenate(parts)
    assert (m.value, s.value) == pytest.approx((x.max(), np.exp(x - x.max()).sum()), rel=1e-12)
